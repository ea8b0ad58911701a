"""The OpenVINO backend: real OpenVINO and NNCF on this CPU, with the demo digits model."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest

from tests.foreign_models import (
    calibration_npz,
    conv_model,
    nothing_to_quantise_model,
    old_opset_model,
    sample_input,
)
from workers.backends import known
from workers.backends import openvino as openvino_backend
from workers.backends.openvino import OpenVinoBackend
from workers.errors import JobError

# Imported after the backend, which turns OpenVINO's telemetry off first; skipped without it.
openvino = pytest.importorskip("openvino")
ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "deployhub" / "demo" / "assets"
SOURCE = ASSETS / "digits_cnn_v2.onnx"
CALIBRATION = ASSETS / "calibration.npz"
INT8 = {"precision": "int8", "calibration_samples": 100}
BF16 = {"precision": "bf16"}
HAS_BF16 = "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


@pytest.fixture(scope="module")
def validation():
    """The demo's validation set: preprocessed float32 N×3×32×32 images and their labels."""
    with np.load(ASSETS / "validation.npz", allow_pickle=False) as data:
        return data["inputs"], data["labels"]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """Return build(config): the CompileResult of the demo model, compiled once per config."""
    built = {}

    def compile_once(config):
        key = json.dumps(config, sort_keys=True)
        if key not in built:
            workdir = tmp_path_factory.mktemp("openvino")
            built[key] = OpenVinoBackend().compile(SOURCE, config, workdir, calibration=CALIBRATION)
        return built[key]

    return compile_once


def top1(backend, handle, inputs):
    """Return the class each input is given by a loaded engine."""
    [logits] = backend.infer(handle, {"image": inputs})
    return logits.argmax(axis=1)


def test_it_builds_an_archive_of_the_ir_the_blob_and_the_build_record(build):
    built = build({})

    with zipfile.ZipFile(built.artifact) as archive:
        names = sorted(archive.namelist())
        kinds = {info.compress_type for info in archive.infolist()}
        record = json.loads(archive.read("build.json"))
    assert OpenVinoBackend.artifact_problem(built.artifact) == ""  # what the hub signs
    assert built.artifact.name == "engine.zip"
    assert names == ["build.json", "model.bin", "model.blob", "model.xml"]
    assert kinds == {zipfile.ZIP_STORED}
    assert record == {"openvino": openvino.get_version(), "device": "CPU", "build_config": {}}
    assert built.tool_versions == {"openvino": openvino.get_version()}
    assert "INFERENCE_PRECISION_HINT f32, PERFORMANCE_HINT LATENCY" in built.log
    assert built.timing_cache is None


def test_it_runs_the_blob_as_onnxruntime_computes_the_source(build, validation):
    backend, built = OpenVinoBackend(), build({})
    inputs = validation[0][:16]

    handle = backend.load(built.artifact, {})
    [got] = backend.infer(handle, {"image": inputs})

    [expected] = onnxruntime.InferenceSession(str(SOURCE)).run(None, {"image": inputs})
    assert handle.source == "blob"
    assert got.shape == (16, 10)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)


def test_it_reports_the_graph_before_after_and_at_runtime(build):
    report = build({}).graph_report

    assert report["before"]["nodes"] == 15
    assert report["before"]["operators"]["BatchNormalization"] == 3
    assert "BatchNormalization" not in report["after"]["operators"]
    assert report["after"]["operators"]["Convolution"] == 3
    assert report["runtime"]["precisions"] == {"f32": report["runtime"]["nodes"]}
    assert "3 × Convolution + Add + Relu run as one Convolution node each" in report["fused"]
    assert any("Conv+BatchNormalization groups folded" in line for line in report["fused"])


def test_it_quantises_to_int8_with_nncf_and_agrees_with_f32(build, validation):
    backend, inputs = OpenVinoBackend(), validation[0]
    f32, int8 = build({}), build(INT8)

    f32_classes = top1(backend, backend.load(f32.artifact, {}), inputs)
    int8_classes = top1(backend, backend.load(int8.artifact, INT8), inputs)

    assert (int8_classes == f32_classes).mean() >= 0.95
    report = int8.graph_report
    assert report["after"]["operators"]["FakeQuantize"] > 0
    assert {"u8", "i8"} & set(report["runtime"]["precisions"])
    assert any(line.startswith(f"{report['after']['operators']['FakeQuantize']} FakeQuantize")
               for line in report["fused"])  # fmt: skip
    assert "preset performance, 100 calibration samples" in int8.log
    assert set(int8.tool_versions) == {"openvino", "nncf"}


@pytest.mark.skipif(not HAS_BF16, reason="this CPU has neither AMX nor AVX-512 BF16")
def test_it_computes_in_bf16_where_the_cpu_has_it(build, validation):
    backend, inputs = OpenVinoBackend(), validation[0]
    f32, bf16 = build({}), build(BF16)

    f32_classes = top1(backend, backend.load(f32.artifact, {}), inputs)
    handle = backend.load(bf16.artifact, BF16)
    bf16_classes = top1(backend, handle, inputs)

    assert (bf16_classes == f32_classes).mean() >= 0.95
    assert handle.compiled.get_property("INFERENCE_PRECISION_HINT") == openvino.Type.bf16
    assert "bf16" in bf16.graph_report["runtime"]["precisions"]


def test_it_refuses_bf16_on_a_cpu_without_bf16_instructions(tmp_path, monkeypatch):
    monkeypatch.setattr(openvino_backend, "device_capabilities", lambda core, device: ["FP32"])

    with pytest.raises(JobError, match="bf16 needs AMX or AVX-512 BF16; this CPU has neither"):
        OpenVinoBackend().compile(SOURCE, BF16, tmp_path)


def test_it_refuses_int8_without_a_calibration_dataset(tmp_path):
    with pytest.raises(JobError, match="int8 needs the version's calibration dataset"):
        OpenVinoBackend().compile(SOURCE, {"precision": "int8"}, tmp_path)


def test_it_refuses_calibration_samples_of_another_shape(tmp_path):
    calibration = tmp_path / "wrong.npz"
    np.savez(calibration, inputs=np.zeros((4, 3, 28, 28), dtype=np.float32))

    with pytest.raises(JobError, match=r"samples are \[4, 3, 28, 28\]"):
        OpenVinoBackend().compile(SOURCE, INT8, tmp_path, calibration=calibration)


def test_it_refuses_a_device_this_openvino_lacks(tmp_path):
    if "NPU" in openvino.Core().available_devices:
        pytest.skip("this machine has an NPU")

    with pytest.raises(JobError, match="has no NPU device"):
        OpenVinoBackend().compile(SOURCE, {"device": "NPU", "export_blob": False}, tmp_path)


def test_it_compiles_the_ir_when_another_openvino_built_the_blob(build, validation, tmp_path):
    built, backend = build({}), OpenVinoBackend()
    older = tmp_path / "engine.zip"
    with zipfile.ZipFile(built.artifact) as source, zipfile.ZipFile(older, "w") as out:
        for name in source.namelist():
            data = source.read(name)
            if name == "build.json":
                data = json.dumps(json.loads(data) | {"openvino": "2026.3.0-00000-old"})
            out.writestr(name, data)

    handle = backend.load(older, {})

    assert handle.source == "ir"
    assert "compiled by OpenVINO 2026.3.0-00000-old" in handle.reason
    inputs = validation[0][:16]
    [expected] = backend.infer(backend.load(built.artifact, {}), {"image": inputs})
    [got] = backend.infer(handle, {"image": inputs})
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_it_builds_only_the_ir_when_asked(build, tmp_path):
    built = OpenVinoBackend().compile(SOURCE, {"export_blob": False}, tmp_path)

    with zipfile.ZipFile(built.artifact) as archive:
        assert "model.blob" not in archive.namelist()
    handle = OpenVinoBackend().load(built.artifact, {"export_blob": False})
    assert (handle.source, handle.reason) == ("ir", "the engine has no compiled blob")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"precision": "fp16"}, r"precision 'fp16' is not one of \['fp32', 'bf16', 'int8'\]"),
        ({"performance_hint": "latency"}, "performance_hint 'latency' is not one of"),
        ({"inference_precision_hint": "bf16"}, "unknown keys"),
        ({"device": ""}, "device must be a plugin name"),
        ({"export_blob": "yes"}, "export_blob must be true or false"),
        ({"device": "GPU", "export_blob": True}, "export_blob is for the CPU plugin only"),
        ({"preset": "mixed"}, "apply to precision 'int8' only"),
        ({"precision": "int8", "calibration_samples": 0}, "calibration_samples must be"),
        ({"precision": "int8", "calibration_samples": True}, "calibration_samples must be"),
        ({"precision": "int8", "preset": "accuracy"}, "preset 'accuracy' is not one of"),
        ({"precision": "int8", "fast_bias_correction": 1}, "fast_bias_correction must be"),
    ],
)
def test_it_refuses_build_configs_it_cannot_build(config, message):
    with pytest.raises(JobError, match=message):
        OpenVinoBackend.check_config(config)


def test_it_accepts_the_documented_build_configs():
    for config in (
        None,
        {},
        {"device": "CPU", "precision": "bf16", "performance_hint": "THROUGHPUT"},
        {"device": "GPU"},
        {"precision": "int8", "calibration_samples": 300, "preset": "mixed"},
        {"precision": "int8", "fast_bias_correction": False, "export_blob": False},
    ):
        OpenVinoBackend.check_config(config)


def test_it_keys_the_default_build_on_the_cpu_because_it_exports_a_blob():
    fingerprint = {
        "cpu": {"flags": ["avx2", "avx512f", "avx512_bf16"]},
        "openvino": {"version": "2026.4.1-22982-e213a147257-releases/2026/4"},
    }

    assert OpenVinoBackend.compat_fields(fingerprint, {}) == {
        "openvino": "2026.4.1",
        "device": "CPU",
        "cpu_isa": "avx512",
        "bf16_hardware": True,
    }
    assert OpenVinoBackend.compat_fields(fingerprint, {"export_blob": False}) == {
        "openvino": "2026.4.1",
        "device": "CPU",
    }


def test_it_runs_here_where_openvino_is_installed():
    assert known.require("openvino") is OpenVinoBackend
    assert "openvino" in known.runnable()


def test_it_sends_no_telemetry_and_writes_nothing_home(tmp_path):
    code = (
        "import workers.backends.known, openvino, nncf\n"
        "from nncf.telemetry.wrapper import telemetry\n"
        f"openvino.convert_model({str(SOURCE)!r})\n"
        "print(type(telemetry).__name__)\n"
    )
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}

    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )

    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() != "NNCFTelemetry"
    assert list(home.iterdir()) == []


@pytest.mark.parametrize(("ir_version", "opset", "listed"), [(3, 9, "all"), (7, 13, "some")])
def test_it_builds_models_that_list_initializers_as_graph_inputs(
    tmp_path, ir_version, opset, listed
):
    source = tmp_path / "source.onnx"
    onnx.save(conv_model(ir_version, opset, listed), str(source))
    x = sample_input()
    backend = OpenVinoBackend()

    built = backend.compile(source, {}, tmp_path)
    loaded = backend.load(built.artifact, {})

    assert [value.get_any_name() for value in loaded.compiled.inputs] == ["x"]
    [expected] = onnxruntime.InferenceSession(str(source)).run(None, {"x": x})
    # The CPU plugin may compute in bf16 by itself where the CPU has it.
    np.testing.assert_allclose(backend.infer(loaded, {"x": x})[0], expected, atol=0.05, rtol=0.05)


def test_it_records_an_int8_build_that_quantised_nothing(build, tmp_path):
    source = tmp_path / "source.onnx"
    onnx.save(nothing_to_quantise_model(), str(source))
    calibration = calibration_npz(tmp_path / "calibration.npz")

    built = OpenVinoBackend().compile(source, INT8, tmp_path, calibration=calibration)

    assert built.graph_report["quantized_nodes"] == 0
    assert "nothing quantised: this int8 build runs in float, as the fp32 build does" in built.log
    assert build(INT8).graph_report["quantized_nodes"] > 0
    assert "nothing quantised" not in build(INT8).log


def test_its_frontend_builds_an_opset_6_model_though_preflight_asks_for_a_conversion(tmp_path):
    from onnx.reference import ReferenceEvaluator

    source = tmp_path / "source.onnx"
    model = old_opset_model()
    onnx.save(model, str(source))
    x = sample_input()
    backend = OpenVinoBackend()

    built = backend.compile(source, {}, tmp_path)
    [got] = backend.infer(backend.load(built.artifact, {}), {"x": x})

    assert OpenVinoBackend.min_opset == 7  # the source is measured in ONNX Runtime
    [expected] = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(got, expected, atol=0.1, rtol=0.05)
