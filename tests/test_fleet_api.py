"""The engines of API v1 as a pipeline reads them: listed and filtered, paged per version,
checked against a machine's fingerprint, rebuilt; another team's are not there."""

import copy
import json

import pytest
from django.core.files import File

from deployhub.devices.models import Device, DeviceClass, FingerprintChange
from deployhub.engines.models import Engine
from deployhub.jobs.models import Job
from deployhub.registry.models import Model
from deployhub.registry.uploads import create_version
from tests.api_calls import token_for
from tests.compile_jobs import FINGERPRINT, build, compile_
from tests.conftest import ASSETS, stored_engine

pytestmark = pytest.mark.django_db


def get(client, user, path, scope="full"):
    return client.get(f"/api/v1/{path}", **token_for(user, scope))


def post(client, user, path, body, scope="full"):
    body = json.dumps(body)
    headers = token_for(user, scope)
    return client.post(f"/api/v1/{path}", body, content_type="application/json", **headers)


def ids(answer):
    assert answer.status_code == 200, answer.json()
    return [engine["id"] for engine in answer.json()["items"]]


@pytest.fixture
def built(client, version, device_class, alice, make_device):
    """An engine built on the class's device, whose fingerprint is FINGERPRINT."""
    _, token = make_device("line-1")
    build(client, compile_(version, device_class, alice)[1], token)
    return Engine.objects.get()


def test_it_lists_the_teams_engines_filtered_by_model_version_class_and_backend(
    client, demo_team, version, device_class, alice, charlie
):
    edge = DeviceClass.objects.create(team=demo_team, slug="edge", name="Edge")
    other = Model.objects.create(team=demo_team, name="other", created_by=alice)
    with open(ASSETS / "digits_cnn_v1.onnx", "rb") as handle:
        other_version = create_version(other, File(handle, name="v1.onnx"), alice)
    first = stored_engine(version, device_class)
    openvino = stored_engine(version, device_class, {"device": "CPU"}, backend="openvino")
    on_edge = stored_engine(version, edge)
    of_other = stored_engine(other_version, device_class)

    assert ids(get(client, alice, "engines")) == [of_other.pk, on_edge.pk, openvino.pk, first.pk]
    assert ids(get(client, alice, f"engines?model={version.model_id}")) == [
        on_edge.pk,
        openvino.pk,
        first.pk,
    ]
    assert ids(get(client, alice, f"engines?version={other_version.pk}")) == [of_other.pk]
    assert ids(get(client, alice, "engines?device_class=edge")) == [on_edge.pk]
    assert ids(get(client, alice, "engines?backend=openvino")) == [openvino.pk]
    query = f"engines?device_class={device_class.slug}&backend=onnxruntime&limit=1"
    answer = get(client, alice, query, scope="pipeline")
    assert ids(answer) == [of_other.pk] and answer.json()["count"] == 2
    assert get(client, charlie, "engines").json() == {"items": [], "count": 0}
    assert get(client, alice, "engines?model=x").status_code == 400


def test_it_pages_a_versions_engines(client, version, device_class, alice, charlie):
    engines = [stored_engine(version, device_class) for _ in range(3)]

    answer = get(client, alice, f"versions/{version.pk}/engines?limit=2").json()

    assert [e["id"] for e in answer["items"]] == [engines[2].pk, engines[1].pk]
    assert answer["count"] == 3
    assert answer["items"][0]["release_gates"][0]["gate"] == "parity"
    assert get(client, charlie, f"versions/{version.pk}/engines").status_code == 404


def test_it_says_whether_a_fingerprint_runs_an_engine_and_stores_nothing(client, built, alice):
    devices = list(Device.objects.values("pk", "fingerprint"))
    path = f"engines/{built.pk}/compatibility"

    same = post(client, alice, path, {"fingerprint": FINGERPRINT}, scope="pipeline")
    upgraded = copy.deepcopy(FINGERPRINT)
    upgraded["onnxruntime"]["version"] = "1.33.0"
    other = post(client, alice, path, {"fingerprint": upgraded})

    assert same.status_code == 200
    assert same.json() == {"runs": True, "reason": "", "differences": {}}
    assert other.status_code == 200 and other.json()["runs"] is False
    assert other.json()["reason"].startswith("This engine was built for another toolchain")
    assert ["1.32.0", "1.33.0"] in other.json()["differences"].values()
    assert list(Device.objects.values("pk", "fingerprint")) == devices
    assert not FingerprintChange.objects.exists()


@pytest.mark.parametrize(
    "body, says",
    [
        ({}, "Say 'fingerprint'"),
        ({"fingerprint": "linux"}, "'fingerprint': Input should be a valid dictionary"),
        ({"fingerprint": {"os": "Linux"}}, "os"),
        ({"fingerprint": FINGERPRINT, "device": 1}, "Unknown field 'device'."),
    ],
)
def test_it_refuses_a_fingerprint_it_cannot_read(client, version, device_class, alice, body, says):
    engine = stored_engine(version, device_class)

    answer = post(client, alice, f"engines/{engine.pk}/compatibility", body)

    assert answer.status_code == 400 and says in answer.json()["error"]


def test_another_team_cannot_check_or_read_an_engine(client, version, device_class, charlie):
    engine = stored_engine(version, device_class)
    body = {"fingerprint": FINGERPRINT}

    assert post(client, charlie, f"engines/{engine.pk}/compatibility", body).status_code == 404
    assert get(client, charlie, f"engines/{engine.pk}").status_code == 404


def test_a_rebuild_reuses_the_stored_engine_and_a_viewer_may_not_ask(client, built, alice, vera):
    answer = post(client, alice, f"engines/{built.pk}/rebuild", {}, scope="pipeline")

    assert answer.status_code == 200
    assert answer.json()["reused"] is True and answer.json()["engine"]["id"] == built.pk
    refused = post(client, vera, f"engines/{built.pk}/rebuild", {})
    assert refused.status_code == 403 and "engineer role" in refused.json()["error"]
    assert Job.objects.count() == 1  # the first build's compile only
