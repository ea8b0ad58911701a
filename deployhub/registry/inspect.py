"""Read what an ONNX file declares, without running it.

The web process parses and checks models; it never loads them into a runtime.
"""

import onnx
from onnx import TensorProto


class InvalidModel(ValueError):
    """The uploaded file is not a model DeployHub can accept; the message says why."""


def _dim(dim):
    if dim.HasField("dim_value"):
        return dim.dim_value
    if dim.HasField("dim_param"):
        return dim.dim_param
    return None


def _value_info(value):
    tensor = value.type.tensor_type
    shape = [_dim(d) for d in tensor.shape.dim] if tensor.HasField("shape") else None
    return {
        "name": value.name,
        "dtype": TensorProto.DataType.Name(tensor.elem_type).lower(),
        "shape": shape,
    }


def _load(path):
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several unrelated types
        raise InvalidModel(
            f"This is not an ONNX model: it could not be parsed as ONNX protobuf ({exc})."
        ) from exc


def _check(path):
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        first_line = str(exc).strip().splitlines()[0]
        raise InvalidModel(f"The ONNX checker rejected this model: {first_line}") from exc


def inspect_onnx(path):
    """Parse, check and describe an ONNX file; raise InvalidModel with a reason."""
    model = _load(path)
    if not model.graph.node:
        raise InvalidModel("This is not an ONNX model: its graph has no nodes.")
    _check(path)
    initializers = {init.name for init in model.graph.initializer}
    default_opset = next(
        (op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), None
    )
    return {
        "format": "onnx",
        "ir_version": model.ir_version,
        "opset": default_opset,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        # Old IR versions list initializers as graph inputs: those are weights, not inputs.
        "inputs": [_value_info(v) for v in model.graph.input if v.name not in initializers],
        "outputs": [_value_info(v) for v in model.graph.output],
    }
