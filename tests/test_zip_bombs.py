"""Zip bombs: every archive an upload holds unpacks under a compression-ratio cap, or not at all.

Each bomb is built here: 1 MB of zeros deflated (about 1 KB, a ratio near
1000:1), or a small member whose headers claim 1 GiB (under the 2 GiB size
cap, so only the ratio gives it away). Each goes through the real upload
page or API of its path: models (a .zip, a .pt2), datasets (an .npz, a zip
of images), golden sets (an .npz, a zip of test data) and parity packs (the
pack, and the tensors.npz inside it). A refused bomb is a 400 naming the
ratio, with nothing stored and nothing left in the storage's tmp folder.
"""

import io
import zipfile

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.parity.models import ParityRun
from deployhub.registry import archives
from deployhub.registry.archives import RatioCap, UnsafeArchive, safe_extract_zip
from deployhub.registry.models import Dataset, GoldenSet, Model, ModelVersion
from tests.api_calls import token_for
from tests.conftest import ASSETS, PASSWORD
from tests.golden_models import golden_npz, golden_pb_zip, linear_model
from tests.parity_packs import SPEC, synthetic_images

ZEROS = bytes(1_000_000)
CLAIMED = 1024**3
# Golden sets and parity packs have smaller size caps (256 and 512 MiB): stay under them.
SMALLER_CLAIM = 200 * 1024**2
DEMO = (ASSETS / "digits_cnn_v2.onnx").read_bytes()


# Building bombs ------------------------------------------------------------------


def zip_of(members, compression=zipfile.ZIP_DEFLATED):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression, compresslevel=9) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def claiming(data, member, size=CLAIMED):
    """Return the zip `data` with `member`'s headers claiming `size` unpacked bytes."""
    buffer, name, start = bytearray(data), member.encode(), 0
    while (start := buffer.find(b"PK\x01\x02", start)) >= 0:  # central directory entries
        length = int.from_bytes(buffer[start + 28 : start + 30], "little")
        if buffer[start + 46 : start + 46 + length] == name:
            buffer[start + 24 : start + 28] = size.to_bytes(4, "little")
            local = int.from_bytes(buffer[start + 42 : start + 46], "little")
            buffer[local + 22 : local + 26] = size.to_bytes(4, "little")
        start += 4
    assert zipfile.ZipFile(io.BytesIO(buffer)).getinfo(member).file_size == size
    return bytes(buffer)


def npz_zeros(**shapes):
    """An .npz, compressed, of float32 zeros of the given shapes."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{k: np.zeros(s, np.float32) for k, s in shapes.items()})
    return buffer.getvalue()


def png():
    buffer = io.BytesIO()
    next(iter(synthetic_images(1).values())).save(buffer, format="PNG")
    return buffer.getvalue()


# 1 MB of zeros per bomb: 82 samples of 3x32x32 float32, 62,500 pairs of a [1, 4] input.
SAMPLES = (82, 3, 32, 32)
PAIRS = (62_500, 1, 4)


def model_zip(bomb):
    if bomb == "zeros":
        return "model.zip", zip_of({"model.onnx": DEMO, "weights.bin": ZEROS})
    return "model.zip", claiming(
        zip_of({"model.onnx": DEMO, "weights.bin": b"w" * 64}), "weights.bin"
    )


def model_pt2(bomb):
    weight = "model/data/weights/weight_0"
    members = {"model/archive_format": b"pt2", weight: ZEROS if bomb == "zeros" else b"w" * 64}
    data = zip_of(members)
    return "model.pt2", data if bomb == "zeros" else claiming(data, weight)


def dataset_npz(bomb):
    if bomb == "zeros":
        return "val.npz", npz_zeros(inputs=SAMPLES)
    return "val.npz", claiming(npz_zeros(inputs=(1, 3, 32, 32)), "inputs.npy")


def dataset_images(bomb):
    members = {"labels.csv": "filename,label\nimg0.png,1\n", "img0.png": png()}
    if bomb == "zeros":
        return "images.zip", zip_of({**members, "img1.png": ZEROS})
    return "images.zip", claiming(zip_of(members), "img0.png")


def golden_of_arrays(bomb):
    if bomb == "zeros":
        return "golden.npz", npz_zeros(x=PAIRS)
    return "golden.npz", claiming(golden_npz(), "x.npy", SMALLER_CLAIM)


def golden_of_test_data(bomb):
    if bomb == "zeros":
        return "golden.zip", zip_of({"test_data_set_0/input_0.pb": ZEROS})
    member = "golden-linear/test_data_set_0/input_0.pb"
    return "golden.zip", claiming(golden_pb_zip(), member, SMALLER_CLAIM)


def parity_pack(bomb):
    if bomb == "zeros":
        return "pack.zip", zip_of({"img0.png": png(), "tensors.npz": ZEROS})
    members = {"img0.png": png(), "tensors.npz": npz_zeros(img0=(3, 32, 32))}
    return "pack.zip", claiming(zip_of(members), "img0.png", SMALLER_CLAIM)


def parity_pack_tensors(bomb):
    """A pack that is no bomb itself (stored, not deflated): its tensors.npz is."""
    if bomb == "zeros":
        tensors = npz_zeros(img0=(SAMPLES[0] * 3, 32, 32))
    else:
        tensors = claiming(npz_zeros(img0=(3, 32, 32)), "img0.npy", SMALLER_CLAIM)
    return "pack.zip", zip_of({"img0.png": png(), "tensors.npz": tensors}, zipfile.ZIP_STORED)


# Uploading them ----------------------------------------------------------------------


@pytest.fixture
def logged_in(client, alice):
    client.login(username="alice", password=PASSWORD)
    return client


@pytest.fixture
def spec_version(alice, demo_team, version):
    """The demo model with the demo's preprocessing spec, as image datasets and packs need."""
    from deployhub.registry.uploads import derive_version

    return derive_version(version, alice, preprocessing=SPEC)


@pytest.fixture
def linear(alice, demo_team):
    from deployhub.registry.uploads import create_version

    model = Model.objects.create(team=demo_team, name="linear", created_by=alice)
    upload = SimpleUploadedFile("linear.onnx", linear_model().SerializeToString())
    return create_version(model, upload, alice)


def upload(client, alice, route, path, fields, filename, data):
    """POST a file to a page (logged in) or to the API (with a token); return (status, text)."""
    file = SimpleUploadedFile(filename, data)
    if route == "api":
        response = client.post(f"/api/v1/{path}", {**fields, "file": file}, **token_for(alice))
    else:
        client.login(username="alice", password=PASSWORD)
        response = client.post(f"/{path}", {**fields, "file": file})
    return response.status_code, response.content.decode()


def files_under(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


ROWS = (Model, ModelVersion, Dataset, GoldenSet, ParityRun)


def counts():
    return [row.objects.count() for row in ROWS]


PATHS = {
    # name: (writer, fixture of the version it goes to, route, path, fields)
    "model .zip by page": (model_zip, "version", "page", "models/{model}/", {}),
    "model .zip by API": (model_zip, "version", "api", "models/{model}/versions", {}),
    "model .pt2 by API": (model_pt2, "version", "api", "models/{model}/versions", {}),
    "model .pt2 by page": (model_pt2, "version", "page", "models/{model}/", {}),
    "dataset .npz by API": (
        dataset_npz,
        "version",
        "api",
        "versions/{version}/datasets",
        {"kind": "calibration", "name": "cal"},
    ),
    "dataset images by page": (
        dataset_images,
        "spec_version",
        "page",
        "versions/{version}/datasets",
        {"kind": "validation", "name": "val"},
    ),
    "golden .npz by API": (
        golden_of_arrays,
        "linear",
        "api",
        "versions/{version}/golden",
        {"name": "ref"},
    ),
    "golden test data by page": (
        golden_of_test_data,
        "linear",
        "page",
        "versions/{version}/golden",
        {"name": "ref", "atol": "0.0001", "rtol": "0.001"},
    ),
    "parity pack by API": (parity_pack, "spec_version", "api", "versions/{version}/parity", {}),
    "parity tensors.npz by page": (
        parity_pack_tensors,
        "spec_version",
        "page",
        "versions/{version}/parity",
        {},
    ),
}


@pytest.mark.parametrize("bomb", ["zeros", "claims a huge size"])
@pytest.mark.parametrize("case", list(PATHS))
def test_it_refuses_a_zip_bomb_on_every_upload_path(
    request, client, alice, device_class, storage_root, case, bomb
):
    write, fixture, route, path, fields = PATHS[case]
    target = request.getfixturevalue(fixture)
    url = path.format(model=target.model.pk, version=target.pk)
    filename, data = write(bomb)
    assert len(data) < 200_000  # a small upload...
    stored, rows = files_under(storage_root), counts()

    status, text = upload(client, alice, route, url, fields, filename, data)

    assert status == 400, text[:2000]
    assert "compression ratio" in text and "over the limit of 100:1" in text, text[:2000]
    assert "zip bomb" in text
    assert counts() == rows and files_under(storage_root) == stored
    assert list((storage_root / "tmp").iterdir()) == []


def test_it_names_the_member_and_its_ratio(client, alice, version):
    status, text = upload(
        client, alice, "api", f"models/{version.model.pk}/versions", {}, *model_zip("zeros")
    )
    assert status == 400
    assert "The archive member 'weights.bin' unpacks 1,000,000 bytes from " in text
    assert "a compression ratio of " in text and ":1 over the limit of 100:1" in text


@pytest.mark.parametrize(
    "ratio, allowance", [(2000, 100 * 1024), (100, 2_000_000)], ids=["ratio", "allowance"]
)
def test_the_ratio_cap_and_allowance_come_from_the_settings(
    client, alice, version, settings, ratio, allowance
):
    settings.DEPLOYHUB_MAX_UNPACK_RATIO = ratio
    settings.DEPLOYHUB_UNPACK_ALLOWANCE_BYTES = allowance
    status, text = upload(
        client, alice, "api", f"models/{version.model.pk}/versions", {}, *model_zip("zeros")
    )
    # Not a bomb under these settings: the model and its unused weights.bin are stored.
    assert status == 201, text


def test_a_good_archive_still_uploads(client, alice, version):
    weights = np.random.default_rng(0).standard_normal(50_000).astype(np.float32).tobytes()
    data = zip_of({"model.onnx": DEMO, "notes.txt": b"a" * 50_000, "weights.bin": weights})
    status, text = upload(
        client, alice, "api", f"models/{version.model.pk}/versions", {}, "model.zip", data
    )
    assert status == 201, text


# The bytes are counted as they come out ----------------------------------------


CAP = RatioCap(ratio=100, allowance=100 * 1024)


@pytest.fixture
def trusting_headers(monkeypatch):
    """Skip the checks of the declared sizes, as if the headers told nothing."""
    monkeypatch.setattr(archives, "_check_declared_size", lambda infos, limit: None)
    monkeypatch.setattr(archives, "_check_declared_ratio", lambda infos, cap, size: None)


def test_it_stops_a_member_the_moment_it_passes_its_ratio(tmp_path, trusting_headers):
    path = tmp_path / "bomb.zip"
    path.write_bytes(zip_of({"small.txt": b"hello", "zeros.bin": bytes(50 * 1024**2)}))
    with pytest.raises(UnsafeArchive) as refused:
        safe_extract_zip(path, tmp_path / "out", max_total_bytes=1024**3, cap=CAP)
    assert "The archive member 'zeros.bin' unpacks past " in str(refused.value)
    assert "over the limit of 100:1" in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_it_stops_the_whole_archive_past_its_ratio(tmp_path, trusting_headers):
    # Each member alone passes (a generous allowance); together they unpack too far.
    members = {f"part{n}.bin": bytes(400_000) for n in range(20)}
    path = tmp_path / "many.zip"
    path.write_bytes(zip_of(members))
    cap = RatioCap(ratio=100, allowance=500_000)
    with pytest.raises(UnsafeArchive) as refused:
        safe_extract_zip(path, tmp_path / "out", max_total_bytes=1024**3, cap=cap)
    assert str(refused.value).startswith("The archive (at member 'part")
    assert "over the limit of 100:1" in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_it_refuses_on_the_declared_sizes_before_unpacking(tmp_path, monkeypatch):
    path = tmp_path / "bomb.zip"
    path.write_bytes(zip_of({"zeros.bin": ZEROS}))
    opened = []
    monkeypatch.setattr(archives.Unpacking, "chunks", lambda self, info: opened.append(info))
    with pytest.raises(UnsafeArchive, match="a compression ratio of"):
        safe_extract_zip(path, tmp_path / "out", max_total_bytes=1024**3, cap=CAP)
    assert opened == []
