"""The registry through the API, with personal tokens: the same uploads as the browser."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.registry.models import Model, ModelVersion
from deployhub.registry.uploads import derive_version
from deployhub.teams.models import ApiToken, Event
from tests.api_calls import onnx_upload, token_for
from tests.conftest import ASSETS


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
    assert client.get("/api/v1/models", **token_for(charlie)).json() == {"items": [], "count": 0}


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


def test_it_lists_models_a_page_at_a_time(client, alice, demo_team):
    for name in ("c", "a", "b"):
        Model.objects.create(team=demo_team, name=name)
    headers = token_for(alice)

    first = client.get("/api/v1/models?limit=2", **headers).json()
    rest = client.get("/api/v1/models?limit=2&offset=2", **headers).json()

    assert [m["name"] for m in first["items"]] == ["a", "b"] and first["count"] == 3
    assert [m["name"] for m in rest["items"]] == ["c"]


def test_it_lists_a_models_versions(client, alice, version):
    derive_version(version, alice, preprocessing={"scale": 0.5, "layout": "NCHW"})

    body = client.get(f"/api/v1/models/{version.model_id}/versions", **token_for(alice)).json()

    assert [v["number"] for v in body["items"]] == [1, 2] and body["count"] == 2


def test_it_refuses_an_upload_without_a_file_and_stores_nothing(client, alice, demo_team):
    response = client.post("/api/v1/models", {"name": "digits"}, **token_for(alice))

    assert response.status_code == 400 and "file" in response.json()["error"]
    assert not Model.objects.exists()


def test_it_serves_a_versions_file_to_its_team_only(client, alice, charlie, version):
    response = client.get(f"/api/v1/versions/{version.pk}/download", **token_for(alice))

    assert response.status_code == 200
    assert b"".join(response.streaming_content) == (ASSETS / "digits_cnn_v2.onnx").read_bytes()
    assert 'filename="digits_cnn_v2.onnx"' in response["Content-Disposition"]
    other = client.get(f"/api/v1/versions/{version.pk}/download", **token_for(charlie))
    assert other.status_code == 404 and other.json() == {"error": "Not found."}


def test_it_names_a_versions_download_in_its_json(client, alice, version):
    body = client.get(f"/api/v1/versions/{version.pk}", **token_for(alice)).json()
    assert body["download"] == f"/api/v1/versions/{version.pk}/download"


def test_it_shows_a_versions_lineage(client, alice, version):
    child = derive_version(version, alice, preprocessing={"scale": 0.5, "layout": "NCHW"})
    grandchild = derive_version(child, alice, preprocessing={"scale": 0.25, "layout": "NCHW"})
    headers = token_for(alice)

    down = client.get(f"/api/v1/versions/{grandchild.pk}/lineage", **headers).json()
    up = client.get(f"/api/v1/versions/{version.pk}/lineage", **headers).json()

    assert [v["number"] for v in down["ancestors"]] == [2, 1] and down["children"] == []
    assert up["ancestors"] == [] and [v["id"] for v in up["children"]] == [child.pk]


def patch(client, path, body, headers):
    return client.patch(path, json.dumps(body), content_type="application/json", **headers)


def test_it_changes_a_versions_notes_and_tags(client, alice, version):
    response = patch(
        client,
        f"/api/v1/versions/{version.pk}",
        {"notes": "retrained", "tags": ["prod ", "fp32", "prod"]},
        token_for(alice),
    )

    assert response.status_code == 200, response.json()
    assert response.json()["tags"] == ["fp32", "prod"]
    version.refresh_from_db()
    assert (version.notes, version.tags) == ("retrained", ["fp32", "prod"])
    assert Event.objects.filter(verb="version.notes", target_id=version.pk).exists()


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"tags": ["x" * 41]}, "tags"),
        ({"tags": "prod"}, "tags"),
        ({"notes": "n" * 10_001}, "notes"),
        ({"sha256": "0" * 64}, "sha256"),
    ],
)
def test_it_refuses_bad_notes_or_tags_and_changes_nothing(client, alice, version, body, fragment):
    response = patch(client, f"/api/v1/versions/{version.pk}", body, token_for(alice))

    assert response.status_code == 400 and fragment in response.json()["error"]
    version.refresh_from_db()
    assert (version.notes, version.tags) == ("", [])
    assert not Event.objects.filter(verb="version.notes").exists()


def test_a_viewer_may_not_change_notes_nor_a_description(client, vera, version):
    headers = token_for(vera)
    notes = patch(client, f"/api/v1/versions/{version.pk}", {"notes": "x"}, headers)
    model = patch(client, f"/api/v1/models/{version.model_id}", {"description": "x"}, headers)

    assert notes.status_code == model.status_code == 403
    version.refresh_from_db()
    assert version.notes == "" and version.model.description == ""


def test_it_changes_a_models_description(client, alice, version):
    path = f"/api/v1/models/{version.model_id}"
    response = patch(client, path, {"description": "digits, 32x32"}, token_for(alice))

    assert response.status_code == 200 and response.json()["description"] == "digits, 32x32"
    assert Model.objects.get().description == "digits, 32x32"
    assert Event.objects.filter(verb="model.described").exists()


def test_it_derives_a_version_with_another_spec_keeping_the_contract(client, alice, version):
    spec = {"color_order": "BGR", "scale": 0.5, "layout": "NCHW"}
    path = f"/api/v1/versions/{version.pk}/derive"
    body = json.dumps({"preprocessing": spec, "notes": "bgr camera"})

    response = client.post(path, body, content_type="application/json", **token_for(alice))

    assert response.status_code == 201, response.json()
    child = ModelVersion.objects.get(parent=version)
    assert child.preprocessing["color_order"] == "BGR" and child.contract == version.contract
    assert response.json()["parent"] == version.pk and child.sha256 == version.sha256


def test_it_refuses_a_derived_version_that_changes_nothing(client, alice, version):
    path = f"/api/v1/versions/{version.pk}/derive"
    response = client.post(path, "{}", content_type="application/json", **token_for(alice))

    assert response.status_code == 400 and "Nothing changed" in response.json()["error"]
    assert ModelVersion.objects.count() == 1


def test_it_lists_the_datasets_of_a_versions_model(client, alice, version):
    headers = token_for(alice)
    upload = SimpleUploadedFile("val.npz", (ASSETS / "validation.npz").read_bytes())
    path = f"/api/v1/versions/{version.pk}/datasets"
    posted = client.post(path, {"kind": "validation", "name": "val", "file": upload}, **headers)

    listed = client.get(path, **headers).json()

    assert posted.status_code == 201, posted.json()
    assert listed["count"] == 1 and listed["items"][0] == posted.json()


def test_it_refuses_a_dataset_of_an_unknown_kind(client, alice, version):
    upload = SimpleUploadedFile("val.npz", (ASSETS / "validation.npz").read_bytes())
    response = client.post(
        f"/api/v1/versions/{version.pk}/datasets",
        {"kind": "training", "name": "val", "file": upload},
        **token_for(alice),
    )
    assert response.status_code == 400 and "kind" in response.json()["error"]
    assert not version.model.datasets.exists()


def test_a_pipeline_token_may_upload_read_and_download(client, alice, version):
    pipeline = token_for(alice, scope="pipeline")
    upload = client.post(
        f"/api/v1/models/{version.model_id}/versions",
        {"file": onnx_upload("digits_cnn_v1.onnx")},
        **pipeline,
    )
    assert upload.status_code == 201
    for path in ("models", f"versions/{version.pk}/download", f"versions/{version.pk}/lineage"):
        assert client.get(f"/api/v1/{path}", **pipeline).status_code == 200, path
