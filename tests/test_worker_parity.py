"""The parity check on the worker: each planted preprocessing mismatch is caught and named.

The "training" tensors come from tests/parity_packs.py, written independently of
workers/checks/preprocessing.py, the way a training script would write it.
"""

import numpy as np
import pytest

from tests.parity_packs import SPEC, pack_bytes, synthetic_images, training_pipeline
from workers.checks.parity import PackError, check_parity, index_pack
from workers.errors import Cancelled


def planted_pack(tmp_path, **pipeline):
    images = synthetic_images()
    tensors = {name: training_pipeline(image, **pipeline) for name, image in images.items()}
    path = tmp_path / "pack.zip"
    path.write_bytes(pack_bytes(images, tensors))
    return path


def check(tmp_path, spec=SPEC, params=None, **pipeline):
    folder = tmp_path / "extracted"
    return check_parity(
        planted_pack(tmp_path, **pipeline), {"spec": spec, **(params or {})}, folder
    )


def matching(result):
    return [entry["suspect"] for entry in result["diagnosis"] if entry["matches"]]


def test_it_passes_a_pipeline_that_matches_the_spec(tmp_path):
    result = check(tmp_path, batch=True)
    assert result["passed"] and result["samples"] == 3
    assert result["max_abs_error"] < 1e-5 and result["tolerance"] == pytest.approx(1e-3 / 0.224)
    assert result["diagnosis"] == [] and result["cause"] is None
    assert [row["name"] for row in result["per_sample"]] == ["img0", "img1", "img2"]
    assert "reproduces the training tensors of 3 images" in result["summary"]


def test_it_names_channels_swapped(tmp_path):
    result = check(tmp_path, bgr=True)
    assert not result["passed"]
    assert matching(result) == ["channels_swapped"]
    assert result["cause"] == "matches if channels are swapped: the spec says RGB, training fed BGR"
    assert all(row["max_abs_error"] > 1 for row in result["per_sample"])
    assert all(row["suspect_max_abs_error"] < 1e-5 for row in result["per_sample"])


def test_it_names_a_missing_division_by_255(tmp_path):
    result = check(tmp_path, divide=False)
    assert matching(result) == ["missing_scale"]
    assert result["cause"] == ("matches without /255: the spec scales to 0–1, training fed 0–255")


def test_it_names_missing_mean_std(tmp_path):
    result = check(tmp_path, normalise=False)
    assert matching(result) == ["missing_mean_std"]
    assert result["cause"].startswith("matches without mean/std normalisation: the spec subtracts")


def test_it_names_nhwc_against_nchw(tmp_path):
    result = check(tmp_path, nhwc=True)
    assert matching(result) == ["layout"]
    assert result["cause"] == "matches in NHWC layout: the spec says NCHW, training fed NHWC"
    assert result["max_abs_error"] is None
    assert result["per_sample"][0]["shape"] == [3, 32, 32]
    assert result["per_sample"][0]["expected_shape"] == [32, 32, 3]


@pytest.mark.parametrize("method", ["nearest", "bicubic", "lanczos", "box", "hamming"])
def test_it_names_another_interpolation(tmp_path, method):
    result = check(tmp_path, interpolation=method)
    assert matching(result) == [f"interpolation:{method}"]
    assert result["cause"] == f"matches with {method} resizing: the spec says bilinear"


def test_it_names_two_causes_when_no_single_one_explains_it(tmp_path):
    result = check(tmp_path, bgr=True, nhwc=True)
    assert matching(result) == ["channels_swapped+layout"]
    assert result["cause"] == (
        "matches if channels are swapped and in NHWC layout: the spec says RGB, training fed BGR; "
        "the spec says NCHW, training fed NHWC"
    )


def test_it_names_normalisation_the_spec_lacks(tmp_path):
    spec = {**SPEC, "mean": [0.0] * 3, "std": [1.0] * 3}
    result = check(tmp_path, spec=spec)
    assert matching(result) == ["extra_mean_std"]
    assert "the spec does not normalise, training subtracted mean [0.485" in result["cause"]


def test_it_names_an_extra_division_for_a_raw_pixel_spec(tmp_path):
    spec = {**SPEC, "scale": 1.0, "mean": [0.0] * 3, "std": [1.0] * 3, "dtype": "uint8"}
    result = check(tmp_path, spec=spec, normalise=False)
    assert matching(result) == ["extra_scale"]
    assert (
        result["cause"]
        == "matches with an extra /255: the spec feeds 0–255, training scaled to 0–1"
    )


def test_it_says_when_nothing_explains_the_mismatch(tmp_path):
    images = synthetic_images()
    noise = np.random.default_rng(1).normal(size=(3, 32, 32)).astype(np.float32)
    path = tmp_path / "pack.zip"
    path.write_bytes(pack_bytes(images, {name: noise for name in images}))
    result = check_parity(path, {"spec": SPEC}, tmp_path / "x")
    assert not result["passed"] and result["cause"] is None and not matching(result)
    assert "no single suspect or pair of them explains it" in result["summary"]
    assert len(result["diagnosis"]) > 10  # the pairs were tried too


def test_it_uses_the_tolerance_it_is_given_and_says_so(tmp_path):
    result = check(tmp_path, params={"tolerance": 100.0}, bgr=True)
    assert result["passed"] and result["tolerance"] == 100.0
    assert result["tolerance_source"] == "param"


def test_it_stops_when_cancelled(tmp_path):
    with pytest.raises(Cancelled):
        check_parity(
            planted_pack(tmp_path, bgr=True),
            {"spec": SPEC},
            tmp_path / "x",
            should_stop=lambda: True,
        )


def test_it_reports_progress(tmp_path):
    seen = []
    check_parity(
        planted_pack(tmp_path, bgr=True),
        {"spec": SPEC},
        tmp_path / "x",
        progress=lambda f, m: seen.append((f, m)),
    )
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any("channels_swapped" in message for _, message in seen)


def test_a_wrapping_folder_and_macos_junk_are_fine():
    names = ["pack/", "pack/a.png", "pack/tensors.npz", "__MACOSX/pack/._a.png", "pack/.DS_Store"]
    assert index_pack(names) == ("pack/tensors.npz", {"a": "pack/a.png"})


@pytest.mark.parametrize(
    "names, message",
    [
        (["a.png", "b.png"], "has no tensors.npz"),
        (["tensors.npz"], "holds no images"),
        (["a.png", "sub/b.png", "tensors.npz"], "is in a folder"),
        (["a.png", "notes.txt", "tensors.npz"], "is neither an image nor tensors.npz"),
        (["a.png", "a.jpg", "tensors.npz"], "Two images are named 'a'"),
    ],
)
def test_it_refuses_a_malformed_pack(names, message):
    with pytest.raises(PackError, match=message):
        index_pack(names)


def test_it_refuses_an_unreadable_spec(tmp_path):
    with pytest.raises(ValueError, match="preprocessing spec is invalid"):
        check_parity(planted_pack(tmp_path), {"spec": {"layout": "CHWN"}}, tmp_path / "x")
