"""The conformance corpus: ONNX files written the way other tools write them, made at test time.

Each `CorpusModel` writes one upload (an `.onnx`, or a `.zip` of a model and its
external data) into a folder, says which features it exercises, gives the
input-shape contract a user would upload with it (None: the proposed default),
makes per-input samples for its calibration and validation datasets, and names
the outcome the conformance test expects:

- "recommended": auto mode recommends a build that reproduces the source
  within the class's tolerance;
- "refused at preflight: <reason>": every build of the grid is ruled out
  before anything is queued, with that reason.

Nothing is downloaded: weights are random (seeded per model), built with
onnx.helper/numpy, or exported with torch.onnx from small ResNet/MobileNet/
transformer blocks written in plain torch.nn (torchvision is not installed).
The torch entries say so when torch is absent. Validation labels are the
source model's own top-1 (ONNX Runtime on the CPU), so the reference top-1 is
100% and a build's top-1 drop is its disagreement with the source.
"""

import io
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

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

    return {
        "resnet": resnet,
        "mobilenet": mobilenet,
        "convnet": plain_convnet,
        "transformer": Transformer,
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


def _torch_export(kind, opset, sample_shape, name):
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
                input_names=["input"],
                output_names=["logits"],
                dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}},
            )
        path.write_bytes(buffer.getvalue())
        return path

    return write


# The corpus ---------------------------------------------------------------------------------

IMAGE = Input("image", "float32", (3, 16, 16))
TORCH_IMAGE = Input("input", "float32", (3, 32, 32))

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
        (IMAGE,),
        expect=REFUSED + "opset 6 is older than",  # preflight offers the opset conversion
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


def source_outputs(path, model, samples):
    """Run the source file with ONNX Runtime defaults, sample by sample (or in its fixed batch)."""
    import onnxruntime

    source = str(path) if model.opset >= 7 else modernised_opset6(onnx.load(str(path)))
    session = onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"])
    count = len(next(iter(samples.values())))
    outputs = []
    for start in range(0, count, model.batch):
        feeds = {
            spec.name: samples[spec.name][start : start + model.batch]
            if spec.batched
            else np.asarray(samples[spec.name][start])
            for spec in model.inputs
        }
        outputs.append(session.run(None, feeds)[0].reshape(model.batch, -1))
    return np.concatenate(outputs)


def dataset_npz(model, samples, labels=None):
    """Return .npz bytes: `inputs` (and `labels`) for one input, one array per input for several."""
    if len(model.inputs) == 1:
        arrays = {"inputs": samples[model.inputs[0].name]}
    else:
        arrays = dict(samples)
    if labels is not None:
        arrays["labels"] = labels
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def datasets(model, source_path):
    """Return (calibration .npz bytes, validation .npz bytes) for a model written at source_path.

    Validation labels are the source's own top-1, so the reference scores 100% and a
    build's drop is how often it disagrees with the source.
    """
    calibration = model.samples(CALIBRATION_SAMPLES, seed=1)
    validation = model.samples(VALIDATION_SAMPLES, seed=2)
    labels = source_outputs(onnx_file(source_path), model, validation).argmax(axis=1)
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
