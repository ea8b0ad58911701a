"""Models we did not write, made with onnx.helper: the inputs and shapes feeds must handle.

An int64 input, a bool input, uint8 and float16 inputs, a batch fixed at 2, an
input without a batch axis (1-D, scalar), two inputs and two outputs, dynamic
height and width. Each builder saves a checked opset-17 model and returns its path.
"""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(3)
FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
UINT8, FLOAT16 = TensorProto.UINT8, TensorProto.FLOAT16


def weight(name, *shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def value(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def node(op, inputs, outputs, **attributes):
    return helper.make_node(op, inputs, outputs, **attributes)


def save(path, nodes, inputs, outputs, initializers=()):
    """Save a checked opset-17 model and return its path."""
    graph = helper.make_graph(nodes, "feeds", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def int64_ids(path):
    """Embedding rows picked by int64 ids (Gather), then a MatMul."""
    nodes = [node("Gather", ["table", "ids"], ["rows"]), node("MatMul", ["rows", "w"], ["y"])]
    inputs, outputs = [value("ids", INT64, ["N", 4])], [value("y", FLOAT, ["N", 4, 3])]
    return save(path, nodes, inputs, outputs, [weight("table", 10, 8), weight("w", 8, 3)])


def bool_mask(path):
    """A MatMul whose outputs a bool mask keeps or zeroes (Where)."""
    nodes = [node("MatMul", ["x", "w"], ["h"]), node("Where", ["keep", "h", "zero"], ["y"])]
    inputs = [value("x", FLOAT, ["N", 8]), value("keep", BOOL, ["N", 3])]
    zero = numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")
    return save(path, nodes, inputs, [value("y", FLOAT, ["N", 3])], [weight("w", 8, 3), zero])


def uint8_and_float16(path):
    """uint8 pixels scaled by float16 gains, both cast to float, then a MatMul."""
    nodes = [
        node("Cast", ["pixels"], ["p"], to=FLOAT),
        node("Cast", ["gain"], ["g"], to=FLOAT),
        node("Mul", ["p", "g"], ["m"]),
        node("MatMul", ["m", "w"], ["y"]),
    ]
    inputs = [value("pixels", UINT8, ["N", 8]), value("gain", FLOAT16, ["N", 8])]
    return save(path, nodes, inputs, [value("y", FLOAT, ["N", 3])], [weight("w", 8, 3)])


def fixed_batch_of_two(path):
    """A MatMul whose batch is fixed at 2 by the model itself."""
    nodes = [node("MatMul", ["x", "w"], ["y"])]
    return save(
        path, nodes, [value("x", FLOAT, [2, 8])], [value("y", FLOAT, [2, 3])], [weight("w", 8, 3)]
    )


def one_dimensional(path):
    """A vector times a matrix: the input is 1-D, with no batch axis."""
    nodes = [node("MatMul", ["x", "w"], ["y"])]
    return save(
        path, nodes, [value("x", FLOAT, [8])], [value("y", FLOAT, [3])], [weight("w", 8, 3)]
    )


def scaled_by_a_scalar(path):
    """A batched MatMul scaled by a scalar input (no batch axis)."""
    nodes = [node("MatMul", ["x", "w"], ["h"]), node("Mul", ["h", "s"], ["y"])]
    inputs = [value("x", FLOAT, ["N", 8]), value("s", FLOAT, [])]
    return save(path, nodes, inputs, [value("y", FLOAT, ["N", 3])], [weight("w", 8, 3)])


def two_in_two_out(path):
    """Two inputs, two outputs: a MatMul of one, the sum of both."""
    nodes = [node("MatMul", ["a", "w"], ["scores"]), node("Add", ["a", "b"], ["total"])]
    inputs = [value("a", FLOAT, ["N", 8]), value("b", FLOAT, ["N", 8])]
    outputs = [value("scores", FLOAT, ["N", 3]), value("total", FLOAT, ["N", 8])]
    return save(path, nodes, inputs, outputs, [weight("w", 8, 3)])


def dynamic_height_width(path):
    """A Conv over an image of any height and width, pooled to 4 features."""
    nodes = [
        node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        node("GlobalAveragePool", ["c"], ["g"]),
        node("Flatten", ["g"], ["y"]),
    ]
    inputs = [value("x", FLOAT, ["N", 3, "H", "W"])]
    return save(path, nodes, inputs, [value("y", FLOAT, ["N", 4])], [weight("w", 4, 3, 3, 3)])


def batch_entry(shape, batch, dynamic=None):
    """Return a contract entry: the input's shape, its batch sizes (None: no batch axis)."""
    return {"shape": shape, "batch": batch, "dynamic": dynamic or {}}
