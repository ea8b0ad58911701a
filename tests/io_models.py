"""Tiny ONNX models with several inputs of several dtypes, made at test time, and their versions.

`io_model` gives one Cast-to-float output per input, so any dtype, shape or
number of inputs can be described in one line; `io_version` stores it as a
version of a new model of the team, with the contract the test gives.
"""

import onnx
from django.core.files.uploadedfile import SimpleUploadedFile
from onnx import TensorProto, helper

from deployhub.registry.models import Model
from deployhub.registry.uploads import create_version

FLOAT, INT64, BOOL, UINT8 = (
    TensorProto.FLOAT,
    TensorProto.INT64,
    TensorProto.BOOL,
    TensorProto.UINT8,
)


def io_model(inputs):
    """Return the bytes of a model that casts each (name, elem_type, shape) input to float."""
    nodes = [helper.make_node("Cast", [name], [f"{name}_out"], to=FLOAT) for name, _, _ in inputs]
    graph = helper.make_graph(
        nodes,
        "io",
        [helper.make_tensor_value_info(name, kind, shape) for name, kind, shape in inputs],
        [helper.make_tensor_value_info(f"{name}_out", FLOAT, shape) for name, _, shape in inputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def io_version(team, user, inputs, contract=None, name="io"):
    """Store io_model(inputs) as version 1 of a new model of the team."""
    model = Model.objects.create(team=team, name=name, created_by=user)
    upload = SimpleUploadedFile(f"{name}.onnx", io_model(inputs))
    return create_version(model, upload, user, contract=contract)
