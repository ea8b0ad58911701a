"""Compatibility keys: an engine is served only where the fields it depends on are the same."""

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from workers import fingerprint as fingerprints
from workers.backends import known
from workers.backends.base import (
    canonical,
    compat_key,
    describe_differences,
    differences,
    digest,
)
from workers.backends.known import BACKENDS, MissingRuntime, UnknownBackend
from workers.backends.onnxruntime import OnnxRuntimeBackend
from workers.errors import JobError
from workers.selftest import write_tiny_model

ROOT = Path(__file__).resolve().parent.parent

AVX2 = ["sse4_2", "avx", "avx2", "fma"]
AVX512 = AVX2 + ["avx512f", "avx512bw", "avx512_vnni"]
AVX512_NO_VNNI = AVX2 + ["avx512f", "avx512bw"]  # Skylake-SP: AVX-512 without int8 dot products
AVX512_AMX = AVX512 + ["avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"]


def device(
    gpu="NVIDIA A10",
    cc="8.6",
    driver="550.54.15",
    cuda="12.4",
    tensorrt="10.16.1.11",
    ort="1.32.0",
    flags=AVX512,
    openvino="2026.4.1",
    torch="2.13.0+cu124",
):
    """Return a schema-2 fingerprint of a GPU host; None drops a runtime or the GPU."""
    gpu0 = {"index": 0, "name": gpu, "uuid": f"GPU-{gpu}", "compute_capability": cc}
    return {
        "schema": 2,
        "cpu": {
            "model": "x86",
            "count": 16,
            "flags": flags,
            "isa_level": fingerprints.isa_level(flags),
        },
        "gpus": [] if gpu is None else [gpu0 | {"memory_mb": 24576}],
        "nvidia_driver": driver,
        "cuda": {"driver_api": cuda, "runtime": None},
        "onnxruntime": ort and {"version": ort, "providers": ["CPUExecutionProvider"]},
        "tensorrt": tensorrt and {"version": tensorrt},
        "openvino": openvino and {"version": openvino, "devices": ["CPU"]},
        "torch": torch and {"version": torch, "cuda": cuda, "cudnn": "9.1.0"},
        "cudnn": {"version": "9.1.0"},
    }


@dataclass
class Case:
    name: str
    backend: str
    fingerprint_a: dict
    config_a: dict
    fingerprint_b: dict
    config_b: dict
    same_key: bool
    differing: list = field(default_factory=list)


VERSION_COMPATIBLE = {"version_compatible": True}
AMPERE_PLUS = {"hardware_compatibility": "ampere_plus"}
AOTI_CUDA = {"device": "cuda"}
SAME_CC = {"hardware_compatibility": "same_compute_capability"}
ORT_ALL = {"optimization_level": "all"}
ORT_CUDA = {"provider": "CUDAExecutionProvider", "optimization_level": "all"}
ORT_INT8 = {"precision": "int8", "optimization_level": "all"}
OV_BF16_BLOB = {"device": "CPU", "export_blob": True, "precision": "bf16"}
OV_BF16_IR = {"precision": "bf16", "export_blob": False}
OV_FULL_BUILD = "2026.4.1-22982-e213a147257-releases/2026/4"

CASES = [
    # TensorRT
    Case("trt other driver major", "tensorrt", device(), {}, device(driver="560.28.03"), {},
         False, ["driver_major"]),
    Case("trt same driver major", "tensorrt", device(), {}, device(driver="550.90.07"), {}, True),
    Case("trt same arch other gpu model", "tensorrt", device(gpu="NVIDIA A10"), {},
         device(gpu="NVIDIA GeForce RTX 3090"), {}, True),
    Case("trt other arch", "tensorrt", device(), {}, device(gpu="NVIDIA L4", cc="8.9"), {},
         False, ["compute_capability"]),
    Case("trt patch change", "tensorrt", device(tensorrt="10.16.1"), {},
         device(tensorrt="10.16.0"), {}, False, ["tensorrt"]),
    Case("trt build number only", "tensorrt", device(tensorrt="10.16.1.11"), {},
         device(tensorrt="10.16.1.12"), {}, True),
    Case("trt version-compatible minor change", "tensorrt", device(tensorrt="10.16.1"),
         VERSION_COMPATIBLE, device(tensorrt="10.17.0"), VERSION_COMPATIBLE, True),
    Case("trt version-compatible major change", "tensorrt", device(tensorrt="10.16.1"),
         VERSION_COMPATIBLE, device(tensorrt="11.0.0"), VERSION_COMPATIBLE, False, ["tensorrt"]),
    Case("trt ampere_plus on ada", "tensorrt", device(cc="8.6"), AMPERE_PLUS,
         device(gpu="NVIDIA L4", cc="8.9"), AMPERE_PLUS, True),
    Case("trt ampere_plus on hopper", "tensorrt", device(cc="8.6"), AMPERE_PLUS,
         device(gpu="NVIDIA H100", cc="9.0"), AMPERE_PLUS, True),
    Case("trt ampere_plus on turing", "tensorrt", device(cc="8.6"), AMPERE_PLUS,
         device(gpu="Tesla T4", cc="7.5"), AMPERE_PLUS, False, ["arch_family"]),
    Case("trt same_compute_capability keeps cc", "tensorrt", device(cc="8.6"), SAME_CC,
         device(gpu="NVIDIA L4", cc="8.9"), SAME_CC, False, ["compute_capability"]),
    Case("trt cuda major change", "tensorrt", device(cuda="12.9"), {}, device(cuda="13.0"), {},
         False, ["cuda_major"]),
    Case("trt cuda minor change", "tensorrt", device(cuda="12.4"), {}, device(cuda="12.8"), {},
         True),
    Case("trt not installed on b", "tensorrt", device(), {}, device(tensorrt=None), {},
         False, ["tensorrt"]),
    Case("trt precision is in the config digest, not the key", "tensorrt", device(),
         {"precision": "fp16"}, device(), {"precision": "int8", "int8_mode": "qdq"}, True),
    Case("trt hardware_compatibility none is the default", "tensorrt", device(), {}, device(),
         {"hardware_compatibility": "none", "workspace_mb": 1024}, True),
    # ONNX Runtime
    Case("ort offline all avx512 vs avx2", "onnxruntime", device(flags=AVX512), ORT_ALL,
         device(flags=AVX2), ORT_ALL, False, ["cpu_isa"]),
    Case("ort offline extended avx512 vs avx2", "onnxruntime", device(flags=AVX512),
         {"optimization_level": "extended"}, device(flags=AVX2),
         {"optimization_level": "extended"}, False, ["cpu_isa"]),
    Case("ort offline basic avx512 vs avx2", "onnxruntime", device(flags=AVX512),
         {"optimization_level": "basic"}, device(flags=AVX2), {"optimization_level": "basic"},
         True),
    Case("ort default config is level all", "onnxruntime", device(flags=AVX512), {},
         device(flags=AVX2), ORT_ALL, False, ["cpu_isa"]),
    Case("ort defaults spelled out", "onnxruntime", device(), {}, device(),
         {"provider": "CPUExecutionProvider", "optimization_level": "all"}, True),
    Case("ort cpu vs cuda provider", "onnxruntime", device(), ORT_ALL, device(), ORT_CUDA,
         False, ["provider", "cpu_isa", "compute_capability"]),
    Case("ort cuda other arch", "onnxruntime", device(cc="8.6"), ORT_CUDA,
         device(gpu="NVIDIA L4", cc="8.9"), ORT_CUDA, False, ["compute_capability"]),
    Case("ort cuda ignores cpu isa", "onnxruntime", device(flags=AVX512), ORT_CUDA,
         device(flags=AVX2), ORT_CUDA, True),
    Case("ort version change", "onnxruntime", device(ort="1.32.0"), ORT_ALL,
         device(ort="1.31.0"), ORT_ALL, False, ["onnxruntime"]),
    Case("ort ignores gpu and driver on cpu", "onnxruntime", device(driver="550.54.15"),
         ORT_ALL, device(gpu=None, driver=None), ORT_ALL, True),
    Case("ort int8 vnni vs no vnni", "onnxruntime", device(flags=AVX512), ORT_INT8,
         device(flags=AVX512_NO_VNNI), ORT_INT8, False, ["cpu_vnni"]),
    Case("ort fp32 ignores vnni", "onnxruntime", device(flags=AVX512), ORT_ALL,
         device(flags=AVX512_NO_VNNI), ORT_ALL, True),
    Case("ort int8 at level basic ignores vnni", "onnxruntime", device(flags=AVX512),
         ORT_INT8 | {"optimization_level": "basic"}, device(flags=AVX512_NO_VNNI),
         ORT_INT8 | {"optimization_level": "basic"}, True),
    Case("ort int8 on cuda ignores vnni", "onnxruntime", device(flags=AVX512),
         ORT_CUDA | {"precision": "int8"}, device(flags=AVX512_NO_VNNI),
         ORT_CUDA | {"precision": "int8"}, True),
    # OpenVINO
    Case("ov bf16 blob without vs with amx", "openvino", device(flags=AVX512), OV_BF16_BLOB,
         device(flags=AVX512_AMX), OV_BF16_BLOB, False, ["bf16_hardware"]),
    Case("ov blob avx2 vs avx512", "openvino", device(flags=AVX2), OV_BF16_BLOB,
         device(flags=AVX512), OV_BF16_BLOB, False, ["cpu_isa"]),
    Case("ov ir travels across cpus", "openvino", device(flags=AVX512), OV_BF16_IR,
         device(flags=AVX512_AMX), OV_BF16_IR, True),
    Case("ov default config exports a blob", "openvino", device(flags=AVX512), {},
         device(flags=AVX2), {}, False, ["cpu_isa"]),
    Case("ov int8 ir travels across cpus", "openvino", device(flags=AVX512),
         {"precision": "int8", "export_blob": False}, device(flags=AVX2),
         {"precision": "int8", "export_blob": False}, True),
    Case("ov cpu vs gpu plugin", "openvino", device(), {"device": "CPU"}, device(),
         {"device": "GPU"}, False, ["device", "cpu_isa", "bf16_hardware"]),
    Case("ov gpu ir ignores the cpu", "openvino", device(flags=AVX512), {"device": "GPU"},
         device(flags=AVX2), {"device": "GPU"}, True),
    Case("ov version change", "openvino", device(openvino="2026.4.1"), {},
         device(openvino="2026.5.0"), {}, False, ["openvino"]),
    Case("ov package version and build string are one release", "openvino",
         device(openvino="2026.4.1"), {}, device(openvino=OV_FULL_BUILD), {}, True),
    # AOTInductor
    Case("aoti torch change", "torch-aoti", device(torch="2.13.0+cu124"), AOTI_CUDA,
         device(torch="2.14.0+cu124"), AOTI_CUDA, False, ["torch"]),
    Case("aoti cuda change", "torch-aoti", device(cuda="12.4"), AOTI_CUDA, device(cuda="12.8"),
         AOTI_CUDA, False, ["cuda"]),
    Case("aoti other arch", "torch-aoti", device(cc="8.6"), AOTI_CUDA, device(cc="9.0"),
         AOTI_CUDA, False, ["compute_capability"]),
    Case("aoti same arch other gpu model", "torch-aoti", device(gpu="NVIDIA A10"), AOTI_CUDA,
         device(gpu="NVIDIA GeForce RTX 3090"), AOTI_CUDA, True),
    Case("aoti cpu vs cuda", "torch-aoti", device(), {}, device(), AOTI_CUDA, False,
         ["device", "cpu_isa", "cpu_extensions", "compute_capability"]),
    Case("aoti cpu isa change", "torch-aoti", device(flags=AVX512), {}, device(flags=AVX2), {},
         False, ["cpu_isa", "cpu_extensions"]),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_it_keys_an_engine_on_exactly_what_it_depends_on(case):
    backend = BACKENDS[case.backend]

    fields_a = backend.compat_fields(case.fingerprint_a, case.config_a)
    fields_b = backend.compat_fields(case.fingerprint_b, case.config_b)

    same = compat_key(case.backend, fields_a) == compat_key(case.backend, fields_b)
    assert same is case.same_key
    assert list(differences(fields_a, fields_b)) == case.differing


def test_it_reads_the_documented_fields_of_each_backend():
    host = device()

    assert BACKENDS["tensorrt"].compat_fields(host, {}) == {
        "tensorrt": "10.16.1",
        "compute_capability": "8.6",
        "driver_major": 550,
        "cuda_major": 12,
    }
    assert BACKENDS["tensorrt"].compat_fields(host, VERSION_COMPATIBLE | AMPERE_PLUS) == {
        "tensorrt": "10",
        "version_compatible": True,
        "arch_family": "ampere+",
        "driver_major": 550,
        "cuda_major": 12,
    }
    assert BACKENDS["onnxruntime"].compat_fields(host, {}) == {
        "onnxruntime": "1.32.0",
        "provider": "CPUExecutionProvider",
        "optimization_level": "all",
        "cpu_isa": "avx512",
    }
    assert BACKENDS["onnxruntime"].compat_fields(host, ORT_INT8)["cpu_vnni"] is True
    assert BACKENDS["openvino"].compat_fields(device(flags=AVX512_AMX), OV_BF16_BLOB) == {
        "openvino": "2026.4.1",
        "device": "CPU",
        "cpu_isa": "avx512",
        "bf16_hardware": True,
    }
    assert BACKENDS["torch-aoti"].compat_fields(host, AOTI_CUDA) == {
        "torch": "2.13.0+cu124",
        "cuda": "12.4",
        "device": "cuda",
        "machine": None,
        "compute_capability": "8.6",
    }
    assert BACKENDS["torch-aoti"].compat_fields(host, {}) == {
        "torch": "2.13.0+cu124",
        "cuda": "12.4",
        "device": "cpu",
        "machine": None,
        "cpu_isa": "avx512",
        "cpu_extensions": ["avx512_vnni"],
    }


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize(
    "fingerprint",
    [{}, None, {"schema": 1, "cpu": {"flags": None}}, {"gpus": None, "cuda": None}],
    ids=["empty", "none", "schema-1", "unknowns"],
)
def test_it_computes_fields_from_any_fingerprint_without_raising(backend, fingerprint):
    fields = BACKENDS[backend].compat_fields(fingerprint, {})

    assert json.loads(canonical(fields)) == fields


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_it_computes_keys_from_the_fingerprint_this_worker_reports(backend):
    reported = json.loads(json.dumps(fingerprints.collect()))  # as the hub stores it

    fields = BACKENDS[backend].compat_fields(reported, {})

    assert compat_key(backend, fields).startswith(f"{backend}:")
    assert fields == BACKENDS[backend].compat_fields(fingerprints.collect(), {})


def test_it_digests_canonical_json_whatever_the_key_order():
    assert canonical({"b": 1, "a": {"d": None, "c": "≠"}}) == '{"a":{"c":"≠","d":null},"b":1}'
    assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1})
    assert compat_key("onnxruntime", {"a": 1}) == f"onnxruntime:{digest({'a': 1})}"
    assert len(digest({})) == 64


def test_it_lists_differences_with_dotted_names_engine_first():
    engine = {"onnxruntime": "1.32.0", "cpu": {"isa": "avx512", "cores": 8}, "provider": "CPU"}
    device_ = {"onnxruntime": "1.31.0", "cpu": {"isa": "avx2", "cores": 8}, "gpu": "8.6"}

    diffs = differences(engine, device_)

    assert diffs == {
        "onnxruntime": ["1.32.0", "1.31.0"],
        "cpu.isa": ["avx512", "avx2"],
        "provider": ["CPU", None],
        "gpu": [None, "8.6"],
    }
    assert describe_differences(diffs) == (
        "onnxruntime 1.32.0 ≠ 1.31.0; cpu isa avx512 ≠ avx2; provider CPU ≠ none; gpu none ≠ 8.6"
    )
    assert differences(engine, engine) == {}


def test_it_describes_differences_as_the_hub_shows_them():
    a = BACKENDS["onnxruntime"].compat_fields(device(ort="1.32.0", flags=AVX512), {})
    b = BACKENDS["onnxruntime"].compat_fields(device(ort="1.31.0", flags=AVX2), {})

    assert describe_differences(differences(a, b)) == (
        "onnxruntime 1.32.0 ≠ 1.31.0; cpu isa avx512 ≠ avx2"
    )
    trt_a = BACKENDS["tensorrt"].compat_fields(device(), VERSION_COMPATIBLE)
    trt_b = BACKENDS["tensorrt"].compat_fields(device(tensorrt="11.0.0"), VERSION_COMPATIBLE)
    assert describe_differences(differences(trt_a, trt_b)) == "tensorrt 10 ≠ 11"


def test_it_loads_and_runs_an_onnxruntime_engine_as_the_source_model_computes(tmp_path):
    source = write_tiny_model(tmp_path / "tiny.onnx")
    backend = OnnxRuntimeBackend()
    built = backend.compile(source, ORT_ALL, tmp_path)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 16), dtype=np.float32)}

    [got] = backend.infer(backend.load(built.artifact, ORT_ALL), feeds)

    [expected] = onnxruntime.InferenceSession(str(source)).run(None, feeds)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert built.artifact.name == "engine.onnx" and built.timing_cache is None
    assert built.tool_versions == {"onnxruntime": onnxruntime.__version__}


def test_it_refuses_a_provider_this_onnxruntime_lacks(tmp_path):
    source = write_tiny_model(tmp_path / "tiny.onnx")
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")

    with pytest.raises(JobError, match="has no CUDAExecutionProvider"):
        OnnxRuntimeBackend().compile(source, ORT_CUDA, tmp_path)


def test_it_refuses_a_second_backend_with_a_taken_name():
    class AnotherOnnxRuntime(OnnxRuntimeBackend):
        pass

    with pytest.raises(ValueError, match="'onnxruntime' is registered already"):
        known.register(AnotherOnnxRuntime)
    assert BACKENDS["onnxruntime"] is OnnxRuntimeBackend


def test_it_knows_every_backend_and_runs_onnxruntime_here():
    assert set(BACKENDS) == {"onnxruntime", "tensorrt", "openvino", "torch-aoti"}
    assert "onnxruntime" in known.runnable()
    assert known.require("onnxruntime") is OnnxRuntimeBackend
    assert known.get("tensorrt").extra == "tensorrt"


@pytest.mark.skipif(known.get("tensorrt").available(), reason="TensorRT is installed here")
def test_it_names_the_extra_to_install_for_a_missing_runtime():
    assert "tensorrt" not in known.runnable()

    with pytest.raises(MissingRuntime, match=r"install deployhub\[tensorrt\]") as raised:
        known.require("tensorrt")
    assert isinstance(raised.value, JobError)


def test_it_refuses_an_unknown_backend_by_name():
    with pytest.raises(UnknownBackend, match="'tflite'"):
        known.require("tflite")


def test_it_refuses_build_configs_a_backend_cannot_build():
    with pytest.raises(JobError, match="optimization_level 'max'"):
        BACKENDS["onnxruntime"].check_config({"optimization_level": "max"})
    with pytest.raises(JobError, match="unknown keys"):
        BACKENDS["onnxruntime"].check_config({"optimisation_level": "all"})
    with pytest.raises(JobError, match="hardware_compatibility"):
        BACKENDS["tensorrt"].check_config({"hardware_compatibility": "turing_plus"})
    BACKENDS["onnxruntime"].check_config(ORT_ALL)
    BACKENDS["tensorrt"].check_config(AMPERE_PLUS)


# The hub computes keys and fingerprint diffs with no runtime installed: refuse them all.
HUB_WITHOUT_RUNTIMES = """
import sys

class NoRuntimes:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(name + " is not installed on the hub")

sys.meta_path.insert(0, NoRuntimes())
from workers.backends.base import compat_key, differences
from workers.backends.known import BACKENDS, runnable
from workers.fingerprint import diff
fingerprint = {fingerprint!r}
for name, backend in BACKENDS.items():
    print(name, compat_key(name, backend.compat_fields(fingerprint, {{}})))
print(diff(fingerprint, {{**fingerprint, "nvidia_driver": "560.28.03"}}))
print(runnable())
"""
RUNTIMES = ["onnxruntime", "onnx", "tensorrt", "openvino", "torch", "pynvml", "psutil"]
RUNTIMES += ["numpy", "celery", "requests"]


def test_it_computes_keys_and_diffs_where_no_runtime_is_installed():
    code = HUB_WITHOUT_RUNTIMES.format(blocked=RUNTIMES, fingerprint=device())

    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )

    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert [line.split()[0] for line in lines[:4]] == list(BACKENDS)
    assert "NVIDIA driver 550.54.15 → 560.28.03" in lines[4]
    assert lines[5] == "[]"


def test_it_imports_no_runtime_when_the_worker_modules_load():
    code = (
        "import sys, workers.cli, workers.app, workers.runner, workers.backends.known; "
        "print(sorted(m for m in ('torch', 'tensorrt', 'openvino', 'onnxruntime') "
        "if m in sys.modules))"
    )

    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )

    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"
