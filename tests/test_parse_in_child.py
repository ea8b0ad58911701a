"""Datasets, golden sets and parity packs are parsed in the capped child process, never here.

A file whose parsing needs more memory than DEPLOYHUB_VALIDATION_MEMORY_MB is
refused with a clear message and the web process carries on: its own peak
memory does not move, and the next upload of the same kind is read and stored.
Each hostile file declares one array of 480 MiB of zeros (about 2 MB on the
wire): loading that array alone passes the 400 MB cap, whatever the child's own
size. The ratio cap is raised here, so the files are refused for their memory,
not as zip bombs.
"""

import io
import math
import resource
import zipfile

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.parity import packs
from deployhub.parity.models import ParityRun
from deployhub.registry import datasets
from deployhub.registry.models import Dataset, GoldenSet, Model
from tests.api_calls import token_for
from tests.conftest import ASSETS, PASSWORD
from tests.golden_models import golden_npz, linear_model
from tests.parity_packs import SPEC, pack_bytes, synthetic_images, training_pipeline
from workers.checks import golden as worker_golden

CAP_MB = 400
ELEMENTS = 40960 * 3 * 32 * 32  # float32: 480 MiB
GiB = 1024**3


def npz_with_zeros(name, shape, **small):
    """An .npz whose array `name` holds float32 zeros of `shape`, written without building it."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        with archive.open(f"{name}.npy", "w", force_zip64=True) as out:
            header = {"descr": "<f4", "fortran_order": False, "shape": shape}
            np.lib.format.write_array_header_1_0(out, header)
            left, chunk = math.prod(shape) * 4, bytes(16 * 1024**2)
            while left:
                out.write(chunk[: min(left, len(chunk))])
                left -= min(left, len(chunk))
        for key, array in small.items():
            with archive.open(f"{key}.npy", "w") as out:
                np.lib.format.write_array(out, array)
    return buffer.getvalue()


@pytest.fixture
def low_caps(settings, monkeypatch):
    """A 400 MB child, a ratio cap that lets zeros through, size caps past the arrays."""
    settings.DEPLOYHUB_VALIDATION_MEMORY_MB = CAP_MB
    settings.DEPLOYHUB_MAX_UNPACK_RATIO = 10**6
    monkeypatch.setattr(worker_golden, "MAX_BYTES", GiB)
    monkeypatch.setattr(packs, "MAX_TENSOR_BYTES", GiB)
    monkeypatch.setattr(packs, "MAX_PACK_BYTES", GiB)


@pytest.fixture
def linear(alice, demo_team):
    from deployhub.registry.uploads import create_version

    model = Model.objects.create(team=demo_team, name="linear", created_by=alice)
    upload = SimpleUploadedFile("linear.onnx", linear_model().SerializeToString())
    return create_version(model, upload, alice)


@pytest.fixture
def spec_version(alice, version):
    from deployhub.registry.uploads import derive_version

    return derive_version(version, alice, preprocessing=SPEC)


def good_pack():
    images = synthetic_images()
    return pack_bytes(images, {name: training_pipeline(i) for name, i in images.items()})


def parity_pack_of(tensors):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        image = io.BytesIO()
        next(iter(synthetic_images(1).values())).save(image, format="PNG")
        archive.writestr("img0.png", image.getvalue())
        archive.writestr("tensors.npz", tensors)
    return buffer.getvalue()


# kind: (fixture of the version, API path, fields, hostile file, a good file)
KINDS = {
    "dataset": (
        "version",
        "datasets",
        {"kind": "calibration", "name": "cal"},
        ("big.npz", lambda: npz_with_zeros("inputs", (40960, 3, 32, 32))),
        ("cal.npz", lambda: (ASSETS / "calibration.npz").read_bytes()),
    ),
    "golden set": (
        "linear",
        "golden",
        {"name": "ref"},
        (
            "big.npz",
            lambda: npz_with_zeros("x", (1, ELEMENTS), logits=np.zeros((1, 1, 3), np.float32)),
        ),
        ("golden.npz", golden_npz),
    ),
    "parity pack": (
        "spec_version",
        "parity",
        {},
        ("big.zip", lambda: parity_pack_of(npz_with_zeros("img0", (ELEMENTS,)))),
        ("pack.zip", good_pack),
    ),
}
ROWS = (Dataset, GoldenSet, ParityRun)


def post(client, user, version, path, fields, filename, data):
    return client.post(
        f"/api/v1/versions/{version.pk}/{path}",
        {**fields, "file": SimpleUploadedFile(filename, data)},
        **token_for(user),
    )


def files_under(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_file_that_needs_more_memory_than_the_cap_is_refused_and_the_hub_carries_on(
    request, client, alice, device_class, storage_root, low_caps, kind
):
    fixture, path, fields, (filename, hostile), (good_name, good) = KINDS[kind]
    version = request.getfixturevalue(fixture)
    data = hostile()
    assert len(data) < 5 * 1024**2
    stored, rows, peak = files_under(storage_root), [r.objects.count() for r in ROWS], peak_rss_mb()

    response = post(client, alice, version, path, fields, filename, data)

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert f"needs more memory than the {CAP_MB} MB an upload may take to check" in error
    assert peak_rss_mb() - peak < 200  # the 480 MiB array was never loaded here
    assert [r.objects.count() for r in ROWS] == rows and files_under(storage_root) == stored
    assert list((storage_root / "tmp").iterdir()) == []
    # The hub carries on: a normal file of the same kind is read, under the same cap, and stored.
    response = post(client, alice, version, path, fields, good_name, good())
    assert response.status_code == 201, response.content


def boom(*args, **kwargs):
    raise AssertionError("parsed in the web process")


def test_the_web_process_parses_none_of_them(
    client, alice, version, linear, spec_version, device_class, monkeypatch
):
    # The loaders, replaced here, still run in the child: every upload is read and stored.
    monkeypatch.setattr(datasets, "load_npz", boom)
    monkeypatch.setattr(datasets, "load_image_zip", boom)
    monkeypatch.setattr(worker_golden, "read_golden", boom)
    monkeypatch.setattr(packs, "read_pack", boom)
    for kind, (fixture, path, fields, _, (filename, good)) in KINDS.items():
        target = {"version": version, "linear": linear, "spec_version": spec_version}[fixture]
        response = post(client, alice, target, path, fields, filename, good())
        assert response.status_code == 201, (kind, response.content)
    assert Dataset.objects.get().samples == 100


def test_the_page_shows_the_refusal_next_to_the_file(client, alice, version, low_caps):
    client.login(username="alice", password=PASSWORD)
    response = client.post(
        f"/versions/{version.pk}/datasets",
        {
            "kind": "calibration",
            "name": "cal",
            "file": SimpleUploadedFile("big.npz", npz_with_zeros("inputs", (40960, 3, 32, 32))),
        },
    )
    assert response.status_code == 400
    assert b"needs more memory than the 400 MB" in response.content
    assert not Dataset.objects.exists()
