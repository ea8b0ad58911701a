"""The GPU side of the benchmark: NVML readings, device memory, compute time apart from copies.

This machine has no GPU: NVML is replaced by a test double where named so, and the
tests that need CUDA skip, saying why, unless ONNX Runtime offers CUDAExecutionProvider.
"""

import os
import sys
import time
import types

import onnxruntime as ort
import pytest

from tests.benchmark_models import InputMeta, matmul_relu
from workers.errors import JobError
from workers.measure import gpu_timing
from workers.measure.benchmark import benchmark_onnxruntime, benchmark_session

FEW = {"warmup_iterations": 2, "iterations": 20}
MB = 2**20
NO_CUDA = "CUDAExecutionProvider" not in ort.get_available_providers()


class NVMLError(Exception):
    """The fake NVML's refusal, like pynvml.NVMLError."""


def fake_nvml_test_double(list_this_process=True, refuse=()):
    """Return a module standing in for pynvml: one GPU, whose used memory grows as it is read."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError, nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM, nvml.NVML_TEMPERATURE_GPU = (
        NVMLError,
        1,
        2,
        0,
    )
    nvml.reads, nvml.shutdowns = [], []
    readings = {
        "nvmlDeviceGetName": lambda handle: b"NVIDIA Test GPU",
        "nvmlDeviceGetClockInfo": lambda handle, clock: {1: 1980, 2: 2619}[clock],
        "nvmlDeviceGetTemperature": lambda handle, sensor: 41,
        "nvmlDeviceGetPowerUsage": lambda handle: 123_456,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda handle: 0x4 | 0x20,
        "nvmlDeviceGetMemoryInfo": lambda handle: types.SimpleNamespace(
            used=(1000 + 10 * len(nvml.reads)) * MB
        ),
        "nvmlDeviceGetComputeRunningProcesses": lambda handle: [
            types.SimpleNamespace(
                pid=os.getpid() if list_this_process else 1, usedGpuMemory=700 * MB
            )
        ],
    }
    for name, read in readings.items():
        setattr(nvml, name, _recorded(nvml, name, read, name in refuse))
    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: nvml.shutdowns.append(1)
    nvml.nvmlDeviceGetHandleByIndex = lambda index: f"gpu{index}"
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: uuid
    return nvml


def _recorded(nvml, name, read, refused):
    def call(*args):
        nvml.reads.append(name)
        if refused:
            raise NVMLError(name)
        return read(*args)

    return call


class CudaEngineTestDouble:
    """A test double of another backend's engine on the GPU (the runner's LoadedEngine)."""

    on_cuda = True
    backend = types.SimpleNamespace(name="tensorrt")

    def run(self, _output_names, feeds):
        time.sleep(0.0005)
        return [feeds["x"]]

    def get_inputs(self):
        return [InputMeta("x", ["N", 4], "tensor(float)")]

    def get_providers(self):
        return ["tensorrt"]


@pytest.fixture
def nvml(monkeypatch):
    fake = fake_nvml_test_double()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_it_names_the_throttle_reasons_nvml_sets():
    assert gpu_timing.throttle_reasons(0) == []
    assert gpu_timing.throttle_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]


@pytest.mark.parametrize(
    "visible, target",
    [
        ("", ("index", 0)),
        ("3,1", ("index", 3)),
        ("GPU-8f2e, GPU-11aa", ("uuid", "GPU-8f2e")),
        ("MIG-4d1c", ("index", 0)),
    ],
)
def test_it_finds_cuda_device_zero_among_nvmls_gpus(visible, target):
    assert gpu_timing.nvml_target(visible) == target


def test_it_turns_cuda_graphs_on_with_each_gpu_providers_own_option():
    assert gpu_timing.provider_entry("CPUExecutionProvider") == "CPUExecutionProvider"
    assert gpu_timing.provider_entry("CUDAExecutionProvider", cuda_graphs=True) == (
        "CUDAExecutionProvider",
        {"enable_cuda_graph": "1"},
    )
    assert gpu_timing.provider_entry("TensorrtExecutionProvider", cuda_graphs=True) == (
        "TensorrtExecutionProvider",
        {"trt_cuda_graph_enable": "True"},
    )
    with pytest.raises(JobError, match="runs on CPUExecutionProvider"):
        gpu_timing.provider_entry("CPUExecutionProvider", cuda_graphs=True)


def test_it_reads_the_gpu_state_from_a_fake_nvml_test_double(nvml):
    watch = gpu_timing.GpuWatch.open()

    state = watch.snapshot()
    watch.close()

    assert watch.name() == "NVIDIA Test GPU"
    assert state["sm_clock_mhz"] == 1980 and state["memory_clock_mhz"] == 2619
    assert state["temperature_c"] == 41 and state["power_w"] == pytest.approx(123.456)
    assert state["throttle_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]
    assert state["memory_used_mb"] > 1000
    assert nvml.shutdowns == [1]


def test_it_reports_none_for_what_a_fake_nvml_test_double_refuses(monkeypatch):
    refusing = fake_nvml_test_double(refuse={"nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage"})
    monkeypatch.setitem(sys.modules, "pynvml", refusing)

    state = gpu_timing.GpuWatch.open().snapshot()

    assert state["temperature_c"] is None and state["power_w"] is None
    assert state["sm_clock_mhz"] == 1980


def test_it_reports_the_gpu_side_of_a_cuda_engine_test_double(nvml):
    result = benchmark_session(lambda settings: CudaEngineTestDouble(), FEW)

    gpu = result["gpu"]
    assert result["backend"] == "tensorrt" and result["provider"] == "tensorrt"
    assert list(gpu) == [
        "device",
        "e2e_ms",
        "compute_ms",
        "cuda_graphs",
        "peak_device_memory_mb",
        "memory_source",
        "nvml_before",
        "nvml_after",
    ]
    assert gpu["device"] == "NVIDIA Test GPU"
    assert gpu["e2e_ms"] == result["latency_ms"]
    assert gpu["compute_ms"] is None  # only ONNX Runtime's IO binding times compute alone
    assert gpu["cuda_graphs"] is False
    assert gpu["peak_device_memory_mb"] == 700
    assert gpu["memory_source"] == gpu_timing.PROCESS_MEMORY
    assert gpu["nvml_before"]["throttle_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]
    assert gpu["nvml_after"]["memory_used_mb"] > gpu["nvml_before"]["memory_used_mb"]
    assert nvml.shutdowns == [1]


def test_it_falls_back_to_the_devices_memory_when_nvml_does_not_list_the_process(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml_test_double(list_this_process=False))

    gpu = benchmark_session(lambda settings: CudaEngineTestDouble(), FEW)["gpu"]

    assert gpu["memory_source"] == gpu_timing.DEVICE_MEMORY
    assert gpu["peak_device_memory_mb"] > 0  # grown since the baseline read before loading


def test_it_says_so_when_nvml_cannot_be_read_on_a_cuda_engine_test_double(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError

    gpu = benchmark_session(lambda settings: CudaEngineTestDouble(), FEW)["gpu"]

    assert (gpu["nvml_before"], gpu["nvml_after"], gpu["peak_device_memory_mb"]) == (None,) * 3
    assert gpu["memory_source"] == gpu_timing.NO_NVML
    assert gpu["device"] == "cuda:0"


def test_it_refuses_cuda_graphs_for_another_backends_engine_test_double(nvml):
    with pytest.raises(JobError, match="cuda_graphs needs an ONNX Runtime model .* on tensorrt"):
        benchmark_session(lambda settings: CudaEngineTestDouble(), {**FEW, "cuda_graphs": True})

    assert nvml.shutdowns == [1]


def test_it_leaves_nvml_alone_for_a_cpu_session(nvml, tmp_path):
    result = benchmark_onnxruntime(matmul_relu(tmp_path / "mm.onnx"), FEW)

    assert result["gpu"] is None
    assert nvml.shutdowns == [1]
    assert "nvmlDeviceGetClockInfo" not in nvml.reads


@pytest.mark.skipif(NO_CUDA, reason="needs an NVIDIA GPU with onnxruntime-gpu (no CUDA EP here)")
@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_it_times_compute_apart_from_copies_on_a_real_gpu(tmp_path, cuda_graphs):
    params = {**FEW, "provider": "CUDAExecutionProvider", "cuda_graphs": cuda_graphs}

    result = benchmark_onnxruntime(matmul_relu(tmp_path / "mm.onnx"), params)

    gpu = result["gpu"]
    assert result["provider"] == "CUDAExecutionProvider"
    assert gpu["cuda_graphs"] is cuda_graphs
    assert gpu["e2e_ms"] == result["latency_ms"]
    assert 0 < gpu["compute_ms"]["p50"]
    assert gpu["nvml_before"]["sm_clock_mhz"] is not None
    assert gpu["peak_device_memory_mb"] > 0
