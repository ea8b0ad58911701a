"""TensorRT: a serialized engine built from ONNX for one GPU architecture and toolchain.

An engine does not travel to another TensorRT version, another compute
capability or, often, another driver. Two build flags relax that: a
version-compatible engine runs on later TensorRT releases of the same major
version, and a hardware-compatible ("ampere_plus") engine on any GPU from
Ampere (sm_80) on.
"""

from workers.backends.base import (
    Backend,
    cuda_version,
    gpu_compute_capability,
    tool_version,
    version_parts,
)
from workers.errors import JobError

# build_config["hardware_compatibility"] values; None means "none" (this compute capability).
HARDWARE_LEVELS = ("none", "same_compute_capability", "ampere_plus")
AMPERE = (8, 0)
NOT_YET = "the TensorRT builder arrives with the compile-backends issue"


class TensorRTBackend(Backend):
    """NVIDIA TensorRT engines, built and run on the GPU they are for."""

    name = "tensorrt"
    runtime = "tensorrt"
    extra = "tensorrt"

    @classmethod
    def compat_fields(cls, fingerprint, build_config):
        """Return TensorRT's version, the GPU architecture, the driver and CUDA majors."""
        config = build_config or {}
        version = tool_version(fingerprint, "tensorrt")
        if config.get("version_compatible"):
            fields = {"tensorrt": version_parts(version, 1), "version_compatible": True}
        else:
            fields = {"tensorrt": version_parts(version, 3)}
        capability = gpu_compute_capability(fingerprint)
        fields |= _hardware_fields(config.get("hardware_compatibility"), capability)
        fields["driver_major"] = _major((fingerprint or {}).get("nvidia_driver"))
        fields["cuda_major"] = _major(
            cuda_version(fingerprint, "driver_api") or cuda_version(fingerprint, "runtime")
        )
        return fields

    @classmethod
    def check_config(cls, build_config):
        """Refuse an unknown hardware compatibility level."""
        level = (build_config or {}).get("hardware_compatibility")
        if level is not None and level not in HARDWARE_LEVELS:
            raise JobError(
                f"tensorrt hardware_compatibility {level!r} is not one of {list(HARDWARE_LEVELS)}"
            )

    def compile(self, source, build_config, workdir, *, timing_cache=None, progress=None):
        """Refuse for now: the builder is not written yet."""
        raise JobError(f"{NOT_YET}: this worker cannot build TensorRT engines yet")

    def load(self, artifact, build_config):
        """Refuse for now: loading engines arrives with the builder."""
        raise JobError(f"{NOT_YET}: this worker cannot load TensorRT engines yet")

    def infer(self, handle, feeds):
        """Refuse for now: inference arrives with the builder."""
        raise JobError(f"{NOT_YET}: this worker cannot run TensorRT engines yet")


def _hardware_fields(level, capability):
    """Return the GPU field of the key: the compute capability, or the architecture family.

    An "ampere_plus" engine runs on sm_80 and newer; an older GPU gets a family
    no such engine has, so its key never matches one.
    """
    if level != "ampere_plus":
        return {"compute_capability": capability}
    parsed = _capability(capability)
    if parsed is None:
        return {"arch_family": None}
    return {"arch_family": "ampere+" if parsed >= AMPERE else "pre-ampere"}


def _capability(text):
    """Return a compute capability "8.6" as (8, 6), None when unknown or malformed."""
    try:
        major, minor = str(text).split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def _major(version):
    """Return a version's major number ("550.54.15" -> 550), None when unknown."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None
