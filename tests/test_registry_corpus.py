"""Every bad file of the corpus, sent over HTTP: a clear 4xx, nothing stored, no file left."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.registry.models import Dataset, Model, ModelVersion
from tests import registry_corpus as corpus
from tests.api_calls import token_for
from tests.conftest import PASSWORD


def files_under(root):
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def capped(settings):
    settings.DEPLOYHUB_MAX_UPLOAD_BYTES = corpus.BOMB_CAP


def upload_file(client, alice, path, name=None):
    upload = SimpleUploadedFile(name or path.name, path.read_bytes())
    return client.post("/api/v1/models", {"name": "corpus", "file": upload}, **token_for(alice))


@pytest.mark.parametrize("case, writer, fragment", corpus.CASES, ids=[c[0] for c in corpus.CASES])
def test_the_api_refuses_each_corpus_case(
    client, alice, capped, storage_root, tmp_path, case, writer, fragment
):
    path = writer(tmp_path)
    response = upload_file(client, alice, path)
    assert response.status_code == 400, response.content
    assert fragment in response.json()["error"]
    assert not Model.objects.exists() and not ModelVersion.objects.exists()
    assert files_under(storage_root) == []


@pytest.mark.parametrize(
    "case, writer, fragment", corpus.CASES[:12:3], ids=[c[0] for c in corpus.CASES[:12:3]]
)
def test_the_browser_form_refuses_corpus_cases_with_a_form_error(
    client, alice, capped, storage_root, tmp_path, case, writer, fragment
):
    client.login(username="alice", password=PASSWORD)
    path = writer(tmp_path)
    response = client.post(
        "/models/",
        {"name": "corpus", "notes": "", "file": SimpleUploadedFile(path.name, path.read_bytes())},
    )
    assert response.status_code == 400
    assert fragment.replace("'", "&#x27;") in response.content.decode()
    assert files_under(storage_root) == []


def test_a_file_over_the_cap_gets_413_and_leaves_nothing(
    client, alice, settings, storage_root, model_file
):
    settings.DEPLOYHUB_MAX_UPLOAD_BYTES = 50_000
    response = upload_file(client, alice, model_file)
    assert response.status_code == 413 and "50,000" in response.json()["error"]
    assert files_under(storage_root) == []


@pytest.mark.parametrize("name", ["../../etc/model.onnx", "a\x00b.onnx", "m" * 296 + ".onnx"])
def test_path_nul_and_length_in_a_filename_never_reach_the_disk(
    client, alice, storage_root, model_file, name
):
    # Django strips directories and unprintable characters from multipart filenames, and
    # shortens them to 255 characters, before we see them; the stored name is ours anyway.
    response = upload_file(client, alice, model_file, name=name)
    if response.status_code == 201:
        version = ModelVersion.objects.get()
        assert "/" not in version.original_filename and "\x00" not in version.original_filename
        assert len(version.original_filename) <= 255
        assert version.file.name == f"models/{version.sha256[:2]}/{version.sha256}.onnx"
    else:
        assert response.status_code == 400 and files_under(storage_root) == []
    assert all(str(p).startswith(("models/", "tmp")) for p in files_under(storage_root))


def test_a_dataset_of_object_arrays_is_refused(client, alice, version, storage_root, tmp_path):
    path = corpus.write_object_array_npz(tmp_path)
    before = files_under(storage_root)
    response = client.post(
        f"/api/v1/versions/{version.pk}/datasets",
        {
            "kind": "calibration",
            "name": "objects",
            "file": SimpleUploadedFile("objects.npz", path.read_bytes()),
        },
        **token_for(alice),
    )
    assert response.status_code == 400 and "object" in response.json()["error"]
    assert not Dataset.objects.exists() and files_under(storage_root) == before
