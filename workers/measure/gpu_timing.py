"""Time GPU inference without host copies, and read the GPU's state around a benchmark.

End-to-end time (numpy in, numpy out) includes the copies between host and
device; compute time binds the inputs and outputs once on the device with ONNX
Runtime's IO binding, and may replay a captured CUDA graph. NVML gives clocks,
temperature, power, throttle reasons and memory: read, never changed, so a
result says which conditions it met. pynvml (nvidia-ml-py) and torch are
imported lazily; where they are missing the fields are None.
"""

import os
import threading

from workers import fingerprint as fingerprints
from workers.backends.onnxruntime import GPU_PROVIDERS
from workers.errors import JobError

# The provider options that make ONNX Runtime capture a CUDA graph and replay it.
CUDA_GRAPH_OPTIONS = {
    "CUDAExecutionProvider": {"enable_cuda_graph": "1"},
    "TensorrtExecutionProvider": {"trt_cuda_graph_enable": "True"},
}
# NVML's clock event (throttle) reason bits, from nvml.h.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Memory is sampled this often: an inference's buffers stay allocated (ONNX Runtime's
# arena, TensorRT's context), so a slow sampler still sees the peak.
MEMORY_SAMPLE_SECONDS = 0.02
BYTES_PER_MB = 2**20
TORCH_MEMORY = (
    "torch.cuda.max_memory_allocated: tensors torch allocated during the run, weights "
    "included; not the CUDA context nor the allocator's cache"
)
PROCESS_MEMORY = (
    "NVML: this process's GPU memory, peak of samples every 20 ms (CUDA context and the "
    "runtime's memory pool included)"
)
DEVICE_MEMORY = (
    "NVML: the GPU's used memory, peak of samples every 20 ms minus its value before the "
    "model loaded (other processes' allocations meanwhile count too)"
)
NO_NVML = "unknown: NVML (nvidia-ml-py with an NVIDIA driver) could not be read"


def is_on_gpu(session, provider):
    """Return True when the session runs on an NVIDIA GPU."""
    return provider in GPU_PROVIDERS or bool(getattr(session, "on_cuda", False))


def provider_entry(provider, cuda_graphs=False):
    """Return what ONNX Runtime's providers list takes: the name, or (name, CUDA graph options)."""
    if not cuda_graphs:
        return provider
    if provider not in CUDA_GRAPH_OPTIONS:
        raise JobError(
            f"cuda_graphs needs CUDAExecutionProvider or TensorrtExecutionProvider; "
            f"this benchmark runs on {provider}"
        )
    return (provider, CUDA_GRAPH_OPTIONS[provider])


def throttle_reasons(mask):
    """Return the names of the reasons set in NVML's clock event reasons bitmask."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def nvml_target(visible=None):
    """Return how NVML finds CUDA device 0: ("index", n) or ("uuid", "GPU-...").

    CUDA numbers the GPUs that CUDA_VISIBLE_DEVICES lists; NVML sees them all.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "") if visible is None else visible
    first = visible.split(",")[0].strip()
    if first.isdigit():
        return ("index", int(first))
    if first.startswith("GPU-"):
        return ("uuid", first)
    return ("index", 0)


def device_call(session, feeds, outputs, device_id=0):
    """Bind feeds and outputs once on the GPU; return a call running the session on them.

    outputs are the session's outputs for these feeds (their shapes and dtypes are
    allocated on the device). ONNX Runtime synchronizes the GPU at the end of each
    run, so the call's wall time is the device's compute plus the launch.
    """
    import numpy as np
    import onnxruntime as ort

    binding = session.io_binding()
    values = []
    for name, array in feeds.items():
        values.append(ort.OrtValue.ortvalue_from_numpy(array, "cuda", device_id))
        binding.bind_ortvalue_input(name, values[-1])
    for meta, array in zip(session.get_outputs(), outputs, strict=True):
        values.append(
            ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), "cuda", device_id)
        )
        binding.bind_ortvalue_output(meta.name, values[-1])
    run = session.run_with_iobinding

    def call():
        run(binding)

    call.device_values = values  # the device buffers live as long as the call
    return call


class GpuWatch:
    """NVML readings of one GPU around a benchmark: its state before and after, peak memory."""

    def __init__(self, nvml, handle):
        self.nvml, self.handle = nvml, handle
        self.pid = os.getpid()
        self.baseline = self._device_used() or 0
        self.peak_process = self.peak_device = None
        self._stopped = threading.Event()
        self._thread = None

    @classmethod
    def open(cls):
        """Return a watch on CUDA device 0, or None when NVML cannot be read."""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # no pynvml, no driver, no libnvidia-ml: nothing to read
            return None
        handle = _read(pynvml, lambda: _handle(pynvml, nvml_target()))
        if handle is None:
            _read(pynvml, pynvml.nvmlShutdown)
            return None
        return cls(pynvml, handle)

    def name(self):
        """Return the GPU's name, as NVML gives it."""
        return _read(
            self.nvml, lambda: fingerprints._text(self.nvml.nvmlDeviceGetName(self.handle))
        )

    def snapshot(self):
        """Return the GPU's clocks, temperature, power, throttle reasons and used memory now."""
        nvml, handle = self.nvml, self.handle
        reasons = _read(nvml, lambda: _clock_event_reasons(nvml, handle))
        power_mw = _read(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        used = self._device_used()
        return {
            "sm_clock_mhz": _read(
                nvml, lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
            ),
            "memory_clock_mhz": _read(
                nvml, lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)
            ),
            "temperature_c": _read(
                nvml, lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            ),
            "power_w": None if power_mw is None else power_mw / 1000,
            "throttle_reasons": None if reasons is None else throttle_reasons(reasons),
            "memory_used_mb": None if used is None else used / BYTES_PER_MB,
        }

    def start_sampling(self):
        """Sample this process's (and the GPU's) used memory from a thread until stopped."""
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="gpu-memory", daemon=True)
        self._thread.start()

    def stop_sampling(self):
        """Stop sampling; return (peak device memory in MiB or None, what it measures)."""
        if self._thread is not None:
            self._stopped.set()
            self._thread.join()
        self._sample()
        if self.peak_process is not None:
            return self.peak_process / BYTES_PER_MB, PROCESS_MEMORY
        if self.peak_device is not None:
            return max(0, self.peak_device - self.baseline) / BYTES_PER_MB, DEVICE_MEMORY
        return None, NO_NVML

    def close(self):
        """Stop sampling and release NVML."""
        if self._thread is not None and not self._stopped.is_set():
            self.stop_sampling()
        _read(self.nvml, self.nvml.nvmlShutdown)

    def _loop(self):
        """Take a sample every interval until stopped."""
        while not self._stopped.wait(MEMORY_SAMPLE_SECONDS):
            self._sample()

    def _sample(self):
        """Fold the current process and device memory into the peaks."""
        mine = self._process_used()
        if mine is not None:
            self.peak_process = max(self.peak_process or 0, mine)
        used = self._device_used()
        if used is not None:
            self.peak_device = max(self.peak_device or 0, used)

    def _process_used(self):
        """Return this process's GPU memory in bytes, or None when NVML does not say.

        In a container NVML lists host process ids, so this process may not be found.
        """
        processes = _read(
            self.nvml, lambda: self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        )
        for process in processes or ():
            if process.pid == self.pid and process.usedGpuMemory is not None:
                return process.usedGpuMemory
        return None

    def _device_used(self):
        """Return the GPU's used memory in bytes, or None."""
        memory = _read(self.nvml, lambda: self.nvml.nvmlDeviceGetMemoryInfo(self.handle))
        return None if memory is None else memory.used


class TorchPeakMemory:
    """torch's own count of the CUDA memory its tensors took, from now on."""

    def __init__(self):
        import torch

        self.cuda = torch.cuda
        self.cuda.reset_peak_memory_stats()

    def peak_mb(self):
        """Return the most memory torch's tensors held at once since the start, in MiB."""
        return self.cuda.max_memory_allocated() / BYTES_PER_MB


class GpuMonitor:
    """The GPU side of one benchmark, opened before the model loads (NVML's memory baseline).

    begin() decides, once the session exists, whether it runs on the GPU; if it
    does, the state before is read and memory sampled until result().
    """

    def __init__(self):
        self.watch = GpuWatch.open()
        self.torch = None
        self.before = None
        self.active = False

    def begin(self, session, provider):
        """Start watching when the session runs on the GPU; return whether it does."""
        self.active = is_on_gpu(session, provider)
        if not self.active:
            self.close()
            return False
        if provider == "torch-aoti":  # torch's allocator holds everything such an engine uses
            self.torch = TorchPeakMemory()
        if self.watch is not None:
            self.before = self.watch.snapshot()
            self.watch.start_sampling()
        return True

    def result(self, e2e_ms, compute_ms, cuda_graphs):
        """Stop watching; return the protocol's gpu section."""
        memory = (None, NO_NVML)
        after, device = None, "cuda:0"
        if self.watch is not None:
            memory = self.watch.stop_sampling()
            after, device = self.watch.snapshot(), self.watch.name() or device
        if self.torch is not None:
            memory = (self.torch.peak_mb(), TORCH_MEMORY)
        self.close()
        return {
            "device": device,
            "e2e_ms": e2e_ms,
            "compute_ms": compute_ms,
            "cuda_graphs": cuda_graphs,
            "peak_device_memory_mb": memory[0],
            "memory_source": memory[1],
            "nvml_before": self.before,
            "nvml_after": after,
        }

    def close(self):
        """Release NVML (again is harmless)."""
        if self.watch is not None:
            self.watch.close()
            self.watch = None


def _handle(nvml, target):
    """Return NVML's handle of the GPU named by nvml_target()."""
    kind, value = target
    if kind == "uuid":
        return nvml.nvmlDeviceGetHandleByUUID(value)
    return nvml.nvmlDeviceGetHandleByIndex(value)


def _clock_event_reasons(nvml, handle):
    """Return the clock event reasons bitmask (its older name: throttle reasons)."""
    read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    read = read or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return read(handle)


def _read(nvml, read):
    """Return read(), or None when NVML refuses (old driver, unsupported query)."""
    return fingerprints._nvml_read(nvml, read)
