"""The conformance corpus: ONNX files written the way other tools write them, made at test time.

Each `CorpusModel` writes one upload (an `.onnx`, or a `.zip` of a model and its
external data) into a folder, says which features it exercises, gives the
input-shape contract a user would upload with it (None: the proposed default),
names the task the hub must propose for it (and params its team then declares),
makes per-input samples for its calibration and validation datasets, and names
the outcome the conformance test expects:

- "recommended": auto mode recommends a build that reproduces the source
  within the class's tolerance;
- "refused at preflight: <reason>": every build of the grid is ruled out
  before anything is queued, with that reason.

Nothing is downloaded: weights are random (seeded per model), built with
onnx.helper/numpy, or exported with torch.onnx from small ResNet/MobileNet/
transformer blocks written in plain torch.nn (torchvision is not installed).
The torch entries say so when torch is absent. The detectors' class scores are
made trained-like (a few boxes an image above 0.25, the rest far below), not
random. Validation labels are the source model's own answers (ONNX Runtime on the
CPU) in its task's format: a classifier's top-1, a detector's detections, a
segmenter's argmax masks, a recogniser's greedy CTC strings (an embedder has
none), so the reference scores 100% (mAP 1, CER 0) and a build's drop is its
disagreement with the source.
"""

import io
import logging
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT
CALIBRATION_SAMPLES = 16
VALIDATION_SAMPLES = 32
CLASSES = 10
BIG_TABLE_ROWS = 25_600  # x 1024 float32 = 104.9 MB of external data
RECOMMENDED = "recommended"
REFUSED = "refused at preflight: "


@dataclass(frozen=True)
class Input:
    """One model input as a dataset holds it: dtype and per-sample shape (() for a scalar)."""

    name: str
    dtype: str
    shape: tuple
    low: int = 0  # integer inputs draw from [low, high)
    high: int = 2
    batched: bool = True  # False: the input has no batch axis (a scalar per sample)


@dataclass(frozen=True)
class CorpusModel:
    """One model of the corpus: how to write it, feed it, and what auto mode must make of it."""

    name: str
    features: tuple
    ir: int
    opset: int
    write: object  # write(folder) -> Path of the upload
    inputs: tuple
    expect: str = RECOMMENDED
    contract: dict | None = None
    batch: int = 1  # the batch the source runs at (a fixed batch other than 1)
    needs_torch: bool = False
    notes: str = field(default="", compare=False)
    # The task the upload must be proposed as, and params its team then declares (a
    # recogniser's charset; None: the proposal stands as it is).
    task: str = "classification"
    task_params: dict | None = field(default=None, compare=False)

    def samples(self, count, seed):
        """Return {input name: array of `count` samples} for the model's inputs."""
        rng = np.random.default_rng(seed)
        return {spec.name: _sample(rng, spec, count) for spec in self.inputs}


def _sample(rng, spec, count):
    shape = (count, *spec.shape)
    if spec.dtype == "bool":
        return rng.random(shape) < 0.7
    if spec.dtype in ("int64", "int32", "uint8"):
        return rng.integers(spec.low, spec.high, size=shape).astype(spec.dtype)
    return rng.normal(size=shape).astype(spec.dtype)


# Writing ONNX files -------------------------------------------------------------------------


def _rng(name):
    return np.random.default_rng(sum(map(ord, name)))


def _weights(rng, name, shape, scale=0.3):
    return numpy_helper.from_array((rng.normal(size=shape) * scale).astype(np.float32), name)


def _model(graph, opset, ir, check=True):
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="conformance"
    )
    model.ir_version = ir
    if check:
        onnx.checker.check_model(model, full_check=True)
    return model


def _save(model, folder, name):
    path = Path(folder) / f"{name}.onnx"
    onnx.save_model(model, str(path))
    return path


def _conv_head(rng, source, channels=3, width=8, groups=1, prefix=""):
    """Return (nodes, initializers) for Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm."""
    p = prefix
    nodes = [
        helper.make_node(
            "Conv",
            [source, f"{p}conv_w", f"{p}conv_b"],
            [f"{p}conv"],
            pads=[1, 1, 1, 1],
            group=groups,
        ),
        helper.make_node("Relu", [f"{p}conv"], [f"{p}relu"]),
        helper.make_node("GlobalAveragePool", [f"{p}relu"], [f"{p}pool"]),
        helper.make_node("Flatten", [f"{p}pool"], [f"{p}flat"]),
        helper.make_node("Gemm", [f"{p}flat", f"{p}fc_w", f"{p}fc_b"], ["logits"], transB=1),
    ]
    inits = [
        _weights(rng, f"{p}conv_w", (width, channels // groups, 3, 3)),
        _weights(rng, f"{p}conv_b", (width,), 0.1),
        _weights(rng, f"{p}fc_w", (CLASSES, width), 1.0),
        _weights(rng, f"{p}fc_b", (CLASSES,), 0.1),
    ]
    return nodes, inits


def _image(name="image", shape=("N", 3, 16, 16), elem=FLOAT):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _logits(batch="N", classes=CLASSES):
    return helper.make_tensor_value_info("logits", FLOAT, [batch, classes])


def _as_inputs(inits):
    """Return graph inputs for initializers: how IR < 4 files list their weights."""
    return [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]


def write_ir3_initializers_as_inputs(folder):
    rng = _rng("ir3")
    nodes, inits = _conv_head(rng, "image")
    graph = helper.make_graph(
        nodes, "ir3", [_image(), *_as_inputs(inits)], [_logits()], initializer=inits
    )
    return _save(_model(graph, 8, 3), folder, "ir3_initializers_as_inputs")


def write_old_opset6_batchnorm_add(folder):
    """Conv -> BatchNormalization(6) -> Add(6, broadcast) -> ... at opset 6, IR 3."""
    rng = _rng("opset6")
    nodes, inits = _conv_head(rng, "shifted")
    nodes[0] = helper.make_node("Conv", ["image", "conv_w", "conv_b"], ["conv0"], pads=[1] * 4)
    nodes[4] = helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1, broadcast=1)
    extra = [
        helper.make_node(
            "BatchNormalization", ["conv0", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], is_test=1
        ),
        helper.make_node("Add", ["bn", "shift"], ["shifted"], broadcast=1, axis=1),
        helper.make_node("Conv", ["shifted", "conv2_w", "conv_b"], ["conv"], pads=[1] * 4),
    ]
    nodes = [nodes[0], *extra, *nodes[1:]]
    inits += [
        numpy_helper.from_array(1 + rng.random(8).astype(np.float32) * 0.2, "bn_s"),
        _weights(rng, "bn_b", (8,), 0.1),
        _weights(rng, "bn_m", (8,), 0.1),
        numpy_helper.from_array(1 + rng.random(8).astype(np.float32), "bn_v"),
        _weights(rng, "shift", (8,), 0.1),
        _weights(rng, "conv2_w", (8, 8, 3, 3), 0.2),
    ]
    image = _image(shape=(1, 3, 16, 16))  # old exporters fixed the batch at 1
    graph = helper.make_graph(
        nodes, "opset6", [image, *_as_inputs(inits)], [_logits(1)], initializer=inits
    )
    return _save(_model(graph, 6, 3), folder, "old_opset6_batchnorm_add")


def modernised_opset6(model):
    """Return the bytes of an opset-13 twin of an opset-6 model, to run the reference on.

    ONNX Runtime has no opset-6 kernels, and onnx.version_converter turns an
    `Add(broadcast=1, axis=1)` of a [C] bias into an Unsqueeze to [C, 1, 1, 1], which
    broadcasts the batch to C; the twin is written by hand: the bias reshaped to [C, 1, 1]
    and the attributes opset 7 dropped (broadcast, axis, is_test) removed.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    weights = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Add" and any(a.name == "broadcast" for a in node.attribute):
            bias = weights[node.input[1]]
            bias.CopyFrom(
                numpy_helper.from_array(numpy_helper.to_array(bias).reshape(-1, 1, 1), bias.name)
            )
        kept = [a for a in node.attribute if a.name not in ("broadcast", "axis", "is_test")]
        del node.attribute[:]
        node.attribute.extend(kept)
    initialised = set(weights)
    kept_inputs = [i for i in model.graph.input if i.name not in initialised]
    del model.graph.input[:]
    model.graph.input.extend(kept_inputs)
    model.opset_import[0].version, model.ir_version = 13, 7
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def write_ir3_opset7_maxpool(folder):
    rng = _rng("ir3-opset7")
    nodes, inits = _conv_head(rng, "image")
    nodes.insert(
        2, helper.make_node("MaxPool", ["relu"], ["pooled"], kernel_shape=[2, 2], strides=[2, 2])
    )
    nodes[3] = helper.make_node("GlobalAveragePool", ["pooled"], ["pool"])
    graph = helper.make_graph(
        nodes, "ir3-opset7", [_image(), *_as_inputs(inits)], [_logits()], initializer=inits
    )
    return _save(_model(graph, 7, 3), folder, "ir3_opset7_maxpool")


def write_mlp_ir4_opset9(folder):
    rng = _rng("mlp")
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"], transB=1),
    ]
    inits = [
        _weights(rng, "w1", (32, 64), 0.2),
        _weights(rng, "b1", (32,), 0.1),
        _weights(rng, "w2", (CLASSES, 32), 0.5),
        _weights(rng, "b2", (CLASSES,), 0.1),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", FLOAT, ["N", 64])], [_logits()], inits
    )
    return _save(_model(graph, 9, 4), folder, "mlp_ir4_opset9")


def write_conv_ir5_opset10(folder):
    rng = _rng("conv10")
    nodes, inits = _conv_head(rng, "image")
    graph = helper.make_graph(nodes, "conv10", [_image()], [_logits()], initializer=inits)
    return _save(_model(graph, 10, 5), folder, "conv_ir5_opset10")


def write_depthwise_ir6_opset11(folder):
    """A MobileNet-style block: pointwise 3->16, depthwise 3x3 (group 16), pointwise 16->8."""
    rng = _rng("depthwise")
    nodes, inits = _conv_head(rng, "dw_relu", channels=16)
    nodes = [
        helper.make_node("Conv", ["image", "pw_w"], ["pw"]),
        helper.make_node("Clip", ["pw", "zero", "six"], ["pw_relu6"]),
        helper.make_node("Conv", ["pw_relu6", "dw_w"], ["dw"], pads=[1] * 4, group=16),
        helper.make_node("Relu", ["dw"], ["dw_relu"]),
        *nodes,
    ]
    inits += [
        _weights(rng, "pw_w", (16, 3, 1, 1), 0.5),
        _weights(rng, "dw_w", (16, 1, 3, 3), 0.5),
        numpy_helper.from_array(np.array(0, np.float32), "zero"),
        numpy_helper.from_array(np.array(6, np.float32), "six"),
    ]
    graph = helper.make_graph(nodes, "depthwise", [_image()], [_logits()], initializer=inits)
    return _save(_model(graph, 11, 6), folder, "depthwise_ir6_opset11")


def write_resnet_block_ir7_opset12(folder):
    rng = _rng("resblock")
    nodes, inits = _conv_head(rng, "block")
    block = [
        helper.make_node("Conv", ["image", "stem_w"], ["stem"], pads=[1] * 4),
        helper.make_node("Relu", ["stem"], ["stem_r"]),
        helper.make_node("Conv", ["stem_r", "c1_w"], ["c1"], pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["c1_r"]),
        helper.make_node("Conv", ["c1_r", "c2_w"], ["c2"], pads=[1] * 4),
        helper.make_node("Add", ["c2", "stem_r"], ["sum"]),
        helper.make_node("Relu", ["sum"], ["block"]),
    ]
    inits[0] = _weights(rng, "conv_w", (8, 8, 3, 3), 0.2)
    inits += [
        _weights(rng, n, s, 0.2)
        for n, s in (
            ("stem_w", (8, 3, 3, 3)),
            ("c1_w", (8, 8, 3, 3)),
            ("c2_w", (8, 8, 3, 3)),
        )
    ]
    graph = helper.make_graph(block + nodes, "resblock", [_image()], [_logits()], inits)
    return _save(_model(graph, 12, 7), folder, "resnet_block_ir7_opset12")


def write_constant_node_weights(folder):
    """Weights made by Constant nodes and a bias by ConstantOfShape, no initializers at all."""
    rng = _rng("constants")
    nodes, inits = _conv_head(rng, "image")
    constants = [
        helper.make_node("Constant", [], [t.name], value=t) for t in inits if t.name != "fc_b"
    ]
    constants += [
        helper.make_node(
            "Constant",
            [],
            ["fc_b_shape"],
            value=numpy_helper.from_array(np.array([CLASSES], np.int64)),
        ),
        helper.make_node(
            "ConstantOfShape",
            ["fc_b_shape"],
            ["fc_b"],
            value=numpy_helper.from_array(np.array([0.1], np.float32)),
        ),
    ]
    graph = helper.make_graph(constants + nodes, "constants", [_image()], [_logits()])
    return _save(_model(graph, 12, 7), folder, "constant_node_weights")


def write_multi_input_output(folder):
    """image x mask -> conv head: two inputs, two outputs (logits, pooled features)."""
    rng = _rng("multi")
    nodes, inits = _conv_head(rng, "masked")
    nodes.insert(0, helper.make_node("Mul", ["image", "mask"], ["masked"]))
    nodes.append(helper.make_node("Identity", ["flat"], ["features"]))
    graph = helper.make_graph(
        nodes,
        "multi",
        [_image(), _image("mask", ("N", 1, 16, 16))],
        [_logits(), helper.make_tensor_value_info("features", FLOAT, ["N", 8])],
        initializer=inits,
    )
    return _save(_model(graph, 14, 8), folder, "multi_input_output")


def write_int64_tokens(folder):
    """Token ids (int64) -> embedding Gather -> mean over tokens -> linear classifier."""
    rng = _rng("tokens")
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["embedded"]),
        helper.make_node("ReduceMean", ["embedded"], ["mean"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["mean", "w"], ["scores"]),
        helper.make_node("Add", ["scores", "b"], ["logits"]),
    ]
    inits = [
        _weights(rng, "embedding", (100, 16), 1.0),
        _weights(rng, "w", (16, CLASSES), 1.0),
        _weights(rng, "b", (CLASSES,), 0.1),
    ]
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N", 8])
    graph = helper.make_graph(nodes, "tokens", [ids], [_logits()], initializer=inits)
    return _save(_model(graph, 15, 8), folder, "int64_tokens")


def write_bool_mask(folder):
    """Features with a bool keep-mask (Where) -> linear classifier, at opset 19 (IR 9)."""
    rng = _rng("bool")
    nodes = [
        helper.make_node("Where", ["keep", "features", "zero"], ["kept"]),
        helper.make_node("MatMul", ["kept", "w"], ["scores"]),
        helper.make_node("Add", ["scores", "b"], ["logits"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, np.float32), "zero"),
        _weights(rng, "w", (16, CLASSES), 1.0),
        _weights(rng, "b", (CLASSES,), 0.1),
    ]
    graph = helper.make_graph(
        nodes,
        "bool",
        [
            helper.make_tensor_value_info("features", FLOAT, ["N", 16]),
            helper.make_tensor_value_info("keep", TensorProto.BOOL, ["N", 16]),
        ],
        [_logits()],
        initializer=inits,
    )
    return _save(_model(graph, 19, 9), folder, "bool_mask")


def write_uint8_nhwc(folder):
    """Raw uint8 NHWC pixels -> Cast, scale, Transpose to NCHW -> conv head."""
    rng = _rng("uint8")
    nodes, inits = _conv_head(rng, "nchw")
    nodes = [
        helper.make_node("Cast", ["pixels"], ["as_float"], to=FLOAT),
        helper.make_node("Mul", ["as_float", "scale"], ["scaled"]),
        helper.make_node("Transpose", ["scaled"], ["nchw"], perm=[0, 3, 1, 2]),
        *nodes,
    ]
    inits.append(numpy_helper.from_array(np.array(1 / 255, np.float32), "scale"))
    pixels = _image("pixels", ("N", 16, 16, 3), TensorProto.UINT8)
    graph = helper.make_graph(nodes, "uint8", [pixels], [_logits()], initializer=inits)
    return _save(_model(graph, 13, 7), folder, "uint8_nhwc")


def write_float16_input(folder):
    rng = _rng("float16")
    nodes, inits = _conv_head(rng, "as_float")
    nodes.insert(0, helper.make_node("Cast", ["image"], ["as_float"], to=FLOAT))
    image = _image(elem=TensorProto.FLOAT16)
    graph = helper.make_graph(nodes, "float16", [image], [_logits()], initializer=inits)
    return _save(_model(graph, 17, 8), folder, "float16_input")


def write_fixed_batch_2(folder):
    rng = _rng("batch2")
    nodes, inits = _conv_head(rng, "image")
    graph = helper.make_graph(
        nodes, "batch2", [_image(shape=(2, 3, 16, 16))], [_logits(2)], initializer=inits
    )
    return _save(_model(graph, 13, 7), folder, "fixed_batch_2")


def write_scalar_input(folder):
    """An image and a scalar temperature (no batch axis): logits = head(image) * temperature."""
    rng = _rng("scalar")
    nodes, inits = _conv_head(rng, "image")
    nodes[-1].output[0] = "raw"
    nodes.append(helper.make_node("Mul", ["raw", "temperature"], ["logits"]))
    temperature = helper.make_tensor_value_info("temperature", FLOAT, [])
    graph = helper.make_graph(
        nodes, "scalar", [_image(), temperature], [_logits()], initializer=inits
    )
    return _save(_model(graph, 16, 8), folder, "scalar_input")


def write_dynamic_hw(folder):
    rng = _rng("dynamic")
    nodes, inits = _conv_head(rng, "image")
    graph = helper.make_graph(
        nodes, "dynamic", [_image(shape=("N", 3, "H", "W"))], [_logits()], initializer=inits
    )
    return _save(_model(graph, 18, 8), folder, "dynamic_hw")


DYNAMIC_HW_CONTRACT = {
    "inputs": {
        "image": {
            "shape": ["batch", 3, "H", "W"],
            "batch": {"sizes": [1]},
            "dynamic": {
                "2": {"min": 16, "opt": 32, "max": 64},
                "3": {"min": 16, "opt": 32, "max": 64},
            },
        }
    }
}


def _zip_with_external_data(model, folder, name, stored=False):
    """Write `name.zip` holding model.onnx and its weights in weights.bin (the upload format)."""
    work = Path(folder) / f"{name}-files"
    work.mkdir()
    onnx.save_model(
        model,
        str(work / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=256,  # small tensors (Slice's starts) stay inline, as exporters do
    )
    path = Path(folder) / f"{name}.zip"
    method = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w", method) as archive:
        for member in ("model.onnx", "weights.bin"):
            archive.write(work / member, member)
            (work / member).unlink()
    work.rmdir()
    return path


def write_external_data_zip(folder):
    rng = _rng("external")
    nodes, inits = _conv_head(rng, "image", width=16)
    graph = helper.make_graph(nodes, "external", [_image()], [_logits()], initializer=inits)
    return _zip_with_external_data(_model(graph, 13, 8), folder, "external_data")


def write_big_external_table(folder):
    """Over 100 MB of external data, tiny compute: ids -> Gather from a huge table -> mean."""
    rng = _rng("big")
    table = rng.standard_normal((BIG_TABLE_ROWS, 1024), dtype=np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"]),
        helper.make_node("ReduceMean", ["rows"], ["mean"], axes=[1], keepdims=0),
        helper.make_node("Slice", ["mean", "starts", "ends", "axes"], ["logits"]),
    ]
    inits = [
        numpy_helper.from_array(table, "table"),
        numpy_helper.from_array(np.array([0], np.int64), "starts"),
        numpy_helper.from_array(np.array([CLASSES], np.int64), "ends"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
    ]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4])
    graph = helper.make_graph(nodes, "big", [ids], [_logits()], initializer=inits)
    # The checker refuses an in-memory proto over 2 GB only; this one is ~105 MB.
    return _zip_with_external_data(_model(graph, 13, 8), folder, "big_external_table", stored=True)


def write_nothing_to_quantise(folder):
    """Log-softmax written out (Exp, ReduceSum, Log, Sub): no Conv/MatMul/Gemm to quantise."""
    nodes = [
        helper.make_node("Exp", ["scores"], ["exp"]),
        helper.make_node("ReduceSum", ["exp", "axes"], ["total"], keepdims=1),
        helper.make_node("Log", ["total"], ["log_total"]),
        helper.make_node("Sub", ["scores", "log_total"], ["logits"]),
    ]
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    scores = helper.make_tensor_value_info("scores", FLOAT, ["N", CLASSES])
    graph = helper.make_graph(nodes, "nothing", [scores], [_logits()], initializer=[axes])
    return _save(_model(graph, 17, 8), folder, "nothing_to_quantise")


def _transformer_graph(rng, tokens=8, width=16):
    """x [N, tokens, width] -> LayerNorm -> single-head attention (MatMul/Softmax) -> classifier."""
    nodes = [
        helper.make_node("LayerNormalization", ["x", "ln_s", "ln_b"], ["norm"], axis=-1),
        *[helper.make_node("MatMul", ["norm", f"w{k}"], [k]) for k in "qkv"],
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "temp"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["attention"], axis=-1),
        helper.make_node("MatMul", ["attention", "v"], ["mixed"]),
        helper.make_node("Add", ["mixed", "x"], ["residual"]),
        helper.make_node("ReduceMean", ["residual", "axes"], ["pooled"], keepdims=0),
        helper.make_node("MatMul", ["pooled", "head"], ["logits"]),
    ]
    inits = [
        numpy_helper.from_array(np.ones(width, np.float32), "ln_s"),
        numpy_helper.from_array(np.zeros(width, np.float32), "ln_b"),
        *[_weights(rng, f"w{k}", (width, width), 0.3) for k in "qkv"],
        numpy_helper.from_array(np.array(width**-0.5, np.float32), "temp"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
        _weights(rng, "head", (width, CLASSES), 1.0),
    ]
    x = helper.make_tensor_value_info("x", FLOAT, ["N", tokens, width])
    return helper.make_graph(nodes, "transformer", [x], [_logits()], initializer=inits)


def write_transformer_block(folder):
    return _save(_model(_transformer_graph(_rng("transformer")), 18, 8), folder, "transformer")


def write_gelu_mlp_opset20(folder):
    rng = _rng("gelu")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Gelu", ["h"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["logits"]),
    ]
    inits = [_weights(rng, "w1", (32, 64), 0.3), _weights(rng, "w2", (64, CLASSES), 0.5)]
    x = helper.make_tensor_value_info("x", FLOAT, ["N", 32])
    graph = helper.make_graph(nodes, "gelu", [x], [_logits()], initializer=inits)
    return _save(_model(graph, 20, 9), folder, "gelu_mlp_opset20")


def write_conv_ir10_opset21(folder):
    rng = _rng("conv21")
    nodes, inits = _conv_head(rng, "image", width=16)
    graph = helper.make_graph(nodes, "conv21", [_image()], [_logits()], initializer=inits)
    return _save(_model(graph, 21, 10), folder, "conv_ir10_opset21")


# Models of other tasks, written as their exporters write them (random weights) ---------------

DETECTOR_CLASSES = 4


class DetectorShape(NamedTuple):
    """A detector's input size and levels: (stride, anchor size in pixels) each."""

    size: int
    levels: tuple

    @property
    def anchors(self):
        return sum((self.size // stride) ** 2 for stride, _ in self.levels)


# The corpus's detectors: 16x16 + 8x8 = 320 anchors at 32x32.
DETECTOR = DetectorShape(32, ((2, 8), (4, 16)))
# Trained-like scores: a trained detector is sure of most anchors. Class logits are
# SCORE_GAIN * (z - Z_THRESHOLD) plus a little of the features, where z ~ N(0, 1) is a
# projection of the input pixels under the anchor: a few anchors an image pass a 0.25
# score, the others sit far below it (not thousands of 0.5-score boxes).
SCORE_GAIN, Z_THRESHOLD = 8.0, 2.8
NMS_KEEP = 100  # rows of the in-graph NMS outputs (EfficientNMS's keepTopK), zero-padded
SEGMENTER_CLASSES = 5
CHARSET = "-0123456789abcdef"  # a CTC token t is CHARSET[t]; token 0 is the blank
EMBEDDING_SIZE = 32


def _const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _conv_silu(rng, source, out, channels, width, stride=1):
    """Return (nodes, inits) of a 3x3 Conv then SiLU written as torch exports it (x * sigmoid)."""
    nodes = [
        helper.make_node(
            "Conv",
            [source, f"{out}_w", f"{out}_b"],
            [f"{out}_conv"],
            pads=[1] * 4,
            strides=[stride] * 2,
        ),
        helper.make_node("Sigmoid", [f"{out}_conv"], [f"{out}_gate"]),
        helper.make_node("Mul", [f"{out}_conv", f"{out}_gate"], [out]),
    ]
    inits = [
        _weights(rng, f"{out}_w", (width, channels, 3, 3), (2 / (9 * channels)) ** 0.5),
        _weights(rng, f"{out}_b", (width,), 0.1),
    ]
    return nodes, inits


def _anchor_grid(size, stride):
    """Return [1, 2, A] of each anchor's (x, y) cell corner offset in pixels, row by row."""
    cells = size // stride
    ys, xs = np.meshgrid(np.arange(cells), np.arange(cells), indexing="ij")
    grid = np.stack([xs.reshape(-1), ys.reshape(-1)])[None].astype(np.float32)
    return (grid - 0.5) * stride


def _detector_level(rng, level, feature, width, shape):
    """Return (nodes, inits) of one level's head: p{level}_xy, _wh [N, 2, A], _cls [N, C, A].

    YOLOv5's box decoding, in input pixels: xy = (2 sigmoid(t) - 0.5 + cell) * stride,
    wh = (2 sigmoid(t))^2 * anchor.
    """
    stride, anchor = shape.levels[level]
    p, classes = f"p{level}_", DETECTOR_CLASSES
    direction = rng.normal(size=(classes, 3))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    # A pooled pixel has a standard deviation of 1 / stride: z is scaled back to N(0, 1).
    forced = direction * SCORE_GAIN * stride
    nodes = [
        helper.make_node("Conv", [feature, f"{p}box_w", f"{p}box_b"], [f"{p}box"]),
        helper.make_node("Conv", [feature, f"{p}cls_w", f"{p}cls_b"], [f"{p}learned"]),
        helper.make_node(
            "AveragePool",
            ["images"],
            [f"{p}pixels"],
            kernel_shape=[stride] * 2,
            strides=[stride] * 2,
        ),
        helper.make_node("Conv", [f"{p}pixels", f"{p}z_w", f"{p}z_b"], [f"{p}forced"]),
        helper.make_node("Add", [f"{p}learned", f"{p}forced"], [f"{p}cls_map"]),
        helper.make_node("Reshape", [f"{p}cls_map", f"{p}cls_shape"], [f"{p}cls"]),
        helper.make_node("Reshape", [f"{p}box", f"{p}box_shape"], [f"{p}box_flat"]),
        helper.make_node("Sigmoid", [f"{p}box_flat"], [f"{p}box_sig"]),
        helper.make_node("Split", [f"{p}box_sig", "two_two"], [f"{p}sxy", f"{p}swh"], axis=1),
        helper.make_node("Mul", [f"{p}sxy", f"{p}xy_scale"], [f"{p}xy_cells"]),
        helper.make_node("Add", [f"{p}xy_cells", f"{p}grid"], [f"{p}xy"]),
        helper.make_node("Mul", [f"{p}swh", f"{p}swh"], [f"{p}wh_sq"]),
        helper.make_node("Mul", [f"{p}wh_sq", f"{p}wh_scale"], [f"{p}wh"]),
    ]
    inits = [
        _weights(rng, f"{p}box_w", (4, width, 1, 1), 0.05),
        _weights(rng, f"{p}box_b", (4,), 0.1),
        _weights(rng, f"{p}cls_w", (classes, width, 1, 1), 0.1),
        _weights(rng, f"{p}cls_b", (classes,), 0.1),
        _const(f"{p}z_w", forced.reshape(classes, 3, 1, 1)),
        _const(f"{p}z_b", np.full(classes, -SCORE_GAIN * Z_THRESHOLD)),
        _const(f"{p}cls_shape", [0, classes, -1], np.int64),
        _const(f"{p}box_shape", [0, 4, -1], np.int64),
        _const(f"{p}xy_scale", 2.0 * stride),
        _const(f"{p}grid", _anchor_grid(shape.size, stride)),
        _const(f"{p}wh_scale", 4.0 * anchor),
    ]
    return nodes, inits


def _detector_body(rng, shape):
    """Return (nodes, inits) of a detector on images [N, 3, size, size].

    A stride-2 3x3 conv (SiLU) per halving of the image, 8 channels doubling up to 64,
    down to the coarsest level; each level's head reads the features at its stride.
    Leaves xy, wh [N, 2, A] (box centre and size in input pixels) and cls [N, C, A]
    (class logits), anchors row by row, level after level.
    """
    nodes, inits, features = [], [], {1: ("images", 3)}
    stride = 1
    while stride < shape.levels[-1][0]:
        source, channels = features[stride]
        width = min(8 * stride, 64)
        stride *= 2
        more, weights = _conv_silu(rng, source, f"f{stride}", channels, width, stride=2)
        nodes, inits, features[stride] = nodes + more, inits + weights, (f"f{stride}", width)
    for level, (stride, _) in enumerate(shape.levels):
        more, weights = _detector_level(rng, level, *features[stride], shape)
        nodes, inits = nodes + more, inits + weights
    for part in ("xy", "wh", "cls"):
        parts = [f"p{level}_{part}" for level in range(len(shape.levels))]
        nodes.append(helper.make_node("Concat", parts, [part], axis=2))
    inits.append(_const("two_two", [2, 2], np.int64))
    return nodes, inits


def _detector_graph(name, head, outputs, shape, batch="N"):
    """Return the graph of the detector body (seeded by name) and a head (nodes, inits)."""
    nodes, inits = _detector_body(_rng(name), shape)
    images = helper.make_tensor_value_info("images", FLOAT, [batch, 3, shape.size, shape.size])
    return helper.make_graph(nodes + head[0], name, [images], outputs, initializer=inits + head[1])


def write_yolov8_anchors_last(folder, shape=DETECTOR, name="yolov8_anchors_last"):
    """YOLOv8/v11's output0 [N, 4 + C, A]: cx, cy, w, h in pixels, then C class scores."""
    head = [
        helper.make_node("Sigmoid", ["cls"], ["scores"]),
        helper.make_node("Concat", ["xy", "wh", "scores"], ["output0"], axis=1),
    ]
    output = helper.make_tensor_value_info(
        "output0", FLOAT, ["N", 4 + DETECTOR_CLASSES, shape.anchors]
    )
    graph = _detector_graph("yolov8", (head, []), [output], shape)
    return _save(_model(graph, 17, 8), folder, name)


def write_yolov5_anchors_first(folder):
    """YOLOv5/v7's output [N, A, 5 + C]: cx, cy, w, h, objectness, then C class scores."""
    head = [
        helper.make_node("ReduceMax", ["cls"], ["best"], axes=[1], keepdims=1),
        helper.make_node("Sigmoid", ["best"], ["objectness"]),
        helper.make_node("Sigmoid", ["cls"], ["scores"]),
        helper.make_node("Concat", ["xy", "wh", "objectness", "scores"], ["rows"], axis=1),
        helper.make_node("Transpose", ["rows"], ["output"], perm=[0, 2, 1]),
    ]
    anchors = DETECTOR.anchors
    output = helper.make_tensor_value_info("output", FLOAT, ["N", anchors, 5 + DETECTOR_CLASSES])
    graph = _detector_graph("yolov5", (head, []), [output], DETECTOR)
    return _save(_model(graph, 17, 8), folder, "yolov5_anchors_first")


def _nms_head():
    """Return (nodes, inits): NonMaxSuppression over xyxy boxes, its picks gathered and padded
    with zeros to NMS_KEEP rows, as TensorRT's EfficientNMS lays them out (batch 1)."""
    keep = NMS_KEEP
    nodes = [
        helper.make_node("Mul", ["wh", "half"], ["half_wh"]),
        helper.make_node("Sub", ["xy", "half_wh"], ["top_left"]),
        helper.make_node("Add", ["xy", "half_wh"], ["bottom_right"]),
        helper.make_node("Concat", ["top_left", "bottom_right"], ["corners"], axis=1),
        helper.make_node("Transpose", ["corners"], ["boxes"], perm=[0, 2, 1]),
        helper.make_node("Sigmoid", ["cls"], ["scores"]),
        helper.make_node(
            "NonMaxSuppression",
            ["boxes", "scores", "per_class", "iou", "threshold"],
            ["selected"],
        ),
        helper.make_node("Gather", ["selected", "class_column"], ["picked_class"], axis=1),
        helper.make_node("Gather", ["selected", "box_column"], ["picked_box"], axis=1),
        helper.make_node("Gather", ["boxes", "picked_box"], ["picked_boxes"], axis=1),
        helper.make_node("GatherND", ["scores", "selected"], ["picked_scores"]),
        helper.make_node("Unsqueeze", ["picked_scores", "zero_axis"], ["picked_scores_1"]),
        helper.make_node("Unsqueeze", ["picked_class", "zero_axis"], ["picked_class_1"]),
        helper.make_node("Concat", ["picked_boxes", "no_boxes"], ["padded_boxes"], axis=1),
        helper.make_node("Concat", ["picked_scores_1", "no_scores"], ["padded_scores"], axis=1),
        helper.make_node("Concat", ["picked_class_1", "no_classes"], ["padded_classes"], axis=1),
        helper.make_node("Slice", ["padded_boxes", "start", "keep", "one"], ["det_boxes"]),
        helper.make_node("Slice", ["padded_scores", "start", "keep", "one"], ["det_scores"]),
        helper.make_node("Slice", ["padded_classes", "start", "keep", "one"], ["det_classes"]),
        helper.make_node("Shape", ["selected"], ["selected_shape"], end=1),
        helper.make_node("Min", ["selected_shape", "keep"], ["kept"]),
        helper.make_node("Unsqueeze", ["kept", "zero_axis"], ["num_dets"]),
    ]
    inits = [
        _const("half", 0.5),
        _const("per_class", [keep], np.int64),
        _const("iou", [0.45]),
        _const("threshold", [0.25]),
        _const("zero_axis", [0], np.int64),
        _const("one", [1], np.int64),
        _const("class_column", 1, np.int64),
        _const("box_column", 2, np.int64),
        _const("start", [0], np.int64),
        _const("keep", [keep], np.int64),
        _const("no_boxes", np.zeros((1, keep, 4))),
        _const("no_scores", np.zeros((1, keep))),
        _const("no_classes", np.zeros((1, keep)), np.int64),
    ]
    return nodes, inits


def write_nms_in_graph(folder):
    """The detector with NMS in the graph, batch 1: num_dets [1, 1], det_boxes [1, K, 4] (xyxy
    pixels), det_scores [1, K], det_classes [1, K], as EfficientNMS-style exports write them."""
    keep = NMS_KEEP
    outputs = [
        helper.make_tensor_value_info("num_dets", TensorProto.INT64, [1, 1]),
        helper.make_tensor_value_info("det_boxes", FLOAT, [1, keep, 4]),
        helper.make_tensor_value_info("det_scores", FLOAT, [1, keep]),
        helper.make_tensor_value_info("det_classes", TensorProto.INT64, [1, keep]),
    ]
    graph = _detector_graph("nms", _nms_head(), outputs, DETECTOR, batch=1)
    return _save(_model(graph, 17, 8), folder, "nms_in_graph")


def write_segmenter(folder):
    """A semantic segmenter as torchvision's exports read: out [N, C, 32, 32], class logits at
    the input's size (a stride-2 body, a 1x1 classifier, bilinear Resize back up)."""
    rng = _rng("segmenter")
    classes = SEGMENTER_CLASSES
    nodes, inits = _conv_silu(rng, "input", "down", 3, 8, stride=2)
    more, weights = _conv_silu(rng, "down", "body", 8, 8)
    nodes += more + [
        helper.make_node("Conv", ["body", "classifier_w", "classifier_b"], ["coarse"]),
        helper.make_node("Resize", ["coarse", "", "scales"], ["out"], mode="linear"),
    ]
    inits += weights + [
        _weights(rng, "classifier_w", (classes, 8, 1, 1), 2.0),
        _weights(rng, "classifier_b", (classes,), 0.5),
        _const("scales", [1, 1, 2, 2]),
    ]
    image = helper.make_tensor_value_info("input", FLOAT, ["N", 3, 32, 32])
    out = helper.make_tensor_value_info("out", FLOAT, ["N", classes, 32, 32])
    graph = helper.make_graph(nodes, "segmenter", [image], [out], initializer=inits)
    return _save(_model(graph, 17, 8), folder, "semantic_segmenter")


def write_ctc_recogniser(folder):
    """A CRNN-style text recogniser: a text line [N, 3, 32, 64] -> conv body -> mean over the
    height, centred along the line -> per-column classifier -> softmax [N, T=16, V] over
    CHARSET's tokens (0: the blank)."""
    rng = _rng("ctc")
    vocabulary = len(CHARSET)
    nodes, inits = _conv_silu(rng, "x", "c1", 3, 16, stride=2)
    more, weights = _conv_silu(rng, "c1", "c2", 16, 32, stride=2)
    nodes += more + [
        helper.make_node("ReduceMean", ["c2"], ["columns"], axes=[2], keepdims=0),
        # What tells the columns apart, as a trained body's features do (not their mean).
        helper.make_node("ReduceMean", ["columns"], ["line"], axes=[2], keepdims=1),
        helper.make_node("Sub", ["columns", "line"], ["centred"]),
        helper.make_node("Transpose", ["centred"], ["steps"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["steps", "classifier_w"], ["scores"]),
        helper.make_node("Add", ["scores", "classifier_b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["softmax"], axis=-1),
    ]
    bias = rng.normal(size=vocabulary) * 0.5
    bias[0] += 3.0  # a trained recogniser says "blank" between characters
    inits += weights + [
        _weights(rng, "classifier_w", (32, vocabulary), 3.0),
        _const("classifier_b", bias),
    ]
    line = helper.make_tensor_value_info("x", FLOAT, ["N", 3, 32, 64])
    out = helper.make_tensor_value_info("softmax", FLOAT, ["N", 16, vocabulary])
    graph = helper.make_graph(nodes, "ctc", [line], [out], initializer=inits)
    return _save(_model(graph, 17, 8), folder, "ctc_recogniser")


def write_embedder(folder):
    """An image embedder: conv head -> Gemm to EMBEDDING_SIZE -> L2-normalised embedding."""
    rng = _rng("embedder")
    nodes, inits = _conv_head(rng, "image", width=16)
    nodes[-1] = helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["projected"], transB=1)
    nodes.append(helper.make_node("LpNormalization", ["projected"], ["embedding"], axis=1, p=2))
    inits[2:] = [
        _weights(rng, "fc_w", (EMBEDDING_SIZE, 16), 1.0),
        _weights(rng, "fc_b", (EMBEDDING_SIZE,), 0.1),
    ]
    image = _image(shape=("N", 3, 32, 32))
    out = helper.make_tensor_value_info("embedding", FLOAT, ["N", EMBEDDING_SIZE])
    graph = helper.make_graph(nodes, "embedder", [image], [out], initializer=inits)
    return _save(_model(graph, 17, 8), folder, "embedder")


def write_minus_one_dims(folder):
    """A classifier as paddle2onnx writes one: dim_value -1 (not a symbol) on the batch and
    on H and W, input x, output softmax_0.tmp_0."""
    rng = _rng("paddle")
    nodes, inits = _conv_head(rng, "x")
    nodes[-1].output[0] = "fc_0.tmp_1"
    nodes.append(helper.make_node("Softmax", ["fc_0.tmp_1"], ["softmax_0.tmp_0"], axis=1))
    x = helper.make_tensor_value_info("x", FLOAT, [-1, 3, -1, -1])
    out = helper.make_tensor_value_info("softmax_0.tmp_0", FLOAT, [-1, CLASSES])
    graph = helper.make_graph(nodes, "paddle", [x], [out], initializer=inits)
    return _save(_model(graph, 13, 7), folder, "minus_one_dims")


MINUS_ONE_CONTRACT = {
    "inputs": {
        "x": {
            "shape": ["batch", 3, "dim_2", "dim_3"],  # the hub names an axis of -1 dim_<axis>
            "batch": {"sizes": [1]},
            "dynamic": {
                "2": {"min": 16, "opt": 32, "max": 64},
                "3": {"min": 16, "opt": 32, "max": 64},
            },
        }
    }
}


class _RandomImages:
    """onnxruntime.quantization's CalibrationDataReader over a few random images."""

    def __init__(self, name, shape, count=8):
        rng = np.random.default_rng(7)
        self.feeds = iter(
            [{name: rng.normal(size=(1, *shape)).astype(np.float32)} for _ in range(count)]
        )

    def get_next(self):
        return next(self.feeds, None)


def write_qdq_source(folder):
    """A conv classifier already in QDQ form: onnxruntime.quantization.quantize_static (QDQ,
    per-tensor int8) of a float model, calibrated on random images, as users upload it."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    rng = _rng("qdq")
    nodes, inits = _conv_head(rng, "image", width=16)
    graph = helper.make_graph(
        nodes, "qdq", [_image(shape=("N", 3, 16, 16))], [_logits()], initializer=inits
    )
    float_path = _save(_model(graph, 13, 7), folder, "qdq_float")
    path = Path(folder) / "qdq_source.onnx"
    logging.disable(logging.WARNING)  # its advice to pre-process first, on the root logger
    try:
        quantize_static(
            str(float_path),
            str(path),
            _RandomImages("image", (3, 16, 16)),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
        )
    finally:
        logging.disable(logging.NOTSET)
    float_path.unlink()
    return path


# torch.onnx.export of small torchvision-like blocks (random weights) -------------------------


def _torch_modules():
    """Return the torch.nn blocks, defined only where torch imports."""
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        """ResNet's basic block: two 3x3 convs with batch norm and an identity shortcut."""

        def __init__(self, width):
            super().__init__()
            self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(out)) + x)

    def resnet(width=16):
        return nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            BasicBlock(width),
            BasicBlock(width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(width, CLASSES),
        )

    class InvertedResidual(nn.Module):
        """MobileNetV2/V3's block: expand 1x1, depthwise 3x3, project 1x1, shortcut."""

        def __init__(self, width, expand=4):
            super().__init__()
            hidden = width * expand
            self.body = nn.Sequential(
                nn.Conv2d(width, hidden, 1, bias=False),
                nn.BatchNorm2d(hidden),
                nn.Hardswish(),
                nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False),
                nn.BatchNorm2d(hidden),
                nn.ReLU6(),
                nn.Conv2d(hidden, width, 1, bias=False),
                nn.BatchNorm2d(width),
            )

        def forward(self, x):
            return x + self.body(x)

    def mobilenet(width=16):
        return nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.Hardswish(),
            InvertedResidual(width),
            InvertedResidual(width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(width, CLASSES),
        )

    def plain_convnet(width=16):
        return nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1),
            nn.ReLU(),
            nn.AvgPool2d(2),
            nn.Conv2d(width, width * 2, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(width * 2, CLASSES),
        )

    class Transformer(nn.Module):
        """A ViT-style encoder block on a sequence of 8 tokens of width 32, then a head."""

        def __init__(self, width=32):
            super().__init__()
            self.block = nn.TransformerEncoderLayer(
                width, nhead=2, dim_feedforward=64, dropout=0.0, batch_first=True
            )
            self.head = nn.Linear(width, CLASSES)

        def forward(self, x):
            return self.head(self.block(x).mean(dim=1))

    class TinyYolo(nn.Module):
        """YOLOv8's Detect head as it exports, on DETECTOR's levels: output0 [N, 4 + C, A],
        cx, cy, w, h in input pixels then C class scores, trained-like as the onnx.helper
        detectors' (a few boxes an image above 0.25)."""

        def __init__(self, shape=DETECTOR, classes=DETECTOR_CLASSES):
            super().__init__()
            self.shape, widths, layers, channels = shape, {}, [], 3
            while len(layers) < int(np.log2(shape.levels[-1][0])):
                width = min(8 * 2 ** len(layers), 64)
                layers.append(nn.Sequential(nn.Conv2d(channels, width, 3, 2, 1), nn.SiLU()))
                channels, widths[2 ** len(layers)] = width, width
            self.body = nn.ModuleList(layers)
            strides = [stride for stride, _ in shape.levels]
            self.box = nn.ModuleList(nn.Conv2d(widths[s], 4, 1) for s in strides)
            self.cls = nn.ModuleList(nn.Conv2d(widths[s], classes, 1) for s in strides)
            self.forced = nn.ModuleList(nn.Conv2d(3, classes, 1) for _ in strides)
            for index, stride in enumerate(strides):
                grid = torch.from_numpy(_anchor_grid(shape.size, stride))
                self.register_buffer(f"grid{index}", grid)
                self._trained_like(index, stride, classes)

        @torch.no_grad()
        def _trained_like(self, index, stride, classes):
            self.box[index].weight.mul_(0.2)
            self.cls[index].weight.mul_(0.3)
            direction = nn.functional.normalize(torch.randn(classes, 3), dim=1)
            self.forced[index].weight.copy_((direction * SCORE_GAIN * stride)[:, :, None, None])
            self.forced[index].bias.fill_(-SCORE_GAIN * Z_THRESHOLD)

        def forward(self, images):
            features, x = {}, images
            for depth, layer in enumerate(self.body, 1):
                x = features[2**depth] = layer(x)
            levels = []
            for index, (stride, anchor) in enumerate(self.shape.levels):
                box = self.box[index](features[stride]).flatten(2).sigmoid()
                xy = box[:, :2] * (2 * stride) + getattr(self, f"grid{index}")
                wh = (box[:, 2:] * 2) ** 2 * anchor
                pixels = nn.functional.avg_pool2d(images, stride)
                logits = self.cls[index](features[stride]) + self.forced[index](pixels)
                levels.append(torch.cat([xy, wh, logits.flatten(2).sigmoid()], 1))
            return torch.cat(levels, 2)

    return {
        "resnet": resnet,
        "mobilenet": mobilenet,
        "convnet": plain_convnet,
        "transformer": Transformer,
        "yolov8": TinyYolo,
    }


def _randomise_batch_norm(module, seed):
    """Give batch norms non-trivial statistics, as a trained model has."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    for layer in module.modules():
        if isinstance(layer, torch.nn.BatchNorm2d):
            size = layer.num_features
            layer.running_mean.copy_(torch.randn(size, generator=generator) * 0.1)
            layer.running_var.copy_(1 + torch.rand(size, generator=generator))


def _torch_export(kind, opset, sample_shape, name, names=("input", "logits"), batch="N"):
    """Return write(folder) of a torch block exported with torch.onnx: its input and output
    names, and a dynamic batch (batch 1 where None, as Ultralytics exports by default)."""
    source, result = names
    dynamic = {source: {0: batch}, result: {0: batch}} if batch else None

    def write(folder):
        import torch

        torch.manual_seed(sum(map(ord, name)))
        module = _torch_modules()[kind]().eval()
        _randomise_batch_norm(module, opset)
        path = Path(folder) / f"{name}.onnx"
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                (torch.randn(1, *sample_shape),),
                buffer,
                opset_version=opset,
                dynamo=False,
                input_names=[source],
                output_names=[result],
                dynamic_axes=dynamic,
            )
        path.write_bytes(buffer.getvalue())
        return path

    return write


# The corpus ---------------------------------------------------------------------------------

IMAGE = Input("image", "float32", (3, 16, 16))
TORCH_IMAGE = Input("input", "float32", (3, 32, 32))
DETECTOR_IMAGE = Input("images", "float32", (3, 32, 32))

CORPUS = (
    CorpusModel(
        "ir3_initializers_as_inputs",
        ("initializers-as-inputs", "conv"),
        3,
        8,
        write_ir3_initializers_as_inputs,
        (IMAGE,),
    ),
    CorpusModel(
        "old_opset6_batchnorm_add",
        ("old-opset", "initializers-as-inputs", "batchnorm"),
        3,
        6,
        write_old_opset6_batchnorm_add,
        (IMAGE,),  # auto mode converts it to opset 17 first
    ),
    CorpusModel(
        "ir3_opset7_maxpool",
        ("initializers-as-inputs", "conv", "maxpool"),
        3,
        7,
        write_ir3_opset7_maxpool,
        (IMAGE,),
    ),
    CorpusModel(
        "mlp_ir4_opset9",
        ("gemm", "no-image"),
        4,
        9,
        write_mlp_ir4_opset9,
        (Input("x", "float32", (64,)),),
    ),
    CorpusModel("conv_ir5_opset10", ("conv",), 5, 10, write_conv_ir5_opset10, (IMAGE,)),
    CorpusModel(
        "depthwise_ir6_opset11",
        ("depthwise-conv", "clip"),
        6,
        11,
        write_depthwise_ir6_opset11,
        (IMAGE,),
    ),
    CorpusModel(
        "resnet_block_ir7_opset12",
        ("conv", "residual"),
        7,
        12,
        write_resnet_block_ir7_opset12,
        (IMAGE,),
    ),
    CorpusModel(
        "constant_node_weights",
        ("constant-weights", "constant-of-shape", "conv"),
        7,
        12,
        write_constant_node_weights,
        (IMAGE,),
    ),
    CorpusModel(
        "multi_input_output",
        ("multi-input", "multi-output", "conv"),
        8,
        14,
        write_multi_input_output,
        (IMAGE, Input("mask", "float32", (1, 16, 16))),
        task="generic",  # two outputs: every one compared with FP32
    ),
    CorpusModel(
        "int64_tokens",
        ("int64-input", "gather"),
        8,
        15,
        write_int64_tokens,
        (Input("input_ids", "int64", (8,), 0, 100),),
    ),
    CorpusModel(
        "bool_mask",
        ("bool-input", "multi-input", "where"),
        9,
        19,
        write_bool_mask,
        (Input("features", "float32", (16,)), Input("keep", "bool", (16,))),
    ),
    CorpusModel(
        "uint8_nhwc",
        ("uint8-input", "nhwc", "conv"),
        7,
        13,
        write_uint8_nhwc,
        (Input("pixels", "uint8", (16, 16, 3), 0, 256),),
    ),
    CorpusModel(
        "float16_input",
        ("float16-input", "conv"),
        8,
        17,
        write_float16_input,
        (Input("image", "float16", (3, 16, 16)),),
    ),
    CorpusModel(
        "fixed_batch_2", ("fixed-batch-2", "conv"), 7, 13, write_fixed_batch_2, (IMAGE,), batch=2
    ),
    CorpusModel(
        "scalar_input",
        ("no-batch-axis", "scalar-input", "multi-input", "conv"),
        8,
        16,
        write_scalar_input,
        (IMAGE, Input("temperature", "float32", (), batched=False)),
    ),
    CorpusModel(
        "dynamic_hw",
        ("dynamic-hw", "conv"),
        8,
        18,
        write_dynamic_hw,
        (Input("image", "float32", (3, 32, 32)),),
        contract=DYNAMIC_HW_CONTRACT,
    ),
    CorpusModel(
        "external_data_zip",
        ("external-data", "zip", "conv"),
        8,
        13,
        write_external_data_zip,
        (IMAGE,),
    ),
    CorpusModel(
        "big_external_table",
        ("external-data", "over-100MB", "int64-input", "gather"),
        8,
        13,
        write_big_external_table,
        (Input("ids", "int64", (4,), 0, BIG_TABLE_ROWS),),
    ),
    CorpusModel(
        "nothing_to_quantise",
        ("nothing-to-quantise",),
        8,
        17,
        write_nothing_to_quantise,
        (Input("scores", "float32", (CLASSES,)),),
    ),
    CorpusModel(
        "transformer_block",
        ("transformer", "layernorm", "softmax", "matmul"),
        8,
        18,
        write_transformer_block,
        (Input("x", "float32", (8, 16)),),
    ),
    CorpusModel(
        "gelu_mlp_opset20",
        ("gelu", "matmul"),
        9,
        20,
        write_gelu_mlp_opset20,
        (Input("x", "float32", (32,)),),
    ),
    CorpusModel("conv_ir10_opset21", ("conv",), 10, 21, write_conv_ir10_opset21, (IMAGE,)),
    CorpusModel(
        "torch_resnet_opset11",
        ("torch-export", "resnet", "batchnorm", "residual"),
        6,
        11,
        _torch_export("resnet", 11, (3, 32, 32), "torch_resnet_opset11"),
        (TORCH_IMAGE,),
        needs_torch=True,
    ),
    CorpusModel(
        "torch_resnet_opset13",
        ("torch-export", "resnet", "batchnorm", "residual"),
        7,
        13,
        _torch_export("resnet", 13, (3, 32, 32), "torch_resnet_opset13"),
        (TORCH_IMAGE,),
        needs_torch=True,
    ),
    CorpusModel(
        "torch_mobilenet_opset17",
        ("torch-export", "mobilenet", "depthwise-conv", "hardswish"),
        8,
        17,
        _torch_export("mobilenet", 17, (3, 32, 32), "torch_mobilenet_opset17"),
        (TORCH_IMAGE,),
        needs_torch=True,
    ),
    CorpusModel(
        "torch_convnet_opset21",
        ("torch-export", "conv", "avgpool"),
        10,
        21,
        _torch_export("convnet", 21, (3, 32, 32), "torch_convnet_opset21"),
        (TORCH_IMAGE,),
        needs_torch=True,
    ),
    CorpusModel(
        "torch_transformer_opset17",
        ("torch-export", "transformer", "layernorm", "softmax", "matmul"),
        8,
        17,
        _torch_export("transformer", 17, (8, 32), "torch_transformer_opset17"),
        (Input("input", "float32", (8, 32)),),
        needs_torch=True,
    ),
    CorpusModel(
        "yolov8_anchors_last",
        ("detection", "anchors-last", "yolo", "conv"),
        8,
        17,
        write_yolov8_anchors_last,
        (DETECTOR_IMAGE,),
        task="detection",
    ),
    CorpusModel(
        "torch_yolov8_opset17",
        ("torch-export", "detection", "anchors-last", "yolo", "conv"),
        8,
        17,
        _torch_export(
            "yolov8",
            17,
            (3, 32, 32),
            "torch_yolov8_opset17",
            names=("images", "output0"),
            batch=None,
        ),
        (DETECTOR_IMAGE,),
        needs_torch=True,
        task="detection",
    ),
    CorpusModel(
        "yolov5_anchors_first",
        ("detection", "anchors-first", "yolo", "conv"),
        8,
        17,
        write_yolov5_anchors_first,
        (DETECTOR_IMAGE,),
        task="detection",
    ),
    CorpusModel(
        "nms_in_graph",
        ("detection", "nms-in-graph", "int64-output", "multi-output", "conv"),
        8,
        17,
        write_nms_in_graph,
        (DETECTOR_IMAGE,),
        task="detection",
    ),
    CorpusModel(
        "semantic_segmenter",
        ("semantic-segmentation", "resize", "conv"),
        8,
        17,
        write_segmenter,
        (TORCH_IMAGE,),
        task="semantic_segmentation",
    ),
    CorpusModel(
        "ctc_recogniser",
        ("text-recognition", "ctc", "softmax", "matmul", "conv"),
        8,
        17,
        write_ctc_recogniser,
        (Input("x", "float32", (3, 32, 64)),),
        task="text_recognition",
        task_params={"charset": CHARSET},
    ),
    CorpusModel(
        "embedder",
        ("embedding", "lp-normalization", "conv"),
        8,
        17,
        write_embedder,
        (Input("image", "float32", (3, 32, 32)),),
        task="embedding",
    ),
    CorpusModel(
        "minus_one_dims",
        ("minus-one-dims", "dynamic-hw", "paddle", "conv"),
        7,
        13,
        write_minus_one_dims,
        (Input("x", "float32", (3, 32, 32)),),
        contract=MINUS_ONE_CONTRACT,
    ),
    CorpusModel(
        "qdq_source",
        ("already-quantised", "qdq", "conv"),
        7,
        13,
        write_qdq_source,
        (IMAGE,),
    ),
)
BY_NAME = {model.name: model for model in CORPUS}


def torch_missing():
    """Return why the torch entries cannot be written here, or '' when torch imports."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return f"torch is not installed ({exc}): the torch.onnx.export entries need it"
    return ""


# Datasets -----------------------------------------------------------------------------------


def source_session(path, model):
    """Return an ONNX Runtime session (CPU defaults) of the source, or of its opset-13 twin."""
    import onnxruntime

    source = str(path) if model.opset >= 7 else modernised_opset6(onnx.load(str(path)))
    return onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"])


def source_runs(path, model, samples):
    """Yield each run of the source on the samples, one by one (or in its fixed batch)."""
    session = source_session(path, model)
    count = len(next(iter(samples.values())))
    for start in range(0, count, model.batch):
        feeds = {
            spec.name: samples[spec.name][start : start + model.batch]
            if spec.batched
            else np.asarray(samples[spec.name][start])
            for spec in model.inputs
        }
        yield session.run(None, feeds)


def source_outputs(path, model, samples):
    """Return the source's first output on the samples, a row per sample."""
    runs = source_runs(path, model, samples)
    return np.concatenate([outputs[0].reshape(model.batch, -1) for outputs in runs])


def declaration_of(model, path, declaration=None):
    """Return the task declaration to read the source's outputs with, checked against them.

    The version's (declaration, as the hub proposed it), else the model's own task, with
    the params its team declares on top (a recogniser's charset).
    """
    from workers.tasks import normalise
    from workers.tasks.propose import BOX_TASKS, image_size

    session = source_session(path, model)
    declaration = declaration or {"task": model.task, "params": {}}
    if declaration["task"] == model.task and model.task_params:
        params = {**declaration.get("params", {}), **model.task_params}
        declaration = {"task": model.task, "params": params}
    if declaration["task"] in BOX_TASKS and "image_size" not in declaration["params"]:
        # Boxes clipped to the image, as the hub's proposal and declarations clip them.
        inputs = [{"name": i.name, "shape": i.shape} for i in session.get_inputs()]
        params = {**declaration["params"], "image_size": image_size(inputs)}
        declaration = {**declaration, "params": params}
    outputs = [
        {"name": output.name, "dtype": output.type, "shape": output.shape}
        for output in session.get_outputs()
    ]
    return normalise(declaration, outputs)


def source_objects(path, model, samples, declaration):
    """Return the objects the source's answers decode into, one per sample (its detections,
    masks, strings), read with a checked declaration as the evaluate job reads them."""
    from workers.tasks import TASKS
    from workers.tasks.detection import counted

    task, params = TASKS[declaration["task"]], declaration["params"]
    names = [output.name for output in source_session(path, model).get_outputs()]
    found = [
        found
        for outputs in source_runs(path, model, samples)
        for found in task.decode(outputs, names, params, model.batch, model.batch)
    ]
    # Detections as the source reports them: above its threshold, not the matching margin.
    return counted(found, params) if "score_threshold" in params else found


def label_arrays(task, objects):
    """Return a dataset's label arrays (spec section 4) holding decoded objects as the truth."""
    if task == "detection":
        boxes = [found["boxes"].reshape(-1, 4) for found in objects]
        return {
            "label_boxes": np.concatenate(boxes).astype(np.float32),
            "label_classes": np.concatenate([found["classes"] for found in objects]).astype(
                np.int64
            ),
            "label_sample": np.concatenate(
                [np.full(len(found["classes"]), index) for index, found in enumerate(objects)]
            ).astype(np.int64),
        }
    if task == "semantic_segmentation":
        return {"label_masks": np.stack([found["mask"] for found in objects]).astype(np.uint8)}
    if task == "text_recognition":
        return {"label_texts": np.array([found["text"] for found in objects], dtype=str)}
    return {}  # embeddings have no labelled metric: the build is judged on its agreement


def validation_labels(model, path, samples, declaration=None):
    """Return the label arrays of the validation samples: the source's own answers.

    A classifier's labels are the source's top-1 (of its first output, as ever); another
    task's are its decoded objects. The source then scores 100% (mAP 1, CER 0), and a
    build's drop is its disagreement with the source.
    """
    if model.task == "classification":
        return {"labels": source_outputs(path, model, samples).argmax(axis=1)}
    declaration = declaration_of(model, path, declaration)
    return label_arrays(declaration["task"], source_objects(path, model, samples, declaration))


def dataset_npz(model, samples, labels=None):
    """Return .npz bytes: `inputs` for one input (one array per input for several), and the
    label arrays ({name: array}) beside them."""
    if len(model.inputs) == 1:
        arrays = {"inputs": samples[model.inputs[0].name]}
    else:
        arrays = dict(samples)
    arrays.update(labels or {})
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def datasets(model, source_path, declaration=None):
    """Return (calibration .npz bytes, validation .npz bytes) for a model written at source_path.

    Validation labels are the source's own answers in its task's format (validation_labels),
    read with the version's task declaration where there is one.
    """
    calibration = model.samples(CALIBRATION_SAMPLES, seed=1)
    validation = model.samples(VALIDATION_SAMPLES, seed=2)
    labels = validation_labels(model, onnx_file(source_path), validation, declaration)
    return dataset_npz(model, calibration), dataset_npz(model, validation, labels)


def onnx_file(path):
    """Return a path ONNX Runtime can open: the .onnx itself, or the model unpacked from a zip."""
    path = Path(path)
    if path.suffix != ".zip":
        return path
    folder = path.with_suffix("")
    with zipfile.ZipFile(path) as archive:
        archive.extractall(folder)
    return folder / "model.onnx"
