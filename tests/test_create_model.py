"""Creating a model with its first version: one service behind the page and the API."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.registry.models import Model
from tests.api_calls import onnx_upload, token_for
from tests.conftest import PASSWORD


def stored_files(settings):
    return sorted(path for path in settings.STORAGE_ROOT.rglob("*") if path.is_file())


def create_on_page(client, user, name, upload):
    client.login(username=user.username, password=PASSWORD)
    response = client.post("/models/", {"name": name, "notes": "", "file": upload})
    return response.status_code, response.content.decode()


def create_by_api(client, user, name, upload):
    response = client.post("/api/v1/models", {"name": name, "file": upload}, **token_for(user))
    return response.status_code, response.content.decode()


ROUTES = [pytest.param(create_on_page, id="page"), pytest.param(create_by_api, id="api")]


@pytest.mark.parametrize("create", ROUTES)
def test_a_refused_first_file_leaves_no_model_and_no_file(client, alice, settings, create):
    bad = SimpleUploadedFile("broken.onnx", b"\x08\x07 not a model at all")

    status, body = create(client, alice, "digits", bad)

    assert status == 400 and "not an ONNX model" in body
    assert not Model.objects.exists() and stored_files(settings) == []


@pytest.mark.parametrize("create", ROUTES)
def test_a_taken_name_is_refused_with_the_same_sentence(client, alice, settings, create):
    assert create(client, alice, "digits", onnx_upload())[0] in (201, 302)
    files = stored_files(settings)
    assert files  # the first model's file is stored

    status, body = create(client, alice, "digits", onnx_upload("digits_cnn_v1.onnx"))

    assert status == 400 and "already has a model named" in body
    assert Model.objects.count() == 1 and stored_files(settings) == files
