"""Convert to opset N: old operators become ones runtimes run, with the change measured.

The worker-side conversion (workers/checks/convert.py) on models made here; the
version page, the API and a real worker are tested at the end of this file.
"""

import json
import re

import numpy as np
import onnx
import onnxruntime
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from deployhub.engines.preflight import preflight
from deployhub.jobs.models import Job, JobKind, JobState
from deployhub.registry.models import ModelVersion
from tests.api_calls import token_for
from tests.conformance_models import modernised_opset6, write_old_opset6_batchnorm_add
from tests.conftest import PASSWORD, wait_until
from tests.foreign_models import (
    axis_broadcast_model,
    legacy_broadcast_model,
    old_opset_model,
    sample_input,
    unconvertible_model,
    unknown_rank_model,
)
from workers.checks.convert import convert_onnx
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


def converted_nodes(path):
    """Return (op types, {initializer name: shape}) of a saved model."""
    model = onnx.load(str(path))
    shapes = {tensor.name: list(tensor.dims) for tensor in model.graph.initializer}
    return [node.op_type for node in model.graph.node], shapes


def test_it_aligns_a_bias_added_at_axis_1_the_numpy_way_before_converting(tmp_path):
    source, converted = tmp_path / "axis.onnx", tmp_path / "converted.onnx"
    onnx.save(axis_broadcast_model(), str(source))

    report = convert_onnx(source, converted, {"convert_to_opset": 17})

    # onnx.version_converter alone makes the [4] offset [4, 1, 1, 1]: the batch broadcast to 4
    ops, shapes = converted_nodes(converted)
    assert ops == ["Conv", "BatchNormalization", "Add"] and shapes["offset"] == [4, 1, 1]
    assert report["max_abs_diff"] < 1e-4
    # the same model written without an axis: its offset already [4, 1, 1]
    twin = old_opset_model()
    [offset] = [tensor for tensor in twin.graph.initializer if tensor.name == "offset"]
    offset.CopyFrom(
        numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(4, 1, 1), "offset")
    )
    x = sample_input()
    [got] = onnxruntime.InferenceSession(str(converted)).run(None, {"x": x})
    np.testing.assert_allclose(got, ReferenceEvaluator(twin).run(None, {"x": x})[0], atol=1e-5)


def test_it_converts_the_corpus_opset_6_model_with_its_batchnorm_and_bias_add(tmp_path):
    source = write_old_opset6_batchnorm_add(tmp_path)
    converted = tmp_path / "converted.onnx"

    report = convert_onnx(source, converted, {"convert_to_opset": 17})

    assert report["source_opset"] == 6 and report["max_abs_diff"] < 1e-4
    assert converted_nodes(converted)[1]["shift"] == [8, 1, 1]
    image = np.random.default_rng(2).normal(size=(1, 3, 16, 16)).astype(np.float32)
    twin = onnxruntime.InferenceSession(modernised_opset6(onnx.load(str(source))))
    [got] = onnxruntime.InferenceSession(str(converted)).run(None, {"image": image})
    np.testing.assert_allclose(got, twin.run(None, {"image": image})[0], atol=1e-4)


NUMPY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power}


@pytest.mark.parametrize(
    ("op_type", "operand", "axis", "nodes"),
    [
        *((op, "weight", 1, [op]) for op in NUMPY),
        ("Mul", "weight", -3, ["Mul"]),
        ("Mul", "shared", 1, ["Mul", "Add"]),
        ("Mul", "input", 1, ["Constant", "Unsqueeze", "Mul"]),
    ],
)
def test_it_aligns_every_legacy_broadcast_at_its_axis(tmp_path, op_type, operand, axis, nodes):
    source, converted = tmp_path / "legacy.onnx", tmp_path / "converted.onnx"
    onnx.save(legacy_broadcast_model(op_type, operand, axis), str(source))

    report = convert_onnx(source, converted, {"convert_to_opset": 17})

    assert report["max_abs_diff"] < 1e-4
    ops, shapes = converted_nodes(converted)
    assert ops == nodes
    if operand == "shared":  # the Add still reads the [3] weight; the Mul a reshaped copy
        assert sorted(shapes.values()) == [[3], [3, 1, 1]]
    x, b = sample_input(), np.array([2.0, 3.0, 4.0], np.float32)
    feeds = {"x": x, "b": b} if operand == "input" else {"x": x}
    got = onnxruntime.InferenceSession(str(converted)).run(["y"], feeds)[0]
    np.testing.assert_allclose(got, NUMPY[op_type](x, b.reshape(3, 1, 1)), rtol=1e-5)


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        # the converter has no adapter from Greater-1 to Greater-7
        (unconvertible_model, "No Adapter From Version $6 for Greater"),
        # the alignment needs A's rank; the node is left to the converter, which says why
        (unknown_rank_model, "Shape of input 0 is not available"),
    ],
)
def test_it_fails_with_the_converters_message_when_it_cannot_convert(tmp_path, model, reason):
    source, converted = tmp_path / "old.onnx", tmp_path / "converted.onnx"
    onnx.save(model(), str(source))

    with pytest.raises(JobError) as failure:
        convert_onnx(source, converted, {"convert_to_opset": 17})

    message = str(failure.value)
    assert message.startswith(
        "unsupported_operator: onnx.version_converter could not convert opset 6 to 17: "
    )
    assert reason in message
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


def test_it_says_which_input_shapes_the_converted_model_refused(old_file, tmp_path):
    params = {"convert_to_opset": 17, "input_shapes": {"x": [1, 3, 4, 4]}}

    with pytest.raises(JobError, match=r"fails in ONNX Runtime on x \[1, 3, 4, 4\]: ") as failure:
        convert_onnx(old_file, tmp_path / "converted.onnx", params)
    # ONNX Runtime names the axis and sizes on the lines after "for the following indices"
    assert re.search(
        r"for the following indices index: \d+ Got: \d+ Expected: \d+", str(failure.value)
    )


def test_it_refuses_to_convert_a_model_to_the_opset_it_has(old_file, tmp_path):
    at_17, again = tmp_path / "at17.onnx", tmp_path / "again.onnx"
    convert_onnx(old_file, at_17, {"convert_to_opset": 17})

    with pytest.raises(JobError, match="at opset 17 already: nothing to convert"):
        convert_onnx(at_17, again, {"convert_to_opset": 17})
    assert not again.exists()


def upload(client, alice, path, name="old-zoo-model"):
    """Upload an ONNX file as a new model through the API; return its first version."""
    response = client.post(
        "/api/v1/models",
        {"name": name, "file": SimpleUploadedFile(path.name, path.read_bytes())},
        **token_for(alice),
    )
    assert response.status_code == 201, response.json()
    return ModelVersion.objects.get(pk=response.json()["version"]["id"])


def convert_by_api(client, alice, version, body):
    return client.post(
        f"/api/v1/versions/{version.pk}/convert",
        json.dumps(body),
        content_type="application/json",
        **token_for(alice),
    )


def finished(job_id, worker):
    return wait_until(
        lambda: (job := Job.objects.get(pk=job_id)).is_final and job,
        120,
        "the conversion job to finish",
        on_timeout=worker.output,
    )


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_an_old_opset_upload_is_converted_on_a_worker_and_then_passes_preflight(
    client, alice, device_class, make_device, start_worker, tmp_path
):
    device, token = make_device()
    worker = start_worker(device, token)
    device.refresh_from_db()
    path = tmp_path / "old.onnx"
    onnx.save(axis_broadcast_model(), str(path))  # a [4] bias added at axis 1
    source = upload(client, alice, path)
    [before] = preflight(source, device_class, ["onnxruntime"])
    assert any("opset 6 is older than onnxruntime runs (≥ 7)" in why for why in before.fails)

    answer = convert_by_api(client, alice, source, {})

    assert answer.status_code == 202, answer.json()
    assert answer.json()["opset"] == 17
    job = finished(answer.json()["job"], worker)
    assert job.state == JobState.SUCCEEDED, job.log + job.error
    child = ModelVersion.objects.get(parent=source)
    assert child.opset == 17 and child.format == "onnx"
    assert child.export_report["source_opset"] == 6
    assert child.export_report["max_abs_diff"] < 1e-4
    assert child.notes.startswith(
        f"Converted from v1 (opset 6) to opset 17 with onnx.version_converter by job #{job.pk}."
    )
    [after] = preflight(child, device_class, ["onnxruntime"])
    assert not any("opset" in why for why in after.fails)
    client.login(username="alice", password=PASSWORD)
    page = client.get(source.get_absolute_url()).content.decode()
    assert f'href="{child.get_absolute_url()}"' in page and "converted to opset 17" in page
    assert (
        "opset 6 → 17 with onnx.version_converter"
        in client.get(child.get_absolute_url()).content.decode()
    )


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_conversion_the_converter_cannot_do_fails_with_its_message_and_no_child(
    client, alice, device_class, make_device, start_worker, tmp_path
):
    device, token = make_device()
    worker = start_worker(device, token)
    path = tmp_path / "greater.onnx"
    onnx.save(unconvertible_model(), str(path))
    source = upload(client, alice, path)

    answer = convert_by_api(client, alice, source, {"opset": 13})

    job = finished(answer.json()["job"], worker)
    assert job.state == JobState.FAILED
    assert job.failure_category == "unsupported_operator"
    assert "onnx.version_converter could not convert opset 6 to 13" in job.error
    assert "No Adapter From Version $6 for Greater" in job.error
    assert not ModelVersion.objects.filter(parent=source).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"opset": 5}, "The opset must be a whole number from 7 to"),
        ({"opset": "seventeen"}, "The opset must be a whole number from 7 to"),
        ({"opset": 17, "device_class": "nowhere"}, "has no device class 'nowhere'"),
        ([17], "The body must be a JSON object"),
    ],
)
def test_the_api_refuses_a_conversion_it_cannot_queue_and_queues_nothing(
    client, alice, version, device_class, body, message
):
    answer = convert_by_api(client, alice, version, body)

    assert answer.status_code == 400 and message in answer.json()["error"]
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_api_refuses_to_convert_a_version_with_external_data(client, alice, version):
    type(version).objects.filter(pk=version.pk).update(external_data=["weights.bin"])

    answer = convert_by_api(client, alice, version, {})

    assert answer.status_code == 400
    assert "keeps its weights in external data files" in answer.json()["error"]
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_version_page_offers_the_conversion_and_refuses_a_bad_opset(
    client, alice, version, device_class
):
    client.login(username="alice", password=PASSWORD)

    page = client.get(version.get_absolute_url()).content.decode()
    refused = client.post(f"/versions/{version.pk}/convert", {"opset": "x"}, follow=True)
    queued = client.post(
        f"/versions/{version.pk}/convert", {"opset": "13", "device_class": device_class.pk}
    )

    assert 'id="convert-form"' in page and "Convert to opset" in page
    assert "Not converted: The opset must be a whole number from 7 to" in refused.content.decode()
    assert queued.status_code == 302
    [job] = Job.objects.all()
    assert job.kind == JobKind.EXPORT and job.params["convert_to_opset"] == 13


@pytest.mark.django_db
def test_a_viewer_cannot_convert(client, vera, version, device_class):
    answer = convert_by_api(client, vera, version, {})

    assert answer.status_code == 403
    assert not Job.objects.exists()
