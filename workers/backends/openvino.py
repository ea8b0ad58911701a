"""OpenVINO: an ONNX model converted to OpenVINO IR, optionally exported compiled for a device.

The IR runs on any machine with the same OpenVINO version and device plugin.
An exported compiled blob ("export_blob") is tied to the CPU it was compiled
on as well: its kernels follow the CPU's ISA level, and a bf16 inference
precision hint only takes effect where the CPU has bf16 instructions (AMX or
AVX512-BF16).
"""

from workers.backends.base import Backend, cpu_flags, cpu_isa, tool_version
from workers.errors import JobError

DEFAULT_DEVICE = "CPU"
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
NOT_YET = "the OpenVINO compiler arrives with the compile-backends issue"


class OpenVinoBackend(Backend):
    """Intel OpenVINO, compiled for one device plugin (CPU, GPU, NPU)."""

    name = "openvino"
    runtime = "openvino"
    extra = "openvino"

    @classmethod
    def compat_fields(cls, fingerprint, build_config):
        """Return OpenVINO's version, the device plugin and, for a compiled blob, the CPU."""
        config = build_config or {}
        fields = {
            "openvino": tool_version(fingerprint, "openvino"),
            "device": config.get("device") or DEFAULT_DEVICE,
        }
        if config.get("export_blob"):
            fields["cpu_isa"] = cpu_isa(fingerprint)
            fields["bf16_hardware"] = _has_bf16(cpu_flags(fingerprint))
        return fields

    def compile(self, source, build_config, workdir, *, timing_cache=None, progress=None):
        """Refuse for now: the compiler is not written yet."""
        raise JobError(f"{NOT_YET}: this worker cannot build OpenVINO models yet")

    def load(self, artifact, build_config):
        """Refuse for now: loading arrives with the compiler."""
        raise JobError(f"{NOT_YET}: this worker cannot load OpenVINO models yet")

    def infer(self, handle, feeds):
        """Refuse for now: inference arrives with the compiler."""
        raise JobError(f"{NOT_YET}: this worker cannot run OpenVINO models yet")


def _has_bf16(flags):
    """Return True when the CPU flags include bf16 instructions, None when flags are unknown."""
    if flags is None:
        return None
    return any(flag in flags for flag in BF16_FLAGS)
