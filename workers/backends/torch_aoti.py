"""PyTorch AOTInductor: a compiled package from a torch.export program, for GPUs.

The package holds kernels generated for one GPU architecture, linked against
one torch and one CUDA runtime: all three are in its key.
"""

from workers.backends.base import Backend, cuda_version, gpu_compute_capability, tool_version
from workers.errors import JobError

NOT_YET = "AOTInductor packaging arrives with the compile-backends issue"


class TorchAotiBackend(Backend):
    """AOTInductor packages (torch._inductor.aoti_compile_and_package)."""

    name = "torch-aoti"
    runtime = "torch"
    extra = "torch"

    @classmethod
    def compat_fields(cls, fingerprint, build_config):
        """Return torch's version, its CUDA runtime and the GPU's compute capability."""
        torch = (fingerprint or {}).get("torch")
        cuda = torch.get("cuda") if isinstance(torch, dict) else None
        return {
            "torch": tool_version(fingerprint, "torch"),
            "cuda": cuda or cuda_version(fingerprint, "runtime"),
            "compute_capability": gpu_compute_capability(fingerprint),
        }

    def compile(self, source, build_config, workdir, *, timing_cache=None, progress=None):
        """Refuse for now: packaging is not written yet."""
        raise JobError(f"{NOT_YET}: this worker cannot build AOTInductor packages yet")

    def load(self, artifact, build_config):
        """Refuse for now: loading arrives with packaging."""
        raise JobError(f"{NOT_YET}: this worker cannot load AOTInductor packages yet")

    def infer(self, handle, feeds):
        """Refuse for now: inference arrives with packaging."""
        raise JobError(f"{NOT_YET}: this worker cannot run AOTInductor packages yet")
