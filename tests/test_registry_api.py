"""The registry through the API, with personal tokens: the same uploads as the browser."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.registry.models import Model, ModelVersion
from deployhub.teams.models import ApiToken
from tests.api_calls import onnx_upload, token_for


def test_it_refuses_the_api_without_a_token(client, alice):
    response = client.get("/api/v1/models")
    assert response.status_code == 401 and "API token" in response.json()["error"]


def test_it_refuses_a_device_token_where_a_person_is_needed(client, make_device):
    _, token = make_device()
    response = client.get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 403 and "device token" in response.json()["error"]


def test_it_creates_a_model_with_its_first_version(client, alice):
    response = client.post(
        "/api/v1/models", {"name": "digits", "file": onnx_upload()}, **token_for(alice)
    )
    assert response.status_code == 201
    body = response.json()
    assert body["name"] == "digits" and body["version"]["number"] == 1
    assert body["version"]["inputs"][0]["shape"] == ["N", 3, 32, 32]
    assert body["version"]["graph"]["operators"]["Conv"] == 3


def test_it_uploads_a_new_version_and_lists_it(client, alice, version):
    headers = token_for(alice)
    response = client.post(
        f"/api/v1/models/{version.model.pk}/versions",
        {"file": onnx_upload("digits_cnn_v1.onnx"), "notes": "narrow"},
        **headers,
    )
    assert response.status_code == 201 and response.json()["number"] == 2
    listed = client.get(f"/api/v1/models/{version.model.pk}", **headers).json()
    assert [v["number"] for v in listed["versions"]] == [1, 2]


def test_it_answers_409_with_the_existing_version_for_a_duplicate(client, alice, version):
    response = client.post(
        f"/api/v1/models/{version.model.pk}/versions", {"file": onnx_upload()}, **token_for(alice)
    )
    assert response.status_code == 409
    assert response.json()["existing"]["id"] == version.pk
    assert ModelVersion.objects.count() == 1


def test_it_answers_400_with_the_reason_for_a_bad_file(client, alice, version, storage_root):
    response = client.post(
        f"/api/v1/models/{version.model.pk}/versions",
        {"file": SimpleUploadedFile("x.onnx", b"garbage" * 100)},
        **token_for(alice),
    )
    assert response.status_code == 400 and "not an ONNX model" in response.json()["error"]
    assert list((storage_root / "tmp").iterdir()) == []


def test_it_answers_413_over_the_size_cap(client, alice, version, settings, storage_root):
    settings.DEPLOYHUB_MAX_UPLOAD_BYTES = 10_000
    response = client.post(
        f"/api/v1/models/{version.model.pk}/versions",
        {"file": onnx_upload("digits_cnn_v1.onnx")},
        **token_for(alice),
    )
    assert response.status_code == 413
    assert "10,000" in response.json()["error"]
    assert list((storage_root / "tmp").iterdir()) == []


def test_it_refuses_a_viewer_and_hides_other_teams(client, vera, charlie, version):
    response = client.post(
        f"/api/v1/models/{version.model.pk}/versions",
        {"file": onnx_upload("digits_cnn_v1.onnx")},
        **token_for(vera),
    )
    assert response.status_code == 403
    assert client.get(f"/api/v1/versions/{version.pk}", **token_for(charlie)).status_code == 404
    assert client.get("/api/v1/models", **token_for(charlie)).json() == {"models": []}


def test_it_takes_a_spec_and_contract_as_json_fields(client, alice, demo_team):
    spec = '{"color_order": "BGR", "scale": 0.0039215686, "layout": "NCHW"}'
    contract = '{"inputs": {"image": {"shape": ["batch", 3, 32, 32], "batch": {"sizes": [1, 8]}}}}'
    response = client.post(
        "/api/v1/models",
        {"name": "bgr", "file": onnx_upload(), "preprocessing": spec, "contract": contract},
        **token_for(alice),
    )
    assert response.status_code == 201, response.json()
    version = response.json()["version"]
    assert version["preprocessing"]["color_order"] == "BGR"
    assert version["contract"]["inputs"]["image"]["batch"]["sizes"] == [1, 8]


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("contract", "{not json", "not valid JSON"),
        ("contract", '{"inputs": {"other": {}}}', "image"),
        ("preprocessing", '{"color_order": "CMYK"}', "color_order"),
    ],
)
def test_it_refuses_a_bad_spec_or_contract_and_stores_nothing(
    client, alice, demo_team, field, value, fragment
):
    response = client.post(
        "/api/v1/models", {"name": "bad", "file": onnx_upload(), field: value}, **token_for(alice)
    )
    assert response.status_code == 400
    assert fragment in response.json()["error"]
    assert not Model.objects.exists()


def test_a_revoked_token_stops_working(client, alice):
    headers = token_for(alice)
    ApiToken.objects.all().delete()
    assert client.get("/api/v1/models", **headers).status_code == 401
