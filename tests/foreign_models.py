"""ONNX files as other tools write them: old IR versions, old opsets, nothing to quantise.

Made here with onnx.helper and numpy, small enough to build in a test.
"""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SHAPE = [1, 3, 8, 8]


def _weights(seed):
    """Return the conv model's initializers: a Conv, a BatchNormalization, a linear head."""
    rng = np.random.default_rng(seed)
    arrays = {
        "conv.w": rng.normal(scale=0.3, size=(4, 3, 3, 3)),
        "conv.b": rng.normal(size=4),
        "bn.scale": rng.uniform(0.5, 1.5, size=4),
        "bn.shift": rng.normal(size=4),
        "bn.mean": rng.normal(scale=0.1, size=4),
        "bn.var": rng.uniform(0.5, 1.5, size=4),
        "flat.shape": np.array([1, -1]),
        "fc.w": rng.normal(scale=0.1, size=(4 * 8 * 8, 5)),
        "fc.b1": np.full(5, 0.1),
        "fc.b2": np.full(5, 0.1),
    }
    return [
        numpy_helper.from_array(
            value.astype(np.int64 if name == "flat.shape" else np.float32), name
        )
        for name, value in arrays.items()
    ]


def conv_model(ir_version=3, opset=9, listed="all", seed=0):
    """Return a Conv+BatchNormalization+Relu, Reshape, MatMul+Add model at an IR version.

    listed says which initializers are also graph inputs: "all" (what IR < 4
    requires), "some" (legal from IR 4: initializers a caller may override) or
    "none". The head's bias is the sum of two equal initializers: from level
    basic ONNX Runtime shares one for both, then folds the sum into a constant,
    and (ORT 1.32) keeps the shared one listed as a graph input, without data.
    """
    weights = _weights(seed)
    nodes = [
        helper.make_node("Conv", ["x", "conv.w", "conv.b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c", "bn.scale", "bn.shift", "bn.mean", "bn.var"], ["n"]
        ),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Reshape", ["r", "flat.shape"], ["f"]),
        helper.make_node("MatMul", ["f", "fc.w"], ["m"]),
        helper.make_node("Add", ["fc.b1", "fc.b2"], ["fc.b"]),
        helper.make_node("Add", ["m", "fc.b"], ["y"]),
    ]
    chosen = {"all": weights, "some": weights[::3], "none": []}[listed]
    extra = [helper.make_tensor_value_info(w.name, w.data_type, list(w.dims)) for w in chosen]
    graph = helper.make_graph(
        nodes,
        "foreign-conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE), *extra],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    onnx.checker.check_model(model, full_check=True)
    return model


def old_opset_model(seed=0):
    """Return an IR 3, opset 6 model: Conv, BatchNormalization-6 and Add-6 with broadcast."""
    rng = np.random.default_rng(seed)
    arrays = {
        "w": rng.normal(scale=0.3, size=(4, 3, 3, 3)),
        "scale": rng.uniform(0.5, 1.5, size=4),
        "shift": rng.normal(size=4),
        "mean": rng.normal(scale=0.1, size=4),
        "var": rng.uniform(0.5, 1.5, size=4),
        "offset": rng.normal(size=(4, 1, 1)),
    }
    weights = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"], is_test=1
        ),
        helper.make_node("Add", ["n", "offset"], ["y"], broadcast=1),
    ]
    listed = [helper.make_tensor_value_info(w.name, w.data_type, list(w.dims)) for w in weights]
    graph = helper.make_graph(
        nodes,
        "old-opset",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE), *listed],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    model.ir_version = 3
    onnx.checker.check_model(model, full_check=True)
    return model


def axis_broadcast_model():
    """Return the opset 6 model with Add aligning a [4] offset at axis 1 (broadcast=1, axis=1).

    The classic pre-opset-7 bias add. onnx.version_converter (1.23) alone
    unsqueezes the offset to [4, 1, 1, 1] instead of [4, 1, 1], and the checker
    refuses the result; workers/checks/convert.py aligns the offset before converting.
    """
    model = old_opset_model()
    [add] = [node for node in model.graph.node if node.op_type == "Add"]
    add.attribute.append(helper.make_attribute("axis", 1))
    offset = numpy_helper.from_array(np.arange(4, dtype=np.float32), "offset")
    for tensor in model.graph.initializer:
        if tensor.name == "offset":
            tensor.CopyFrom(offset)
    for value in model.graph.input:
        if value.name == "offset":
            value.CopyFrom(helper.make_tensor_value_info("offset", TensorProto.FLOAT, [4]))
    onnx.checker.check_model(model, full_check=True)
    return model


def legacy_broadcast_model(op_type="Mul", operand="weight", axis=1):
    """Return an opset 6 model of one `op_type(x, b, broadcast=1, axis=axis)` with b of shape [3].

    operand says what b is: "weight" (an initializer, listed as an input as IR 3
    wants), "shared" (a weight that a second node, an Add giving output z, also
    reads) or "input" (a graph input, so the alignment needs a node of its own).
    """
    weight = numpy_helper.from_array(np.array([2.0, 3.0, 4.0], np.float32), "b")
    listed = helper.make_tensor_value_info("b", TensorProto.FLOAT, [3])
    nodes = [helper.make_node(op_type, ["x", "b"], ["y"], broadcast=1, axis=axis)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)]
    if operand == "shared":
        nodes.append(helper.make_node("Add", ["b", "b"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [3]))
    graph = helper.make_graph(
        nodes,
        f"legacy-{op_type.lower()}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE), listed],
        outputs,
        [] if operand == "input" else [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    model.ir_version = 3
    onnx.checker.check_model(model, full_check=True)
    return model


def unknown_rank_model():
    """Return legacy_broadcast_model with x reshaped first to dims given at run time.

    Shape inference cannot tell the rank of Mul's first input, so the axis
    cannot be turned into trailing ones.
    """
    model = legacy_broadcast_model()
    [mul] = model.graph.node
    mul.input[0] = "shaped"
    reshape = helper.make_node("Reshape", ["x", "dims"], ["shaped"])
    model.graph.node.insert(0, reshape)
    model.graph.input.append(helper.make_tensor_value_info("dims", TensorProto.INT64, ["rank"]))
    onnx.checker.check_model(model, full_check=True)
    return model


def unconvertible_model():
    """Return an opset 6 model onnx.version_converter (1.23) cannot convert at all.

    Its Greater-1 compares the conv model's output with a per-channel threshold:
    the converter has no adapter from Greater-1 to Greater-7.
    """
    model = axis_broadcast_model()
    [add] = [node for node in model.graph.node if node.op_type == "Add"]
    add.op_type = "Greater"
    [output] = model.graph.output
    output.type.tensor_type.elem_type = TensorProto.BOOL
    onnx.checker.check_model(model, full_check=True)
    return model


def nothing_to_quantise_model():
    """Return a float model of Abs, Neg and Reshape: no operator an INT8 quantiser takes."""
    nodes = [
        helper.make_node("Abs", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["n"]),
        helper.make_node("Reshape", ["n", "shape"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "nothing-to-quantise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 192])],
        [numpy_helper.from_array(np.array([1, -1], np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def calibration_npz(path, count=8, seed=0):
    """Write an .npz of float32 inputs for the models here; return its path."""
    inputs = np.random.default_rng(seed).normal(size=(count, *SHAPE[1:])).astype(np.float32)
    np.savez(path, inputs=inputs)
    return path


def sample_input(seed=1):
    """Return one input of the models here."""
    return np.random.default_rng(seed).normal(size=SHAPE).astype(np.float32)


def negative_dims_model():
    """Return a Conv, GlobalAveragePool, Flatten model whose dynamic axes are written as -1.

    As paddle2onnx writes them: input [-1, 3, -1, -1], output [-1, 4].
    """
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(scale=0.3, size=(4, 3, 3, 3)).astype(np.float32), "w")
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c"], ["p"]),
        helper.make_node("Flatten", ["p"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "negative-dims",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, -1, -1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def small_conv_model():
    """Return a Conv+Relu, Flatten, MatMul+Add float model of SHAPE inputs: what INT8 takes."""
    rng = np.random.default_rng(0)
    arrays = {
        "w": rng.normal(scale=0.3, size=(4, 3, 3, 3)),
        "b": rng.normal(size=4),
        "fc.w": rng.normal(scale=0.1, size=(4 * 8 * 8, 5)),
        "fc.b": np.full(5, 0.1),
    }
    weights = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("MatMul", ["f", "fc.w"], ["m"]),
        helper.make_node("Add", ["m", "fc.b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "small-conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def write_qdq_model(folder):
    """Write small_conv_model quantised by its authors (quantize_static, QDQ); return its path."""
    from onnxruntime import quantization

    source, quantised = folder / "float.onnx", folder / "qdq.onnx"
    onnx.save(small_conv_model(), str(source))
    samples = np.random.default_rng(3).normal(size=(4, *SHAPE)).astype(np.float32)
    reader = quantization.CalibrationDataReader
    feeds = iter([{"x": sample} for sample in samples])
    reader = type("Samples", (reader,), {"get_next": lambda self: next(feeds, None)})()
    quantization.quantize_static(
        str(source), str(quantised), reader, quant_format=quantization.QuantFormat.QDQ
    )
    return quantised
