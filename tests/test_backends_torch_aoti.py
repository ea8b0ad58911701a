"""AOTInductor packages: their keys, build configs, and real builds run against eager PyTorch."""

import re
import shutil
import zipfile
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from torch.export import Dim

from workers import fingerprint as fingerprints
from workers.backends.base import compat_key, differences
from workers.backends.isolate import classify
from workers.backends.torch_aoti import (
    InputMeta,
    LoadedPackage,
    TorchAotiBackend,
    check_device_here,
    graph_report,
    inductor_configs,
    input_metas_from_pt2,
    retarget,
)
from workers.checks.export import load_program
from workers.errors import JobError
from workers.measure.benchmark import random_inputs

AVX2 = ["sse4_2", "avx", "avx2", "fma"]
AVX512 = AVX2 + ["avx512f", "avx512bw", "avx512_vnni"]
AVX512_AMX = AVX512 + ["avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"]
CPU = {}
CUDA = {"device": "cuda"}
NO_GPU = "no CUDA GPU here: run on a GPU machine"


def host(torch_version="2.13.0+cu124", cuda="12.4", cc="8.6", flags=AVX512, machine="x86_64"):
    """Return the fingerprint of a worker; cc None drops the GPU."""
    gpu = {"index": 0, "name": "NVIDIA A10", "compute_capability": cc, "memory_mb": 24576}
    return {
        "schema": 2,
        "os": {"system": "Linux", "release": "6.1.0", "machine": machine},
        "cpu": {
            "model": "x86",
            "count": 16,
            "flags": flags,
            "isa_level": fingerprints.isa_level(flags),
        },
        "gpus": [] if cc is None else [gpu],
        "cuda": {"driver_api": cuda, "runtime": None},
        "torch": {"version": torch_version, "cuda": cuda, "cudnn": "9.1.0"},
    }


@dataclass
class Case:
    name: str
    fingerprint_a: dict
    config_a: dict
    fingerprint_b: dict
    config_b: dict
    differing: list = field(default_factory=list)  # none: the same key


CASES = [
    Case("cpu and cuda packages of one host", host(), CPU, host(), CUDA,
         ["device", "cpu_isa", "cpu_extensions", "compute_capability"]),
    Case("cpu torch change", host("2.13.0+cpu", cuda=None), CPU,
         host("2.14.0+cpu", cuda=None), CPU, ["torch"]),
    Case("cuda torch change", host("2.13.0+cu124"), CUDA, host("2.14.0+cu124"), CUDA, ["torch"]),
    Case("cpu isa avx512 vs avx2", host(flags=AVX512), CPU, host(flags=AVX2), CPU,
         ["cpu_isa", "cpu_extensions"]),
    Case("cpu amx on one isa level", host(flags=AVX512), CPU, host(flags=AVX512_AMX), CPU,
         ["cpu_extensions"]),
    Case("cpu package ignores the gpu", host(cc="8.6"), CPU, host(cc=None), CPU),
    Case("cuda package ignores the cpu", host(flags=AVX2), CUDA, host(flags=AVX512_AMX), CUDA),
    Case("cuda other gpu arch", host(cc="8.6"), CUDA, host(cc="9.0"), CUDA, ["compute_capability"]),
    Case("cuda runtime change", host(cuda="12.4"), CUDA, host(cuda="12.8"), CUDA, ["cuda"]),
    Case("cuda other host architecture", host(), CUDA, host(machine="aarch64"), CUDA, ["machine"]),
    Case("precision and autotuning leave the key", host(), CPU, host(),
         {"precision": "bf16", "max_autotune": True}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_it_keys_a_package_on_exactly_what_it_depends_on(case):
    fields_a = TorchAotiBackend.compat_fields(case.fingerprint_a, case.config_a)
    fields_b = TorchAotiBackend.compat_fields(case.fingerprint_b, case.config_b)

    same = compat_key("torch-aoti", fields_a) == compat_key("torch-aoti", fields_b)
    assert same is (case.differing == [])
    assert list(differences(fields_a, fields_b)) == case.differing


def test_it_reads_the_documented_fields_for_each_device():
    assert TorchAotiBackend.compat_fields(host(flags=AVX512_AMX), CPU) == {
        "torch": "2.13.0+cu124",
        "cuda": "12.4",
        "device": "cpu",
        "machine": "x86_64",
        "cpu_isa": "avx512",
        "cpu_extensions": ["avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"],
    }
    assert TorchAotiBackend.compat_fields(host(), CUDA) == {
        "torch": "2.13.0+cu124",
        "cuda": "12.4",
        "device": "cuda",
        "machine": "x86_64",
        "compute_capability": "8.6",
    }


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"devices": "cuda"}, r"unknown keys \['devices'\]"),
        ({"device": "tpu"}, r"device 'tpu' is not one of \['cpu', 'cuda'\]"),
        ({"device": "CUDA"}, r"device 'CUDA'"),
        ({"precision": "int8"}, r"precision 'int8' is not one of \['fp32', 'fp16', 'bf16'\]"),
        ({"max_autotune": "yes"}, r"max_autotune must be true or false"),
    ],
)
def test_it_refuses_build_configs_it_cannot_build(config, message):
    with pytest.raises(JobError, match=message):
        TorchAotiBackend.check_config(config)


def test_it_accepts_every_documented_setting():
    TorchAotiBackend.check_config({})
    TorchAotiBackend.check_config(None)
    TorchAotiBackend.check_config({"device": "cuda", "precision": "bf16", "max_autotune": True})
    TorchAotiBackend.check_config({"device": "cpu", "precision": "fp16", "max_autotune": False})


def test_it_compiles_cpu_code_for_the_isa_level_not_for_the_build_host():
    assert inductor_configs({}, "cpu", "avx512", "x86_64") == {"cpp.march": "x86-64-v4"}
    assert inductor_configs({}, "cpu", "avx2", "x86_64") == {"cpp.march": "x86-64-v3"}
    assert inductor_configs({}, "cpu", "default", "x86_64") == {"cpp.march": "x86-64"}
    assert inductor_configs({"max_autotune": True}, "cuda", "avx512", "x86_64") == {
        "max_autotune": True,
        "cpp.march": "x86-64",
        "cpp.simdlen": 0,
    }
    assert inductor_configs({}, "cuda", "sve256", "aarch64") == {}


def test_it_refuses_cpu_builds_off_x86():
    with pytest.raises(JobError, match="x86-64 workers only.*this worker is aarch64"):
        check_device_here("cpu", "aarch64")


def test_it_refuses_cuda_without_a_gpu_as_a_missing_runtime(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    backend = TorchAotiBackend()

    with pytest.raises(JobError, match="^no CUDA GPU: ") as raised:
        backend.compile(tmp_path / "program.pt2", CUDA, tmp_path)

    assert classify(str(raised.value), 1, False) == ("runtime_missing", None)
    with pytest.raises(JobError, match="^no CUDA GPU: "):
        backend.load(tmp_path / "engine.pt2", CUDA)


def test_it_reports_n_a_kernels_for_a_package_without_sources(tmp_path):
    package = tmp_path / "engine.pt2"
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr("engine/data/aotinductor/model/model.so", b"\x7fELF")
    before = {"nodes": 3, "operators": {"aten.relu.default": 3}}

    report = graph_report(before, package)

    assert report["after"] == {"kernels": "n/a"}
    assert report["before"] is before


def test_it_casts_float_inputs_to_the_engine_precision_and_outputs_back():
    seen = []

    def engine(x, ids):
        seen.extend([x.dtype, ids.dtype])
        return (x * 2, ids)

    handle = LoadedPackage(engine, "cpu", torch.bfloat16)
    feeds = {"x": np.ones((1, 2), np.float32), "ids": np.arange(3, dtype=np.int64)}

    outputs = TorchAotiBackend().infer(handle, feeds)

    assert seen == [torch.bfloat16, torch.int64]
    assert [output.dtype for output in outputs] == [np.float32, np.int64]
    np.testing.assert_array_equal(outputs[0], [[2.0, 2.0]])


class TinyNet(torch.nn.Module):
    """Conv + BatchNorm + ReLU + pooling + Linear, as small as it gets."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(4)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.head = torch.nn.Linear(4, 5)

    def forward(self, x):
        x = torch.relu(self.norm(self.conv(x)))
        return self.head(torch.flatten(self.pool(x), 1))


@pytest.fixture(scope="module")
def tiny_program(tmp_path_factory):
    """Return (a .pt2 of TinyNet with a dynamic batch of 1 to 8, the eager model)."""
    torch.manual_seed(0)
    model = TinyNet().eval()
    with torch.no_grad():  # running statistics that are not the identity
        model.norm.running_mean.uniform_(-0.5, 0.5)
        model.norm.running_var.uniform_(0.5, 2.0)
    batch = Dim("batch", min=1, max=8)
    program = torch.export.export(model, (torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: batch},))
    path = tmp_path_factory.mktemp("program") / "tiny.pt2"
    torch.export.save(program, str(path))
    return path, model


@pytest.fixture(scope="module")
def cpu_build(tiny_program, tmp_path_factory):
    """Build the tiny program for the CPU once: it is a real compile of C++."""
    source, _ = tiny_program
    return TorchAotiBackend().compile(source, CPU, tmp_path_factory.mktemp("cpu-build"))


def _eager(model, feeds):
    with torch.no_grad():
        return model(*(torch.from_numpy(array) for array in feeds.values())).numpy()


@pytest.mark.parametrize("batch_size", [1, 3])
def test_it_runs_a_cpu_package_as_eager_pytorch_computes(tiny_program, cpu_build, batch_size):
    source, model = tiny_program
    backend = TorchAotiBackend()
    feeds = random_inputs(input_metas_from_pt2(source, batch_size), batch_size, seed=batch_size)

    [got] = backend.infer(backend.load(cpu_build.artifact, CPU), feeds)

    expected = _eager(model, feeds)
    assert got.shape == expected.shape == (batch_size, 5)
    assert np.abs(got - expected).max() <= 1e-4


def test_it_loads_a_package_under_the_name_the_worker_downloads_it_to(cpu_build, tmp_path):
    downloaded = tmp_path / "engine"
    shutil.copy(cpu_build.artifact, downloaded)
    feeds = {"x": np.zeros((1, 3, 8, 8), np.float32)}

    [got] = TorchAotiBackend().infer(TorchAotiBackend().load(downloaded, CPU), feeds)

    assert got.shape == (1, 5)


def test_its_package_passes_the_hubs_artifact_check(cpu_build):
    assert TorchAotiBackend.artifact_problem(cpu_build.artifact) == ""


def test_it_keys_a_cpu_package_on_this_cpu(cpu_build):
    reported = fingerprints.collect()

    fields = TorchAotiBackend.compat_fields(reported, CPU)

    assert compat_key("torch-aoti", fields).startswith("torch-aoti:")
    assert fields["device"] == "cpu" and fields["cpu_isa"] == reported["cpu"]["isa_level"]
    assert "compute_capability" not in fields
    assert cpu_build.artifact.name == "engine.pt2" and cpu_build.timing_cache is None
    assert cpu_build.tool_versions == {"torch": torch.__version__, "cuda": torch.version.cuda}


def test_it_reports_the_exported_graph_and_the_generated_kernels(cpu_build):
    report = cpu_build.graph_report

    assert report["before"]["nodes"] == 6
    assert report["before"]["operators"]["aten.conv2d.default"] == 1
    after = report["after"]
    assert after["kernels"] >= 1
    assert after["nodes"] == after["kernels"] + after["library_calls"]
    assert any(name.startswith("cpp_fused_") for name in after["operators"])
    assert report["fused"][0].startswith("nodes: 6 exported ops → ")
    assert re.search(r"compiling with AOTInductor, .*'cpp\.march'.*: \d+\.\d\d s", cpu_build.log)


def test_it_reads_a_programs_inputs_as_the_benchmark_does(tiny_program):
    source, _ = tiny_program

    metas = input_metas_from_pt2(source, 4)

    assert metas == [InputMeta("x", [4, 3, 8, 8], "tensor(float)")]
    [dynamic] = input_metas_from_pt2(source)
    assert isinstance(dynamic.shape[0], str) and dynamic.shape[1:] == [3, 8, 8]
    assert random_inputs([dynamic], 6)["x"].shape == (6, 3, 8, 8)


def test_it_casts_a_program_to_bf16_keeping_its_dynamic_batch(tiny_program):
    source, model = tiny_program
    program = load_program(source)

    cast = retarget(program, "cpu", "bf16")

    floats = [value for value in cast.state_dict.values() if value.is_floating_point()]
    assert floats and all(value.dtype == torch.bfloat16 for value in floats)
    assert str(cast.range_constraints) == str(program.range_constraints)
    x = torch.randn(5, 3, 8, 8)
    with torch.no_grad():
        got = cast.module()(x.to(torch.bfloat16)).float()
        np.testing.assert_allclose(got.numpy(), model(x).numpy(), atol=0.05)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_it_runs_a_cuda_package_as_eager_pytorch_computes(tiny_program, tmp_path):
    source, model = tiny_program
    backend = TorchAotiBackend()
    built = backend.compile(source, CUDA, tmp_path)
    feeds = random_inputs(input_metas_from_pt2(source, 2), 2)

    [got] = backend.infer(backend.load(built.artifact, CUDA), feeds)

    # cuDNN may convolve in TF32 on Ampere and later: 1e-4 is for the CPU.
    assert np.abs(got - _eager(model, feeds)).max() <= 1e-3
    fields = TorchAotiBackend.compat_fields(fingerprints.collect(), CUDA)
    assert fields["device"] == "cuda" and fields["compute_capability"]
    assert built.tool_versions["cuda"] == torch.version.cuda
    assert "kernels" in built.graph_report["after"]
