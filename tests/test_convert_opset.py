"""Convert to opset N: old operators become ones runtimes run, with the change measured.

The worker-side conversion (workers/convert.py) on models made here; the
version page, the API and a real worker are tested at the end of this file.
"""

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx.reference import ReferenceEvaluator

from tests.foreign_models import axis_broadcast_model, old_opset_model, sample_input
from workers.convert import convert_onnx
from workers.errors import JobError


@pytest.fixture
def old_file(tmp_path):
    path = tmp_path / "old.onnx"
    onnx.save(old_opset_model(), str(path))
    return path


def test_it_converts_opset_6_operators_to_opset_17_that_onnx_runtime_runs(old_file, tmp_path):
    converted = tmp_path / "converted.onnx"

    report = convert_onnx(old_file, converted, {"convert_to_opset": 17})

    model = onnx.load(str(converted))
    assert [entry.version for entry in model.opset_import if entry.domain == ""] == [17]
    assert model.ir_version >= 4
    x = sample_input()
    [got] = onnxruntime.InferenceSession(str(converted)).run(None, {"x": x})
    [expected] = ReferenceEvaluator(old_opset_model()).run(None, {"x": x})
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert report["source_opset"] == 6 and report["opset"] == 17
    assert report["max_abs_diff"] < 1e-5 and report["samples"] == 4
    assert report["reference"] == "onnx.reference.ReferenceEvaluator"


def test_it_fails_with_the_converters_message_when_the_conversion_is_wrong(tmp_path):
    source, converted = tmp_path / "axis.onnx", tmp_path / "converted.onnx"
    onnx.save(axis_broadcast_model(), str(source))

    with pytest.raises(JobError) as failure:
        convert_onnx(source, converted, {"convert_to_opset": 17})

    message = str(failure.value)
    assert message.startswith(
        "unsupported_operator: onnx.version_converter could not convert opset 6 to 17: "
    )
    assert "ShapeInferenceError" in message
    assert not converted.exists()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"convert_to_opset": 5}, "convert_to_opset must be a whole number from 7 to"),
        ({"convert_to_opset": "17"}, "convert_to_opset must be a whole number from 7 to"),
        ({"convert_to_opset": 6}, "convert_to_opset must be a whole number from 7 to"),
        ({"convert_to_opset": 17, "samples": 0}, "samples must be a whole number of at least 1"),
    ],
)
def test_it_refuses_settings_it_cannot_convert_with(old_file, tmp_path, params, message):
    with pytest.raises(JobError, match=message):
        convert_onnx(old_file, tmp_path / "converted.onnx", params)


def test_it_refuses_to_convert_a_model_to_the_opset_it_has(old_file, tmp_path):
    at_17, again = tmp_path / "at17.onnx", tmp_path / "again.onnx"
    convert_onnx(old_file, at_17, {"convert_to_opset": 17})

    with pytest.raises(JobError, match="at opset 17 already: nothing to convert"):
        convert_onnx(at_17, again, {"convert_to_opset": 17})
    assert not again.exists()
