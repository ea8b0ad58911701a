"""Uploading ONNX models through the browser forms: what gets stored, and what never does."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.registry.models import Model, ModelVersion
from tests.conftest import PASSWORD


def stored_files(settings):
    return sorted(p for p in settings.STORAGE_ROOT.rglob("*") if p.is_file())


def upload(client, model_file, name="digits", filename="digits.onnx", data=None):
    content = data if data is not None else model_file.read_bytes()
    return client.post(
        "/models/",
        {
            "name": name,
            "description": "",
            "notes": "first",
            "file": SimpleUploadedFile(filename, content),
        },
    )


def test_it_stores_an_uploaded_onnx_model_with_its_signature(client, alice, model_file, settings):
    client.login(username="alice", password=PASSWORD)
    response = upload(client, model_file)
    version = ModelVersion.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/models/{version.model.pk}/"
    assert version.number == 1 and version.opset == 17 and version.format == "onnx"
    assert version.inputs == [{"name": "image", "dtype": "float", "shape": ["N", 3, 32, 32]}]
    assert version.outputs == [{"name": "logits", "dtype": "float", "shape": ["N", 10]}]
    assert version.size == model_file.stat().st_size
    assert version.file.name == f"models/{version.sha256[:2]}/{version.sha256}.onnx"
    assert version.original_filename == "digits.onnx"


def test_the_version_page_shows_the_signature(client, alice, version):
    client.login(username="alice", password=PASSWORD)
    page = client.get(f"/versions/{version.pk}/").content.decode()
    assert "image" in page and "[N, 3, 32, 32]" in page and "logits" in page
    assert version.sha256 in page


@pytest.mark.parametrize(
    "filename, data, reason",
    [
        ("random.onnx", b"\x00\xffnot a model at all" * 50, "not an ONNX model"),
        ("empty.onnx", b"", "The submitted file is empty"),
    ],
)
def test_it_refuses_a_file_that_is_not_onnx(
    client, alice, model_file, settings, filename, data, reason
):
    client.login(username="alice", password=PASSWORD)
    response = upload(client, model_file, filename=filename, data=data)
    assert response.status_code == 400
    assert reason in response.content.decode()
    assert not Model.objects.exists()  # no half-registered model
    assert stored_files(settings) == []


def test_it_refuses_a_truncated_onnx_file(client, alice, model_file, settings):
    client.login(username="alice", password=PASSWORD)
    truncated = model_file.read_bytes()[: model_file.stat().st_size // 2]
    response = upload(client, model_file, data=truncated)
    assert response.status_code == 400
    page = response.content.decode()
    assert "not an ONNX model" in page or "checker rejected" in page
    assert not Model.objects.exists() and stored_files(settings) == []


def test_it_points_to_the_existing_version_instead_of_storing_a_duplicate(
    client, alice, version, model_file, settings
):
    client.login(username="alice", password=PASSWORD)
    files_before = stored_files(settings)
    response = client.post(
        f"/models/{version.model.pk}/",
        {"notes": "", "file": SimpleUploadedFile("again.onnx", model_file.read_bytes())},
    )
    page = response.content.decode()
    assert "already" in page and f"/versions/{version.pk}/" in page
    assert version.model.versions.count() == 1 and stored_files(settings) == files_before


def test_it_adds_the_next_version_number(client, alice, version):
    client.login(username="alice", password=PASSWORD)
    from tests.conftest import ASSETS

    v1 = (ASSETS / "digits_cnn_v1.onnx").read_bytes()
    response = client.post(
        f"/models/{version.model.pk}/",
        {"notes": "narrow", "file": SimpleUploadedFile("v1.onnx", v1)},
    )
    new = version.model.versions.get(number=2)
    assert response["Location"] == f"/versions/{new.pk}/"


def test_it_refuses_a_second_model_with_the_same_name(client, alice, version, model_file):
    client.login(username="alice", password=PASSWORD)
    response = upload(client, model_file, name="digits-cnn")
    assert "already has a model named" in response.content.decode()
    assert Model.objects.count() == 1


def test_a_viewer_cannot_upload(client, vera, model_file):
    client.login(username="vera", password=PASSWORD)
    assert upload(client, model_file).status_code == 403
    assert not Model.objects.exists()
