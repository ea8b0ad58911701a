"""The ONNX Runtime backend: FP32 fusion, INT8 with calibration, FP16 for GPUs, graph reports."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from deployhub.registry.inspect import inspect_onnx
from tests.foreign_models import (
    calibration_npz,
    conv_model,
    nothing_to_quantise_model,
    sample_input,
)
from workers.backends import onnxruntime as ort_backend
from workers.backends.graph_report import histogram, onnx_graph_report
from workers.backends.onnxruntime import FP16_ON_CPU, OnnxRuntimeBackend
from workers.errors import JobError
from workers.fingerprint import cpu_flags_here

ASSETS = Path(__file__).resolve().parent.parent / "deployhub" / "demo" / "assets"
DEMO_MODEL = ASSETS / "digits_cnn_v2.onnx"  # Conv+BatchNormalization+Relu blocks
CALIBRATION = ASSETS / "calibration.npz"
VALIDATION = ASSETS / "validation.npz"
INT8 = {"precision": "int8"}


def build(tmp_path_factory, config, calibration=None, name="build"):
    workdir = tmp_path_factory.mktemp(name)
    return OnnxRuntimeBackend().compile(DEMO_MODEL, config, workdir, calibration=calibration)


@pytest.fixture(scope="module")
def fp32_build(tmp_path_factory):
    return build(tmp_path_factory, {"optimization_level": "all"}, name="fp32")


@pytest.fixture(scope="module")
def int8_build(tmp_path_factory):
    return build(tmp_path_factory, INT8, calibration=CALIBRATION, name="int8")


def top1(built, config):
    backend = OnnxRuntimeBackend()
    session = backend.load(built.artifact, config)
    with np.load(VALIDATION, allow_pickle=False) as data:
        images = data["inputs"]
    answers = [backend.infer(session, {"image": image[None]})[0] for image in images]
    return np.array([answer.argmax() for answer in answers])


def operators(path):
    return histogram(onnx.load(str(path)))["operators"]


def test_its_engines_pass_the_hubs_artifact_check_and_a_model_source_is_refused(
    fp32_build, int8_build, tmp_path
):
    assert OnnxRuntimeBackend.artifact_problem(fp32_build.artifact) == ""
    assert OnnxRuntimeBackend.artifact_problem(int8_build.artifact) == ""
    text = tmp_path / "engine.onnx"
    text.write_bytes(b"an optimised onnx model")
    assert "does not parse as an ONNX model" in OnnxRuntimeBackend.artifact_problem(text)


def test_it_folds_batch_norm_and_fuses_relu_into_the_convolutions_at_level_all(fp32_build):
    report = fp32_build.graph_report

    assert report["before"]["operators"]["BatchNormalization"] == 3
    assert report["before"]["nodes"] == 15
    assert "BatchNormalization" not in report["after"]["operators"]
    assert "Relu" not in report["after"]["operators"]
    assert report["after"]["nodes"] < report["before"]["nodes"]
    assert report["fused"][0] == f"nodes: 15 → {report['after']['nodes']}"
    assert any(
        line.startswith("3 Conv+BatchNormalization+Relu groups became 3 nodes")
        for line in report["fused"]
    )
    assert "graph optimisation level all" in fp32_build.log
    assert "graph: 3 Conv+BatchNormalization+Relu groups became 3 nodes" in fp32_build.log


def test_it_quantises_to_int8_and_keeps_the_fp32_answers(fp32_build, int8_build):
    ops = operators(int8_build.artifact)

    assert any(op.endswith("QLinearConv") for op in ops) or "DequantizeLinear" in ops
    assert any(line.startswith("3 Conv+BatchNormalization+Relu groups became 3 nodes")
               for line in int8_build.graph_report["fused"])  # fmt: skip
    agreement = np.mean(top1(int8_build, INT8) == top1(fp32_build, {}))
    assert agreement >= 0.95
    log = int8_build.log
    assert "quant_pre_process: shape inference and fusion before quantising: " in log
    assert "calibration: 100 samples of image" in log
    assert "quantising to int8 (qdq, per channel, activations uint8, weights int8, minmax" in log


def test_it_builds_int8_without_preprocessing_and_says_what_stayed_unfused(tmp_path_factory):
    config = INT8 | {"preprocess": False, "calibration_samples": 20}

    built = build(tmp_path_factory, config, calibration=CALIBRATION, name="int8-raw")

    assert built.artifact.is_file()
    assert "quant_pre_process skipped" in built.log
    assert "calibration: 20 samples of image" in built.log
    assert any("BatchNormalization nodes were not folded" in line
               for line in built.graph_report["fused"])  # fmt: skip


def test_it_builds_int8_with_other_calibration_settings(tmp_path_factory):
    config = INT8 | {
        "calibration_method": "percentile",
        "activation_type": "int8",
        "per_channel": False,
        "calibration_samples": 10,
    }

    built = build(tmp_path_factory, config, calibration=CALIBRATION, name="int8-percentile")

    assert "per tensor, activations int8, weights int8, percentile calibration" in built.log
    assert top1(built, config).shape == (300,)


def test_it_refuses_int8_without_calibration_data(tmp_path):
    with pytest.raises(JobError, match="int8 needs the version's calibration dataset: attach one"):
        OnnxRuntimeBackend().compile(DEMO_MODEL, INT8, tmp_path)


def test_it_refuses_calibration_data_without_inputs(tmp_path):
    junk = tmp_path / "junk.npz"
    np.savez(junk, labels=np.zeros(3))

    with pytest.raises(JobError, match="not an .npz with 'inputs'"):
        OnnxRuntimeBackend().compile(DEMO_MODEL, INT8, tmp_path, calibration=junk)


def test_it_refuses_fp16_on_the_cpu_and_says_why():
    with pytest.raises(JobError) as raised:
        OnnxRuntimeBackend.check_config({"precision": "fp16"})

    assert str(raised.value) == FP16_ON_CPU
    OnnxRuntimeBackend.check_config({"precision": "fp16", "provider": "CUDAExecutionProvider"})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"precision": "int4"}, "precision 'int4' is not one of"),
        (INT8 | {"activation_type": "int16"}, "activation_type 'int16' is not one of"),
        (INT8 | {"calibration_method": "kl"}, "calibration_method 'kl' is not one of"),
        (INT8 | {"quant_format": "qop"}, "quant_format 'qop' is not one of"),
        (INT8 | {"per_channel": "yes"}, "per_channel must be true or false"),
        (INT8 | {"calibration_samples": 0}, "calibration_samples must be a whole number"),
        ({"per_channel": True}, r"\['per_channel'\] apply to precision int8 only"),
    ],
)
def test_it_refuses_precision_settings_it_cannot_build(config, message):
    with pytest.raises(JobError, match=message):
        OnnxRuntimeBackend.check_config(config)


def test_it_accepts_every_int8_setting_spelled_out():
    OnnxRuntimeBackend.check_config(
        INT8
        | {
            "quant_format": "qdq",
            "per_channel": True,
            "activation_type": "uint8",
            "weight_type": "int8",
            "calibration_method": "entropy",
            "preprocess": True,
            "calibration_samples": 100,
        }
    )


@pytest.mark.skipif(
    "CUDAExecutionProvider" not in onnxruntime.get_available_providers(),
    reason="fp16 builds need a GPU provider",
)
def test_it_converts_to_fp16_for_a_gpu_provider(tmp_path):
    config = {"precision": "fp16", "provider": "CUDAExecutionProvider"}

    built = OnnxRuntimeBackend().compile(DEMO_MODEL, config, tmp_path)

    assert "converting to fp16" in built.log
    assert top1(built, config).shape == (300,)


def test_it_converts_weights_to_fp16_and_keeps_float32_inputs_and_outputs(tmp_path):
    stages = ort_backend._Build(DEMO_MODEL, tmp_path, progress=lambda *report: None)

    converted = onnx.load(str(ort_backend._convert_fp16(stages)))

    assert {tensor.data_type for tensor in converted.graph.initializer} == {TensorProto.FLOAT16}
    io = [*converted.graph.input, *converted.graph.output]
    assert {value.type.tensor_type.elem_type for value in io} == {TensorProto.FLOAT}
    assert "converting to fp16 (inputs and outputs stay float32): " in stages.log()


def conv_bn_relu_in_a_branch(path):
    """Write a model whose If branch holds a Conv+BatchNormalization+Relu chain."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2, 1, 1, 1], [1.0, 2.0])
    norm = [helper.make_tensor(n, TensorProto.FLOAT, [2], [1.0, 1.0]) for n in "sbmv"]
    branch = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
            helper.make_node("Relu", ["n"], ["r"]),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)],
        initializer=[weight, *norm],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["i"])],
        "else",
        [],
        [helper.make_tensor_value_info("i", TensorProto.FLOAT, None)],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=other)],
        "branchy",
        [
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_it_counts_nodes_and_groups_inside_subgraphs(tmp_path):
    source = conv_bn_relu_in_a_branch(tmp_path / "branchy.onnx")

    report = onnx_graph_report(source, source)

    assert report["before"]["nodes"] == 5
    assert report["before"]["operators"] == {
        "BatchNormalization": 1,
        "Conv": 1,
        "Identity": 1,
        "If": 1,
        "Relu": 1,
    }
    assert report["fused"][:2] == [
        "nodes: 5 → 5",
        "1 BatchNormalization nodes were not folded into their Conv "
        "(1 Conv+BatchNormalization groups before)",
    ]


def folder(tmp_path, name):
    """Return a new folder in tmp_path."""
    path = tmp_path / name
    path.mkdir()
    return path


def source_outputs(path, x):
    """Return what ONNX Runtime computes from a source file, optimisations off."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


@pytest.mark.parametrize("level", ["disabled", "basic", "extended", "all"])
@pytest.mark.parametrize(
    ("ir_version", "opset", "listed", "made_constant"),
    [(3, 9, "all", "IR 3: 10 initializers"), (7, 13, "some", "IR 7: 4 initializers")],
)
def test_it_builds_models_that_list_initializers_as_inputs_at_every_level(
    tmp_path, level, ir_version, opset, listed, made_constant
):
    source = tmp_path / "source.onnx"
    onnx.save(conv_model(ir_version, opset, listed), str(source))
    config = {"optimization_level": level}
    x = sample_input()

    built = OnnxRuntimeBackend().compile(source, config, folder(tmp_path, "build"))
    backend = OnnxRuntimeBackend()
    outputs = backend.infer(backend.load(built.artifact, config), {"x": x})

    np.testing.assert_allclose(outputs[0], source_outputs(source, x)[0], rtol=1e-4, atol=1e-4)
    assert f"{made_constant} listed as graph inputs were made constants" in built.log
    assert [value.name for value in onnx.load(str(built.artifact)).graph.input] == ["x"]


def test_it_leaves_the_graph_inputs_of_a_model_without_listed_initializers(tmp_path):
    source = tmp_path / "source.onnx"
    onnx.save(conv_model(8, 17, "none"), str(source))

    built = OnnxRuntimeBackend().compile(source, {}, folder(tmp_path, "build"))

    assert "made constants" not in built.log
    assert not list(tmp_path.glob("**/*.constants.onnx"))


def test_it_makes_listed_initializers_constants_and_keeps_external_data_in_place(tmp_path):
    upload = folder(tmp_path, "upload")
    source = upload / "source.onnx"
    onnx.save(
        conv_model(3, 9, "all"),
        str(source),
        save_as_external_data=True,
        location="source.onnx.data",
    )
    x = sample_input()

    built = OnnxRuntimeBackend().compile(source, {}, folder(tmp_path, "build"))
    backend = OnnxRuntimeBackend()
    outputs = backend.infer(backend.load(built.artifact, {}), {"x": x})

    assert built.artifact.name == "engine.zip"
    np.testing.assert_allclose(outputs[0], source_outputs(source, x)[0], rtol=1e-4, atol=1e-4)
    assert sorted(path.name for path in upload.iterdir()) == [
        "source.constants.onnx",
        "source.onnx",
        "source.onnx.data",
    ]


def test_it_signs_up_only_the_true_inputs_of_a_model_that_lists_initializers(tmp_path):
    source = tmp_path / "source.onnx"
    onnx.save(conv_model(3, 9, "all"), str(source))

    info = inspect_onnx(source)

    assert [value["name"] for value in info["inputs"]] == ["x"]
    assert info["ir_version"] == 3


def test_it_records_an_int8_build_that_quantised_nothing(tmp_path):
    source = tmp_path / "source.onnx"
    onnx.save(nothing_to_quantise_model(), str(source))
    calibration = calibration_npz(tmp_path / "calibration.npz")

    built = OnnxRuntimeBackend().compile(
        source, INT8, folder(tmp_path, "int8"), calibration=calibration
    )
    fp32 = OnnxRuntimeBackend().compile(source, {}, folder(tmp_path, "fp32"))

    assert built.graph_report["quantized_nodes"] == 0
    assert "nothing quantised: this int8 build runs in float, as the fp32 build does" in built.log
    assert "quantized_nodes" not in fp32.graph_report


def test_it_counts_the_quantised_nodes_of_an_int8_build(int8_build):
    assert int8_build.graph_report["quantized_nodes"] > 0
    assert "nothing quantised" not in int8_build.log


@pytest.mark.parametrize(("ir_version", "opset", "listed"), [(3, 9, "all"), (7, 11, "none")])
def test_it_quantises_a_model_older_than_opset_13_to_int8(tmp_path, ir_version, opset, listed):
    source = tmp_path / "source.onnx"
    onnx.save(conv_model(ir_version, opset, listed), str(source))
    calibration = calibration_npz(tmp_path / "calibration.npz", count=16)
    x = sample_input()

    built = OnnxRuntimeBackend().compile(
        source, INT8, folder(tmp_path, "int8"), calibration=calibration
    )
    backend = OnnxRuntimeBackend()
    [got] = backend.infer(backend.load(built.artifact, INT8), {"x": x})

    [expected] = source_outputs(source, x)
    assert np.abs(got - expected).max() < 0.1 * np.abs(expected).max()
    assert built.graph_report["quantized_nodes"] > 0
    assert f"int8: opset {opset} converted to 13 with onnx.version_converter" in built.log


@pytest.mark.parametrize(
    ("config", "machine", "flags", "saturates"),
    [
        ({}, "x86_64", ["avx2", "fma"], True),  # AMD EPYC (Zen 2/3): no VNNI
        ({}, "x86_64", ["avx2", "avx512f", "avx512_vnni"], False),
        ({}, "x86_64", ["avx2", "avx_vnni"], False),
        ({"activation_type": "uint8", "weight_type": "uint8"}, "x86_64", ["avx2"], False),
        ({"activation_type": "int8"}, "x86_64", ["avx2"], False),
        ({}, "aarch64", [], False),
        ({}, "x86_64", None, False),  # flags unknown: ONNX Runtime's own default
    ],
)
def test_it_quantises_weights_to_7_bits_only_where_u8s8_kernels_saturate(
    config, machine, flags, saturates
):
    assert ort_backend.u8s8_saturates(config, machine, flags) is saturates


def test_an_int8_build_says_when_it_reduced_the_weight_range_on_this_cpu(tmp_path):
    source = tmp_path / "source.onnx"
    onnx.save(conv_model(7, 13, "none"), str(source))
    calibration = calibration_npz(tmp_path / "calibration.npz", count=16)
    here = ort_backend.u8s8_saturates({}, ort_backend.platform.machine(), cpu_flags_here())

    built = OnnxRuntimeBackend().compile(
        source, INT8, folder(tmp_path, "int8"), calibration=calibration
    )

    assert ("weights are quantised to 7 bits" in built.log) is here
