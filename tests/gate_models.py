"""Versions of the demo's digits CNN that differ only in speed, for the gate's pipeline test.

busy_digits(path, layers) writes digits_cnn_v2.onnx with a chain of `layers` MatMul+Relu
layers on the side whose result is multiplied by zero and added to the logits: the same
predictions (so the same accuracy), slower the more layers it has. Nothing is downloaded.
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

ASSETS = Path(__file__).resolve().parent.parent / "deployhub" / "demo" / "assets"

WIDTH = 256  # the chain works on the image as rows of 256 values: [N * 12, 256]


def busy_digits(path, layers):
    """Write the digits CNN with `layers` layers of busywork beside it; return the path."""
    model = onnx.load(str(ASSETS / "digits_cnn_v2.onnx"))
    graph = model.graph
    if layers:
        [last] = [node for node in graph.node if "logits" in node.output]
        last.output[0] = "logits_alone"
        graph.node.extend(_busywork(layers))
        graph.initializer.extend(_weights())
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _busywork(layers):
    nodes = [helper.make_node("Reshape", ["image", "busy_shape"], ["busy_0"])]
    for layer in range(layers):
        nodes.append(helper.make_node("MatMul", [f"busy_{layer}", "busy_w"], [f"mm_{layer}"]))
        nodes.append(helper.make_node("Tanh", [f"mm_{layer}"], [f"busy_{layer + 1}"]))
    return nodes + [
        helper.make_node("ReduceSum", [f"busy_{layers}"], ["busy_sum"], keepdims=0),
        helper.make_node("Mul", ["busy_sum", "busy_zero"], ["nothing"]),
        helper.make_node("Add", ["logits_alone", "nothing"], ["logits"]),
    ]


def _weights():
    """One weight every layer shares (the file stays small however long the chain is)."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((WIDTH, WIDTH)) * 2 / np.sqrt(WIDTH)  # values stay near 1
    return [
        numpy_helper.from_array(weight.astype(np.float32), "busy_w"),
        numpy_helper.from_array(np.array([-1, WIDTH], dtype=np.int64), "busy_shape"),
        numpy_helper.from_array(np.array(0.0, dtype=np.float32), "busy_zero"),
    ]
