"""Read what an ONNX file declares, without running it.

The web process parses and checks models; it never loads them into a runtime.
External data is checked before the ONNX checker reads it: every location must
name a regular file inside the model's own folder.
"""

import math
import os
import re
import stat
from collections import Counter
from pathlib import Path, PurePosixPath

import onnx
from onnx import AttributeProto, TensorProto, helper

DEFAULT_DOMAINS = ("", "ai.onnx")
WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")
# The name a dynamic axis written as a negative size gets, followed by its index ("dim_0").
UNNAMED_DIM = "dim_"
SUB_BYTE_BITS = {
    getattr(TensorProto, name): bits
    for name, bits in (
        ("INT4", 4),
        ("UINT4", 4),
        ("FLOAT4E2M1", 4),
        ("INT2", 2),
        ("UINT2", 2),
        ("FLOAT6E2M3", 6),
        ("FLOAT6E3M2", 6),
    )
    if hasattr(TensorProto, name)
}


class InvalidModel(ValueError):
    """The uploaded file is not a model DeployHub can accept; the message says why."""


class UploadTooLarge(InvalidModel):
    """The upload is over DEPLOYHUB_MAX_UPLOAD_BYTES (HTTP 413)."""


class UnsafeExternalData(InvalidModel):
    """An external-data location would make the hub read outside the upload."""


def _dim(dim, axis):
    """Return a dim as its size, its symbolic name, or None when it has neither.

    Several exporters (paddle2onnx among them) write a dynamic axis as dim_value -1,
    which ONNX Runtime and OpenVINO read as dynamic: such an axis gets the name
    dim_<axis>, as if the exporter had named it. A dim_value of 0 stays a size: ONNX
    Runtime (1.32) holds that axis to zero, and OpenVINO (2026.4) cannot convert a
    convolution over it.
    """
    if dim.HasField("dim_value"):
        return dim.dim_value if dim.dim_value >= 0 else f"{UNNAMED_DIM}{axis}"
    if dim.HasField("dim_param"):
        return dim.dim_param
    return None


def _value_info(value):
    tensor = value.type.tensor_type
    dims = enumerate(tensor.shape.dim)
    shape = [_dim(d, axis) for axis, d in dims] if tensor.HasField("shape") else None
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


def _subgraphs(node):
    """Yield the graphs held in a node's attributes (If branches, Loop and Scan bodies)."""
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == AttributeProto.GRAPHS:
            yield from attr.graphs


def _graphs(graph):
    """Yield a graph and, depth first, every subgraph inside it."""
    yield graph
    for node in graph.node:
        for subgraph in _subgraphs(node):
            yield from _graphs(subgraph)


def _attribute_tensors(node):
    for attr in node.attribute:
        yield from ([attr.t] if attr.HasField("t") else attr.tensors)
        for sparse in (
            [attr.sparse_tensor] if attr.HasField("sparse_tensor") else attr.sparse_tensors
        ):
            yield from (sparse.values, sparse.indices)


def _stored_tensors(model):
    """Yield every tensor of the model that may keep its data in an external file."""
    graphs = list(_graphs(model.graph))
    function_nodes = [node for function in model.functions for node in function.node]
    for node in function_nodes:
        for subgraph in _subgraphs(node):
            graphs.extend(_graphs(subgraph))
    for graph in graphs:
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield from (sparse.values, sparse.indices)
    for node in function_nodes + [node for graph in graphs for node in graph.node]:
        yield from _attribute_tensors(node)


def _outside(location, why):
    return UnsafeExternalData(
        f"The model's external data {location!r} points outside the upload: {why}. "
        "Keep external data files next to the .onnx file and upload them together in one .zip."
    )


def _external_file(location, folder):
    """Return the path of an external-data file after proving it stays inside folder."""
    if not location:
        raise _outside(location, "its location is empty")
    if "\x00" in location or "\\" in location:
        raise _outside(location, "it contains a NUL or a backslash; use a plain relative path")
    if location.startswith("/") or WINDOWS_DRIVE.match(location):
        raise _outside(location, "it is an absolute path")
    if ".." in PurePosixPath(location).parts:
        raise _outside(location, "it climbs out of the model's folder with '..'")
    path = folder / location
    if not path.resolve().is_relative_to(folder):
        raise _outside(location, "it resolves, through a link, to a place outside the upload")
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise InvalidModel(
            f"The model's external data file {location!r} is missing: upload a .zip holding "
            "the .onnx file and its external data files side by side."
        ) from exc
    if not stat.S_ISREG(mode):
        raise _outside(location, "it is a link or a special file, not a regular file")
    return path


def _external_int(entries, key, location):
    value = entries.get(key, "0")
    if not value.isascii() or not value.isdigit():
        raise InvalidModel(
            f"The model's external data {location!r} has {key} {value!r}; "
            "it must be a non-negative whole number of bytes."
        )
    return int(value)


def _check_external_tensor(tensor, folder):
    """Check one tensor's external-data entries; return its location."""
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = entries.get("location", "")
    size = _external_file(location, folder).stat().st_size
    offset = _external_int(entries, "offset", location)
    length = _external_int(entries, "length", location) if "length" in entries else 0
    if offset > size or offset + length > size:
        raise InvalidModel(
            f"The model's external data {location!r} is shorter than the model says: tensor "
            f"{tensor.name!r} needs bytes {offset:,} to {offset + length:,} of a {size:,} byte "
            "file. Upload the external data files that were saved with this model."
        )
    return location


def _check_external_data(model, path):
    """Check every external-data reference of the model; return the sorted locations."""
    folder = Path(path).absolute().parent.resolve()
    return sorted(
        {
            _check_external_tensor(tensor, folder)
            for tensor in _stored_tensors(model)
            if tensor.data_location == TensorProto.EXTERNAL
        }
    )


def _check_input_sizes(inputs, limit):
    """Refuse inputs with more fixed elements than limit."""
    for value in inputs:
        fixed = [dim for dim in value["shape"] or [] if isinstance(dim, int)]
        elements = math.prod(fixed)
        if elements > limit:
            raise InvalidModel(
                f"Input {value['name']!r} declares {elements:,} elements (dims {value['shape']}); "
                f"the limit is {limit:,}. Export the model with the input shape it really "
                "receives, such as [1, 3, 224, 224], or make the batch dimension symbolic."
            )


def _op_name(node):
    if node.domain in DEFAULT_DOMAINS:
        return node.op_type
    return f"{node.domain}.{node.op_type}"


def _elements(tensor):
    return math.prod(tensor.dims)


def _nbytes(tensor):
    if tensor.data_type == TensorProto.STRING:
        return sum(len(item) for item in tensor.string_data)
    bits = SUB_BYTE_BITS.get(tensor.data_type)
    if bits is None:
        bits = 8 * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return math.ceil(_elements(tensor) * bits / 8)


def _graph_report(model):
    """Count nodes, operators and parameters, subgraphs included; read no tensor data."""
    graphs = list(_graphs(model.graph))
    nodes = [node for graph in graphs for node in graph.node]
    weights = [tensor for graph in graphs for tensor in graph.initializer]
    weights += [sparse.values for graph in graphs for sparse in graph.sparse_initializer]
    return {
        "nodes": len(nodes),
        "operators": dict(sorted(Counter(_op_name(node) for node in nodes).items())),
        "parameters": sum(_elements(tensor) for tensor in weights),
        "parameter_bytes": sum(_nbytes(tensor) for tensor in weights),
    }


def inspect_onnx(path, *, max_input_elements=10**9):
    """Parse, check and describe an ONNX file; raise InvalidModel with a reason."""
    model = _load(path)
    if not model.graph.node:
        raise InvalidModel("This is not an ONNX model: its graph has no nodes.")
    external_data = _check_external_data(model, path)
    initializers = {init.name for init in model.graph.initializer}
    # Old IR versions list initializers as graph inputs: those are weights, not inputs.
    inputs = [_value_info(v) for v in model.graph.input if v.name not in initializers]
    _check_input_sizes(inputs, max_input_elements)
    _check(path)
    default_opset = next(
        (op.version for op in model.opset_import if op.domain in DEFAULT_DOMAINS), None
    )
    return {
        "format": "onnx",
        "ir_version": model.ir_version,
        "opset": default_opset,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": inputs,
        "outputs": [_value_info(v) for v in model.graph.output],
        "graph": _graph_report(model),
        "external_data": external_data,
    }
