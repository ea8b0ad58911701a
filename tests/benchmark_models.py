"""Tiny ONNX models and named test doubles for the benchmark harness's tests."""

import time
from collections import namedtuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

InputMeta = namedtuple("InputMeta", "name shape type")


def save_model(path, nodes, input_shape, output_shape, initializers=()):
    """Save a one-input, one-output float model and return its path."""
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def matmul_relu(path):
    """x[N, 8] @ w[8, 8] -> Relu, with a symbolic batch dimension N."""
    weight = numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return save_model(path, nodes, ["N", 8], ["N", 8], [weight])


def matmul_chain(path, width=256, layers=20):
    """x[N, width] through `layers` MatMul+Relu layers: slow enough to overload on purpose."""
    rng = np.random.default_rng(0)
    scale = 1 / np.sqrt(width)
    weights, nodes, previous = [], [], "x"
    for layer in range(layers):
        weight = (rng.standard_normal((width, width)) * scale).astype(np.float32)
        weights.append(numpy_helper.from_array(weight, f"w{layer}"))
        output = "y" if layer == layers - 1 else f"h{layer}"
        nodes.append(helper.make_node("MatMul", [previous, f"w{layer}"], [f"m{layer}"]))
        nodes.append(helper.make_node("Relu", [f"m{layer}"], [output]))
        previous = output
    return save_model(path, nodes, ["N", width], ["N", width], weights)


def count_session_runs(monkeypatch):
    """Count every ONNX Runtime session.run from now on; return the list that grows by one each."""
    import onnxruntime

    calls = []
    real_run = onnxruntime.InferenceSession.run
    monkeypatch.setattr(
        onnxruntime.InferenceSession,
        "run",
        lambda self, *a, **k: calls.append(1) or real_run(self, *a, **k),
    )
    return calls


def fixed_batch_of_one(path):
    """A Relu whose batch dimension is fixed at 1."""
    return save_model(path, [helper.make_node("Relu", ["x"], ["y"])], [1, 8], [1, 8])


class SleepyTestSession:
    """A test double of an ONNX Runtime session whose runs sleep for the times given in turn.

    `durations_s(call_index)` returns how long the call-th run sleeps.
    """

    def __init__(self, durations_s):
        self.durations_s = durations_s
        self.calls = 0

    def run(self, _output_names, feeds):
        time.sleep(self.durations_s(self.calls))
        self.calls += 1
        return [next(iter(feeds.values()))]

    def get_inputs(self):
        return [InputMeta("x", ["N", 4], "tensor(float)")]

    def get_providers(self):
        return ["SleepyTestProvider"]
