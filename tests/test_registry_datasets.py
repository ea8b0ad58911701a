"""Attaching calibration and validation datasets to a model, checked against the version."""

import io
import zipfile

import numpy as np
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.registry.models import Dataset
from deployhub.registry.uploads import create_version
from tests.api_calls import token_for
from tests.conftest import ASSETS, PASSWORD
from tests.io_models import BOOL, FLOAT, INT64, io_version
from tests.parity_packs import SPEC


def post_dataset(client, user, version, name, filename, data, kind="validation"):
    return client.post(
        f"/api/v1/versions/{version.pk}/datasets",
        {"kind": kind, "name": name, "file": SimpleUploadedFile(filename, data)},
        **token_for(user),
    )


def test_it_attaches_an_npz_validation_set(client, alice, version):
    response = post_dataset(
        client, alice, version, "val", "validation.npz", (ASSETS / "validation.npz").read_bytes()
    )
    assert response.status_code == 201, response.json()
    dataset = Dataset.objects.get()
    assert dataset.samples == 300 and dataset.has_labels and dataset.classes == 10
    assert dataset.input_shape == [3, 32, 32] and dataset.checked_against == version
    stored = np.load(dataset.file.path, allow_pickle=False)
    assert stored["inputs"].shape == (300, 3, 32, 32)


def test_a_validation_set_needs_labels(client, alice, version):
    response = post_dataset(
        client, alice, version, "cal", "calibration.npz", (ASSETS / "calibration.npz").read_bytes()
    )
    assert response.status_code == 400 and "labels" in response.json()["error"]
    assert (
        post_dataset(
            client,
            alice,
            version,
            "cal",
            "calibration.npz",
            (ASSETS / "calibration.npz").read_bytes(),
            kind="calibration",
        ).status_code
        == 201
    )


def test_it_refuses_samples_that_do_not_fit_the_contract(client, alice, version):
    buffer = io.BytesIO()
    np.savez(buffer, inputs=np.zeros((4, 3, 28, 28), np.float32), labels=np.zeros(4, np.int64))
    response = post_dataset(client, alice, version, "small", "small.npz", buffer.getvalue())
    assert response.status_code == 400
    assert "(3, 28, 28)" in response.json()["error"] and "(3, 32, 32)" in response.json()["error"]
    assert not Dataset.objects.exists()


def image_zip():
    samples = np.load(ASSETS / "samples" / "tensors.npz", allow_pickle=False)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        rows = ["filename,label"]
        for name, label in zip(samples["names"], samples["labels"], strict=True):
            archive.write(ASSETS / "samples" / str(name), str(name))
            rows.append(f"{name},{label}")
        archive.writestr("labels.csv", "\n".join(rows) + "\n")
    return buffer.getvalue(), samples


def test_an_image_zip_becomes_the_tensors_the_training_pipeline_fed(
    client, alice, demo_team, model_file
):
    from deployhub.registry.models import Model

    model = Model.objects.create(team=demo_team, name="digits")
    with open(model_file, "rb") as handle:
        version = create_version(
            model, SimpleUploadedFile("d.onnx", handle.read()), alice, preprocessing=SPEC
        )
    data, samples = image_zip()
    client.login(username="alice", password=PASSWORD)
    response = client.post(
        f"/versions/{version.pk}/datasets",
        {
            "kind": "validation",
            "name": "camera-samples",
            "file": SimpleUploadedFile("samples.zip", data),
        },
    )
    assert response.status_code == 302
    dataset = Dataset.objects.get()
    assert dataset.source == "images" and dataset.samples == 8
    stored = np.load(dataset.file.path, allow_pickle=False)
    np.testing.assert_allclose(stored["inputs"], samples["inputs"], atol=1e-5)
    np.testing.assert_array_equal(stored["labels"], samples["labels"])


def test_an_image_zip_needs_a_spec_on_the_version(client, alice, version):
    data, _ = image_zip()
    response = post_dataset(client, alice, version, "imgs", "samples.zip", data)
    assert response.status_code == 400 and "preprocessing spec" in response.json()["error"]


SEVERAL = [("image", FLOAT, ["N", 3, 4, 4]), ("tokens", INT64, ["N", 5]), ("flag", BOOL, ["N"])]


def npz_bytes(**arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def several_arrays(count=4):
    return {
        "image": np.ones((count, 3, 4, 4), np.float32),
        "tokens": np.arange(count * 5).reshape(count, 5),
        "flag": np.array([0, 1] * (count // 2), np.uint8),
        "labels": np.arange(count) % 2,
    }


def stored_files(root):
    return sorted(p.name for p in root.rglob("*") if p.is_file())


def test_it_attaches_a_dataset_with_one_array_per_model_input(client, alice, demo_team):
    version = io_version(demo_team, alice, SEVERAL)

    response = post_dataset(client, alice, version, "val", "val.npz", npz_bytes(**several_arrays()))

    assert response.status_code == 201, response.json()
    dataset = Dataset.objects.get()
    assert dataset.samples == 4 and dataset.classes == 2
    assert dataset.input_shape[1] == {"name": "tokens", "shape": [5], "dtype": "int64"}
    stored = np.load(dataset.file.path, allow_pickle=False)
    assert sorted(stored.files) == ["flag", "image", "labels", "tokens"]
    np.testing.assert_array_equal(stored["tokens"], several_arrays()["tokens"])
    client.login(username="alice", password=PASSWORD)
    page = client.get(version.get_absolute_url()).content.decode()
    assert "image: float32 [3, 4, 4]; tokens: int64 [5]; flag: uint8 []" in page


def test_it_refuses_a_dataset_without_an_array_for_an_input_and_stores_nothing(
    client, alice, demo_team, storage_root
):
    version = io_version(demo_team, alice, SEVERAL)
    before = stored_files(storage_root)
    arrays = several_arrays()
    del arrays["tokens"]

    response = post_dataset(client, alice, version, "val", "val.npz", npz_bytes(**arrays))

    assert response.status_code == 400
    assert response.json()["error"] == (
        "The dataset has no array for input 'tokens' (it holds: image, flag, labels); "
        "save one per input: np.savez(f, image=..., tokens=..., flag=...)."
    )
    assert not Dataset.objects.exists() and stored_files(storage_root) == before


def test_it_refuses_an_array_that_does_not_fit_its_inputs_dtype(client, alice, demo_team):
    version = io_version(demo_team, alice, SEVERAL)
    arrays = {**several_arrays(), "flag": np.array([0, 1, 2, 1], np.uint8)}

    response = post_dataset(client, alice, version, "val", "val.npz", npz_bytes(**arrays))

    assert response.status_code == 400
    assert (
        "'flag' takes bool: store a bool array, or integers that are 0 or 1"
        in (response.json()["error"])
    )
    assert not Dataset.objects.exists()


def test_an_image_zip_is_refused_for_a_model_with_several_inputs(client, alice, demo_team):
    version = io_version(demo_team, alice, SEVERAL)
    data, _ = image_zip()

    response = post_dataset(client, alice, version, "imgs", "samples.zip", data)

    assert response.status_code == 400
    assert response.json()["error"] == (
        "An image archive feeds one input, and this model takes 3: upload an .npz with one "
        "array per input: np.savez(f, image=..., tokens=..., flag=...)."
    )


def test_the_upload_form_describes_the_layout_and_shows_a_refusal(client, alice, demo_team):
    version = io_version(demo_team, alice, SEVERAL)
    client.login(username="alice", password=PASSWORD)
    arrays = {**several_arrays(), "image": np.ones((4, 3, 8, 8), np.float32)}

    response = client.post(
        f"/versions/{version.pk}/datasets",
        {
            "kind": "validation",
            "name": "val",
            "file": SimpleUploadedFile("v.npz", npz_bytes(**arrays)),
        },
    )

    page = response.content.decode()
    assert "one array per model input, named after it" in page
    assert "The dataset&#x27;s &#x27;image&#x27; samples have shape (3, 8, 8)" in page
    assert not Dataset.objects.exists()
