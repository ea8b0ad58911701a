"""A small two-output model, a deliberately wrong copy, and golden files made by ONNX Runtime."""

import io
import zipfile

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

WEIGHT = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
BIAS = np.array([0.1, -0.2, 0.3], np.float32)
WRONG_BIAS = np.array([0.1, -0.2, 0.5], np.float32)


def linear_model(bias=BIAS):
    """Return an ONNX model: x [1, 4] -> logits = x @ W + bias [1, 3], features = relu(x) [1, 4]."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["scores"]),
            helper.make_node("Add", ["scores", "b"], ["logits"]),
            helper.make_node("Relu", ["x"], ["features"]),
        ],
        "golden-linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3]),
            helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 4]),
        ],
        initializer=[
            numpy_helper.from_array(WEIGHT, "W"),
            numpy_helper.from_array(np.asarray(bias, np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def golden_inputs(pairs=4):
    """Return golden feeds for linear_model: pairs x [1, 4] float32."""
    return np.random.default_rng(1).normal(size=(pairs, 1, 4)).astype(np.float32)


def run_model(model, inputs):
    """Return {output name: outputs stacked on a pair axis} of the model on each input."""
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [output.name for output in session.get_outputs()]
    runs = [session.run(None, {"x": x}) for x in inputs]
    return {name: np.stack([run[i] for run in runs]) for i, name in enumerate(names)}


def golden_npz(model=None, inputs=None, **overrides):
    """Return the bytes of an .npz of golden pairs made by ONNX Runtime on the model."""
    inputs = golden_inputs() if inputs is None else inputs
    arrays = {"x": inputs, **run_model(model or linear_model(), inputs), **overrides}
    arrays = {name: array for name, array in arrays.items() if array is not None}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def tensor_bytes(array, name=""):
    return numpy_helper.from_array(np.asarray(array), name).SerializeToString()


def golden_pb_zip(model=None, inputs=None, named=True, root="golden-linear", extra=None):
    """Return the bytes of a zip of ONNX test data (test_data_set_N/input_K.pb, output_K.pb)."""
    inputs = golden_inputs(3) if inputs is None else inputs
    outputs = run_model(model or linear_model(), inputs)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for n, x in enumerate(inputs):
            folder = f"{root}/test_data_set_{n}" if root else f"test_data_set_{n}"
            archive.writestr(f"{folder}/input_0.pb", tensor_bytes(x, "x" if named else ""))
            for k, name in enumerate(outputs):
                archive.writestr(
                    f"{folder}/output_{k}.pb", tensor_bytes(outputs[name][n], name if named else "")
                )
        for member, data in (extra or {}).items():
            archive.writestr(member, data)
    return buffer.getvalue()
