"""Calibration and validation datasets: .npz and image zips, checked against the contract."""

import io
import json
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from deployhub.registry.archives import RatioCap
from deployhub.registry.contract import default_contract, validate_contract
from deployhub.registry.datasets import (
    DatasetError,
    check_against_contract,
    describe,
    load_image_zip,
    load_npz,
)
from deployhub.registry.inspect import inspect_onnx
from tests.registry_corpus import default_cap

ASSETS = Path(__file__).resolve().parent.parent / "deployhub" / "demo" / "assets"
SAMPLES = ASSETS / "samples"
SPEC = json.loads((ASSETS / "manifest.json").read_text())["preprocessing"]
MB = 1024 * 1024
CAP = default_cap()
LOOSE = RatioCap(ratio=10**6, allowance=0)  # for a test of another limit


@pytest.fixture(scope="module")
def model_inputs():
    return inspect_onnx(ASSETS / "digits_cnn_v2.onnx")["inputs"]


@pytest.fixture(scope="module")
def contract(model_inputs):
    return validate_contract(default_contract(model_inputs), model_inputs)


@pytest.fixture
def workdir(tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


def sample_tensors():
    with np.load(SAMPLES / "tensors.npz", allow_pickle=False) as npz:
        return list(npz["names"]), npz["inputs"], npz["labels"]


def save_npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def make_zip(path, files):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def demo_zip_files(prefix=""):
    names, _, labels = sample_tensors()
    rows = "".join(f"{name},{label}\n" for name, label in zip(names, labels, strict=True))
    files = {f"{prefix}{name}": (SAMPLES / name).read_bytes() for name in names}
    return {**files, f"{prefix}labels.csv": "filename,label\n" + rows}


def png_declaring(width, height):
    """Return a tiny PNG whose header declares width x height pixels."""
    buffer = io.BytesIO()
    Image.new("1", (1, 1)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    data[16:24] = struct.pack(">II", width, height)  # IHDR width and height
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))  # IHDR checksum
    return bytes(data)


def load_zip(path, workdir, *, require_labels=True, **limits):
    return load_image_zip(
        path,
        SPEC,
        require_labels=require_labels,
        workdir=workdir,
        max_bytes=10 * MB,
        cap=CAP,
        input_name="image",
        **limits,
    )


def test_the_demo_validation_set_loads_and_fits_the_default_contract(model_inputs, contract):
    arrays = load_npz(ASSETS / "validation.npz", ["image"], require_labels=True, cap=CAP)

    check_against_contract(arrays["inputs"], model_inputs, contract)
    assert describe(arrays) == {
        "samples": 300,
        "input_shape": [3, 32, 32],
        "input_dtype": "float32",
        "labels": True,
        "classes": 10,
    }


def test_the_demo_calibration_set_loads_without_labels(model_inputs, contract):
    arrays = load_npz(ASSETS / "calibration.npz", ["image"], require_labels=False, cap=CAP)

    check_against_contract(arrays["inputs"], model_inputs, contract)
    assert arrays["labels"] is None
    assert describe(arrays)["samples"] == 100
    assert describe(arrays)["classes"] is None


def test_a_validation_set_needs_labels():
    with pytest.raises(DatasetError, match="needs one integer class label per sample"):
        load_npz(ASSETS / "calibration.npz", require_labels=True, cap=CAP)


def test_it_refuses_an_object_array(tmp_path):
    path = save_npz(tmp_path / "d.npz", inputs=np.array([np.zeros(3), "cat"], dtype=object))

    with pytest.raises(DatasetError) as refused:
        load_npz(path, require_labels=False, cap=CAP)

    assert str(refused.value) == (
        "The 'inputs' array holds Python objects (dtype=object); save plain numeric arrays."
    )


def test_it_refuses_labels_of_another_length(tmp_path):
    path = save_npz(tmp_path / "d.npz", inputs=np.zeros((4, 3, 32, 32)), labels=np.arange(3))

    with pytest.raises(DatasetError, match="There are 3 labels for 4 samples"):
        load_npz(path, require_labels=True, cap=CAP)


@pytest.mark.parametrize(
    "labels, message",
    [
        (np.zeros(4, dtype=np.float32), "1-D integer array"),
        (np.zeros((4, 1), dtype=np.int64), "1-D integer array"),
        (np.array([0, 1, -1, 2]), "negative"),
    ],
)
def test_it_refuses_labels_that_are_not_class_indices(tmp_path, labels, message):
    path = save_npz(tmp_path / "d.npz", inputs=np.zeros((4, 2)), labels=labels)

    with pytest.raises(DatasetError, match=message):
        load_npz(path, require_labels=True, cap=CAP)


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"x": np.zeros((2, 3))}, r"no 'inputs' array \(it holds: x\)"),
        ({"inputs": np.array(["a", "b"])}, "float, integer or bool"),
        ({"inputs": np.zeros((0, 3))}, "no samples"),
        ({"inputs": np.array([1.0, np.nan])}, "NaN"),
    ],
)
def test_it_refuses_inputs_it_cannot_use(tmp_path, arrays, message):
    path = save_npz(tmp_path / "d.npz", **arrays)

    with pytest.raises(DatasetError, match=message):
        load_npz(path, require_labels=False, cap=CAP)


def test_it_refuses_arrays_over_the_size_limit_before_decompressing(tmp_path):
    np.savez_compressed(tmp_path / "d.npz", inputs=np.zeros((1000, 1000), dtype=np.float32))

    with pytest.raises(DatasetError, match="4,000,000 bytes once decompressed"):
        load_npz(tmp_path / "d.npz", require_labels=False, cap=LOOSE, max_array_bytes=MB)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "not a valid .npz"),
        (b"hello, this is not numpy", "not a valid .npz"),
        ((ASSETS / "validation.npz").read_bytes()[:500], "not a valid .npz|could not be read"),
    ],
)
def test_it_refuses_a_file_that_is_not_an_npz(tmp_path, content, message):
    (tmp_path / "d.npz").write_bytes(content)

    with pytest.raises(DatasetError, match=message):
        load_npz(tmp_path / "d.npz", require_labels=False, cap=CAP)


def test_it_refuses_a_bare_npy_file(tmp_path):
    np.save(tmp_path / "d.npy", np.zeros(3))

    with pytest.raises(DatasetError, match="single .npy array"):
        load_npz(tmp_path / "d.npy", require_labels=False, cap=CAP)


def test_it_refuses_samples_of_another_shape(model_inputs, contract):
    with pytest.raises(DatasetError) as refused:
        check_against_contract(
            {"image": np.zeros((5, 3, 28, 28), np.float32)}, model_inputs, contract
        )

    assert str(refused.value) == (
        "The dataset's samples have shape (3, 28, 28) but the contract of 'image' "
        "expects (3, 32, 32)."
    )


def test_it_accepts_samples_within_a_dynamic_range():
    inputs = [{"name": "image", "dtype": "float", "shape": ["N", 3, "H", "W"]}]
    ranges = {"2": {"min": 16, "opt": 32, "max": 64}, "3": {"min": 16, "opt": 32, "max": 64}}
    contract = {"inputs": {"image": {**default_contract(inputs)["inputs"]["image"]}}}
    contract["inputs"]["image"]["dynamic"] = ranges

    check_against_contract({"image": np.zeros((2, 3, 48, 20), np.float32)}, inputs, contract)
    with pytest.raises(DatasetError, match=r"expects \(3, 16..64, 16..64\)"):
        check_against_contract({"image": np.zeros((2, 3, 96, 20), np.float32)}, inputs, contract)


def test_a_float_input_takes_integer_pixels_but_not_bools(model_inputs, contract):
    check_against_contract({"image": np.zeros((5, 3, 32, 32), np.uint8)}, model_inputs, contract)
    with pytest.raises(DatasetError, match="holds bool values but 'image' takes float"):
        check_against_contract({"image": np.zeros((5, 3, 32, 32), bool)}, model_inputs, contract)


def test_it_refuses_integers_that_do_not_fit_an_integer_input():
    inputs = [{"name": "pixels", "dtype": "uint8", "shape": ["N", 4]}]
    contract = default_contract(inputs)

    check_against_contract({"pixels": np.full((2, 4), 255, np.int64)}, inputs, contract)
    with pytest.raises(DatasetError, match="from 0 to 255"):
        check_against_contract({"pixels": np.full((2, 4), 256, np.int64)}, inputs, contract)


def test_an_image_zip_gives_the_demo_sample_tensors(tmp_path, workdir):
    _, expected, labels = sample_tensors()
    path = make_zip(tmp_path / "d.zip", demo_zip_files())

    arrays = load_zip(path, workdir)

    np.testing.assert_allclose(arrays["inputs"]["image"], expected, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(arrays["labels"], labels)
    assert list(workdir.iterdir()) == []


def test_it_looks_inside_a_single_top_level_folder(tmp_path, workdir):
    _, expected, _ = sample_tensors()
    files = {**demo_zip_files(prefix="digits/"), "__MACOSX/digits/._labels.csv": b"\0\5"}

    arrays = load_zip(make_zip(tmp_path / "d.zip", files), workdir)

    np.testing.assert_allclose(arrays["inputs"]["image"], expected, rtol=0, atol=1e-5)


def test_a_calibration_zip_needs_no_labels_csv(tmp_path, workdir):
    names, expected, _ = sample_tensors()
    files = {name: data for name, data in demo_zip_files().items() if name != "labels.csv"}

    arrays = load_zip(make_zip(tmp_path / "d.zip", files), workdir, require_labels=False)

    assert arrays["labels"] is None
    np.testing.assert_allclose(
        arrays["inputs"]["image"], expected, rtol=0, atol=1e-5
    )  # sorted names
    assert names == sorted(names)


def test_a_validation_zip_needs_labels_csv(tmp_path, workdir):
    files = {name: data for name, data in demo_zip_files().items() if name != "labels.csv"}

    with pytest.raises(DatasetError, match="no labels.csv"):
        load_zip(make_zip(tmp_path / "d.zip", files), workdir)
    assert list(workdir.iterdir()) == []


def test_it_names_a_listed_image_that_is_missing(tmp_path, workdir):
    files = demo_zip_files()
    del files["digit_3_3.png"]

    with pytest.raises(DatasetError, match="names 'digit_3_3.png', which is not in the archive"):
        load_zip(make_zip(tmp_path / "d.zip", files), workdir)
    assert list(workdir.iterdir()) == []


@pytest.mark.parametrize("corrupt", [b"not a png at all", "truncated"])
def test_it_names_an_unreadable_image(tmp_path, workdir, corrupt):
    files = demo_zip_files()
    whole = files["digit_5_5.png"]
    files["digit_5_5.png"] = whole[: len(whole) // 2] if corrupt == "truncated" else corrupt

    with pytest.raises(DatasetError, match="'digit_5_5.png' could not be read as an image"):
        load_zip(make_zip(tmp_path / "d.zip", files), workdir)
    assert list(workdir.iterdir()) == []


def test_it_refuses_a_decompression_bomb_before_decoding(tmp_path, workdir):
    files = {**demo_zip_files(), "digit_2_2.png": png_declaring(8_000, 8_000)}

    with pytest.raises(DatasetError, match="'digit_2_2.png' declares 8000x8000 pixels"):
        load_zip(make_zip(tmp_path / "d.zip", files), workdir, max_pixels=1_000_000)
    assert list(workdir.iterdir()) == []


def test_it_turns_pillows_own_bomb_error_into_a_refusal(tmp_path, workdir):
    files = {**demo_zip_files(), "digit_2_2.png": png_declaring(100_000, 100_000)}

    with pytest.raises(DatasetError, match="'digit_2_2.png' is too large to decode safely"):
        load_zip(make_zip(tmp_path / "d.zip", files), workdir, max_pixels=10**12)


@pytest.mark.parametrize(
    "rows, message",
    [
        ("name,class\ndigit_0_0.png,0\n", "header filename,label"),
        ("filename,label\ndigit_0_0.png,zero\n", "line 2: the label 'zero' is not a class index"),
        ("filename,label\ndigit_0_0.png,0\ndigit_1_1.png,\n", "line 3: 'digit_1_1.png' has no"),
        ("filename,label\n../outside.png,0\n", "'../outside.png', which is outside the archive"),
        ("filename,label\n", "lists no images"),
    ],
)
def test_it_explains_what_is_wrong_with_labels_csv(tmp_path, workdir, rows, message):
    files = {**demo_zip_files(), "labels.csv": rows}

    with pytest.raises(DatasetError, match=message):
        load_zip(make_zip(tmp_path / "d.zip", files), workdir)
    assert list(workdir.iterdir()) == []


def test_it_refuses_a_dataset_larger_than_the_array_limit(tmp_path, workdir):
    path = make_zip(tmp_path / "d.zip", demo_zip_files())

    with pytest.raises(DatasetError, match="8 images of 12,288 bytes each exceed"):
        load_zip(path, workdir, max_array_bytes=50_000)


def test_it_refuses_an_unsafe_archive_as_a_dataset_error(tmp_path, workdir):
    files = {**demo_zip_files(), "../escape.png": b"x"}

    with pytest.raises(DatasetError, match="climbs out of the archive"):
        load_zip(make_zip(tmp_path / "d.zip", files), workdir)
    assert list(workdir.iterdir()) == []


def test_it_refuses_a_file_that_is_not_a_zip(tmp_path, workdir):
    (tmp_path / "d.zip").write_bytes(b"not a zip")

    with pytest.raises(DatasetError, match="not a readable zip archive"):
        load_zip(tmp_path / "d.zip", workdir)
    assert list(workdir.iterdir()) == []


SEVERAL = [
    {"name": "image", "dtype": "float", "shape": ["N", 3, 4, 4]},
    {"name": "mask", "dtype": "bool", "shape": ["N", 4, 4]},
    {"name": "tokens", "dtype": "int64", "shape": ["N", 5]},
    {"name": "scale", "dtype": "float", "shape": []},
]


def several_contract():
    return validate_contract(default_contract(SEVERAL), SEVERAL)


def several_samples(count=6):
    return {
        "image": np.zeros((count, 3, 4, 4), np.float32),
        "mask": np.ones((count, 4, 4), bool),
        "tokens": np.arange(count * 5).reshape(count, 5),
        "scale": np.full(count, 0.5, np.float32),
    }


def test_it_loads_one_array_per_input_of_a_model_with_several_inputs(tmp_path):
    path = save_npz(tmp_path / "d.npz", **several_samples(), labels=np.arange(6) % 2)

    arrays = load_npz(path, [spec["name"] for spec in SEVERAL], require_labels=True, cap=CAP)

    check_against_contract(arrays["inputs"], SEVERAL, several_contract())
    assert list(arrays["inputs"]) == ["image", "mask", "tokens", "scale"]
    assert describe(arrays) == {
        "samples": 6,
        "input_shape": [
            {"name": "image", "shape": [3, 4, 4], "dtype": "float32"},
            {"name": "mask", "shape": [4, 4], "dtype": "bool"},
            {"name": "tokens", "shape": [5], "dtype": "int64"},
            {"name": "scale", "shape": [], "dtype": "float32"},
        ],
        "input_dtype": "",
        "labels": True,
        "classes": 2,
    }


def test_it_names_the_input_a_dataset_has_no_array_for(tmp_path):
    samples = several_samples()
    del samples["mask"]
    path = save_npz(tmp_path / "d.npz", **samples)

    with pytest.raises(DatasetError) as refused:
        load_npz(path, [spec["name"] for spec in SEVERAL], require_labels=False, cap=CAP)

    assert str(refused.value) == (
        "The dataset has no array for input 'mask' (it holds: image, tokens, scale); "
        "save one per input: np.savez(f, image=..., mask=..., tokens=..., scale=...)."
    )


def test_a_single_input_model_takes_inputs_or_an_array_named_after_its_input(tmp_path):
    image = np.ones((3, 3, 4, 4), np.float32)

    by_layout = load_npz(
        save_npz(tmp_path / "a.npz", inputs=image), ["image"], require_labels=False, cap=CAP
    )
    by_name = load_npz(
        save_npz(tmp_path / "b.npz", image=image), ["image"], require_labels=False, cap=CAP
    )

    np.testing.assert_array_equal(by_layout["inputs"]["image"], image)
    np.testing.assert_array_equal(by_name["inputs"]["image"], image)


def test_every_input_needs_one_row_per_sample(tmp_path):
    samples = {**several_samples(), "tokens": np.zeros((5, 5), np.int64)}
    path = save_npz(tmp_path / "d.npz", **samples)

    with pytest.raises(DatasetError, match="the rows differ: 'image' 6, 'mask' 6, 'tokens' 5"):
        load_npz(path, [spec["name"] for spec in SEVERAL], require_labels=False, cap=CAP)


@pytest.mark.parametrize(
    "name, samples, message",
    [
        ("tokens", np.zeros((6, 5), np.float32), "holds float32 values but 'tokens' takes int64"),
        ("mask", np.full((6, 4, 4), 2, np.int64), "holds int64 values but 'mask' takes bool"),
        ("mask", np.zeros((6, 4, 5), bool), r"'mask' samples have shape \(4, 5\) .* \(4, 4\)"),
        ("scale", np.zeros((6, 1), np.float32), r"'scale' samples have shape \(1,\) .* \(\)"),
        ("image", np.zeros((6, 3, 4, 4), bool), "holds bool values but 'image' takes float"),
    ],
)
def test_it_checks_each_input_against_its_dtype_and_contract(name, samples, message):
    with pytest.raises(DatasetError, match=message):
        check_against_contract({**several_samples(), name: samples}, SEVERAL, several_contract())


def test_a_bool_input_takes_zeros_and_ones_and_integer_inputs_take_any_integer_type():
    samples = {
        **several_samples(),
        "mask": np.eye(4, dtype=np.uint8)[None].repeat(6, axis=0),
        "tokens": np.ones((6, 5), np.int8),
    }

    check_against_contract(samples, SEVERAL, several_contract())
