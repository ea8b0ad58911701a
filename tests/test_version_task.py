"""A version's task: proposed from its graph at upload, confirmed or corrected on its page and
through the API, and handed to every evaluation of its engines."""

import json

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from onnx import TensorProto, helper, numpy_helper

from deployhub.evaluation.actions import request_evaluation
from deployhub.registry.models import ModelVersion
from deployhub.teams.models import Event
from tests.api_calls import token_for
from tests.conftest import PASSWORD, stored_engine

pytestmark = pytest.mark.django_db


def yolo_head(anchors=300, classes=3):
    """A detector-shaped graph nobody designed for DeployHub: image -> [1, 4 + C, anchors]."""
    channels = 4 + classes
    weight = numpy_helper.from_array(
        np.random.default_rng(0).normal(size=(channels, 3, 1, 1)).astype(np.float32), "w"
    )
    shape = numpy_helper.from_array(np.array([1, channels, anchors], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["images", "w"], ["features"]),
            helper.make_node("Reshape", ["features", "shape"], ["output0"]),
        ],
        "yolo_head",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 10, anchors // 10])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, channels, anchors])],
        [weight, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture
def detector(client, alice):
    headers = token_for(alice)
    answer = client.post(
        "/api/v1/models",
        {"name": "yolo", "file": SimpleUploadedFile("yolo.onnx", yolo_head())},
        **headers,
    )
    assert answer.status_code == 201, answer.content
    return ModelVersion.objects.get(model__name="yolo"), headers


def test_it_proposes_a_detector_from_its_head_at_upload(detector):
    version, _ = detector
    assert version.task["task"] == "detection"
    assert version.task["params"]["head"] == "anchors_last"
    assert version.task["params"]["classes"] == 3
    assert version.task["confirmed"] is False
    assert "output0" in version.task["why"] or "[1, 7, 300]" in version.task["why"]


def test_the_team_confirms_or_corrects_the_task_through_the_api(client, detector):
    version, headers = detector
    url = f"/api/v1/versions/{version.pk}/task"
    assert client.get(url, **headers).json()["task"] == "detection"

    answer = client.put(
        url,
        json.dumps({"task": "detection", "params": {"score_threshold": 0.4}}),
        content_type="application/json",
        **headers,
    )

    assert answer.status_code == 200, answer.content
    version.refresh_from_db()
    assert version.task["confirmed"] and version.task["params"]["score_threshold"] == 0.4
    assert version.task["params"]["head"] == "anchors_last"  # the rest filled in
    assert version.task["params"]["image_size"] == [10, 30]  # boxes still clipped to the image
    assert Event.objects.filter(verb="version.task_declared").count() == 1


@pytest.mark.parametrize(
    "body, error",
    [
        ({"task": "astrology"}, "'astrology' is not a task"),
        ({"task": "detection", "params": {"output": "nope"}}, "nope"),
        ({"task": "detection", "params": {"score_threshold": "high"}}, "score_threshold"),
        ({"task": "detection", "params": [1]}, "JSON object"),
        (
            {"task": "detection", "params": {"head": "nms_outputs", "outputs": {"boxes": ["b"]}}},
            "outputs",
        ),
        ({"task": {"detection": 1}}, "Say which task"),
    ],
)
def test_a_bad_declaration_is_refused_and_changes_nothing(client, detector, body, error):
    version, headers = detector
    before = version.task
    answer = client.put(
        f"/api/v1/versions/{version.pk}/task",
        json.dumps(body),
        content_type="application/json",
        **headers,
    )
    assert answer.status_code == 400
    assert error in answer.json()["error"]
    version.refresh_from_db()
    assert version.task == before
    assert not Event.objects.filter(verb="version.task_declared").exists()


def test_the_version_page_shows_and_takes_the_task(client, alice, detector):
    version, _ = detector
    client.login(username="alice", password=PASSWORD)
    page = client.get(version.get_absolute_url()).content.decode()
    assert 'id="task-name">detection<' in page and "proposed: confirm or correct it" in page

    refused = client.post(
        f"/versions/{version.pk}/task", {"task": "detection", "params": "{not json"}
    )
    assert refused.status_code == 400
    answer = client.post(
        f"/versions/{version.pk}/task",
        {"task": "detection", "params": json.dumps({"iou_threshold": 0.6})},
    )
    assert answer.status_code == 302
    version.refresh_from_db()
    assert version.task["confirmed"] and version.task["params"]["iou_threshold"] == 0.6


def test_a_viewer_cannot_declare_the_task(client, vera, detector):
    version, _ = detector
    client.login(username="vera", password=PASSWORD)
    answer = client.post(f"/versions/{version.pk}/task", {"task": "generic", "params": ""})
    assert answer.status_code == 403
    version.refresh_from_db()
    assert version.task["task"] == "detection"


def test_every_evaluation_reads_the_outputs_as_declared(alice, detector, device_class):
    version, _ = detector
    engine = stored_engine(version, device_class)
    from deployhub.registry.models import Dataset

    dataset = Dataset.objects.create(
        model=version.model, kind="validation", name="val", samples=4, size=1, input_dtype="float32"
    )
    job = request_evaluation(engine, alice, dataset=dataset)
    assert job.params["task"] == {"task": "detection", "params": version.task["params"]}


def test_a_version_stored_before_tasks_is_offered_a_proposal_and_judged_as_before(
    client, alice, detector, device_class
):
    version, _ = detector
    ModelVersion.objects.filter(pk=version.pk).update(task={})
    version.refresh_from_db()
    client.login(username="alice", password=PASSWORD)

    page = client.get(version.get_absolute_url()).content.decode()

    assert "none declared: judged as a classifier" in page and 'id="task-name">detection<' in page
    job = request_evaluation(
        stored_engine(version, device_class), alice, golden_set=None, dataset=_dataset(version)
    )
    assert "task" not in job.params  # still read as a classifier until a person confirms
    version.refresh_from_db()
    assert version.task == {}


def _dataset(version):
    from deployhub.registry.models import Dataset

    return Dataset.objects.create(
        model=version.model, kind="validation", name="v", samples=4, size=1, input_dtype="float32"
    )
