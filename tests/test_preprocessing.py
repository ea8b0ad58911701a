"""The preprocessing spec: validation, generated code, and what it computes."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from workers.checks.preprocessing import (
    SpecError,
    apply,
    compile_preprocess,
    generate_code,
    validate_spec,
)

ASSETS = Path(__file__).resolve().parent.parent / "deployhub" / "demo" / "assets"
DEMO_SPEC = json.loads((ASSETS / "manifest.json").read_text())["preprocessing"]
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
RUNNER = """
import runpy
import sys
import numpy as np
from PIL import Image
sys.modules["workers"] = sys.modules["deployhub"] = None  # importing them now fails
preprocess_batch = runpy.run_path("generated.py")["preprocess_batch"]
images = [Image.open(path) for path in sys.argv[2:]]
np.save(sys.argv[1], preprocess_batch(images))
"""


def demo_samples():
    with np.load(ASSETS / "samples" / "tensors.npz", allow_pickle=False) as npz:
        paths = [ASSETS / "samples" / name for name in npz["names"]]
        return paths, npz["inputs"]


def tiny_image(height=4, width=5):
    return np.random.default_rng(7).integers(0, 256, size=(height, width, 3), dtype=np.uint8)


def run(spec, image):
    return compile_preprocess(spec)(image)


def test_it_reproduces_the_demo_sample_tensors_from_the_pngs():
    paths, expected = demo_samples()

    actual = apply(DEMO_SPEC, [Image.open(path) for path in paths])

    assert actual.dtype == np.float32
    assert actual.shape == expected.shape == (8, 3, 32, 32)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5)


def test_it_accepts_a_uint8_rgb_array_like_a_pil_image():
    paths, expected = demo_samples()
    array = np.asarray(Image.open(paths[0]).convert("RGB"))

    np.testing.assert_allclose(run(DEMO_SPEC, array), expected[0], rtol=0, atol=1e-5)


def test_it_refuses_a_float_array():
    with pytest.raises(TypeError, match="uint8"):
        run(DEMO_SPEC, tiny_image().astype(np.float32))


def test_the_generated_source_runs_standalone(tmp_path):
    paths, expected = demo_samples()
    (tmp_path / "generated.py").write_text(generate_code(DEMO_SPEC, title="digits-cnn v2"))
    (tmp_path / "runner.py").write_text(RUNNER)
    out = tmp_path / "out.npy"

    done = subprocess.run(
        [sys.executable, "-I", "runner.py", str(out), *map(str, paths)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(np.load(out), expected, rtol=0, atol=1e-5)


def test_it_imports_only_numpy_and_pillow_and_inlines_the_spec():
    source = generate_code(DEMO_SPEC, title="digits-cnn v2 (sha256 abc)")
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]

    assert imports == ["import numpy as np", "from PIL import Image"]
    assert source.startswith("# digits-cnn v2 (sha256 abc)\n")
    assert "Image.Resampling.BILINEAR" in source
    assert "[0.229, 0.224, 0.225]" in source


def test_a_title_cannot_inject_code():
    source = generate_code(DEMO_SPEC, title="v1\nraise SystemExit('owned')\r\nx = 1")
    namespace = {}

    exec(source, namespace)

    assert "x" not in namespace
    assert all(line.startswith("# ") for line in source.splitlines()[:3])


def test_it_reorders_channels_to_bgr():
    image = tiny_image()
    spec = dict(DEMO_SPEC, resize=None, color_order="BGR")

    expected = ((image[:, :, ::-1] / np.float32(255) - MEAN) / STD).transpose(2, 0, 1)
    np.testing.assert_allclose(run(spec, image), expected, rtol=0, atol=1e-5)


def test_it_converts_to_gray_with_one_channel():
    image = tiny_image()
    spec = {"color_order": "GRAY", "scale": 1 / 255, "mean": [0.5], "std": [0.25]}

    luma = image.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    expected = ((luma / 255 - 0.5) / 0.25)[None, :, :]
    actual = run(spec, image)
    assert actual.shape == (1, 4, 5)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5)


def test_it_keeps_channels_last_for_nhwc():
    image = tiny_image()

    actual = run({"layout": "NHWC"}, image)

    assert actual.shape == (4, 5, 3)
    np.testing.assert_array_equal(actual, image.astype(np.float32))


def test_it_center_crops_after_resizing():
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    spec = {
        "resize": {"height": 4, "width": 6, "interpolation": "nearest"},
        "center_crop": {"height": 2, "width": 2},
    }

    resized = image.repeat(2, axis=0).repeat(2, axis=1)  # nearest 2x upscale
    np.testing.assert_array_equal(run(spec, image), resized[1:3, 2:4].transpose(2, 0, 1))


def test_it_rounds_odd_crop_offsets_like_torchvision():
    image = tiny_image(5, 6)

    actual = run({"center_crop": {"height": 2, "width": 3}, "layout": "NHWC"}, image)

    # torchvision: top = round(3 / 2) = 2, left = round(3 / 2) = 2 (half to even).
    np.testing.assert_array_equal(actual, image[2:4, 2:5])


def test_it_refuses_an_image_smaller_than_the_crop():
    with pytest.raises(ValueError, match="smaller than the 8x8 crop"):
        run({"center_crop": {"height": 8, "width": 8}}, tiny_image())


def test_it_casts_to_float16_last():
    image = tiny_image()
    spec = dict(DEMO_SPEC, resize=None, dtype="float16")

    actual = run(spec, image)

    assert actual.dtype == np.float16
    full = run(dict(spec, dtype="float32"), image)
    np.testing.assert_array_equal(actual, full.astype(np.float16))


def test_it_feeds_raw_pixels_as_uint8():
    image = tiny_image()

    actual = run({"dtype": "uint8"}, image)

    assert actual.dtype == np.uint8
    np.testing.assert_array_equal(actual, image.transpose(2, 0, 1))


def test_preprocess_batch_adds_the_batch_axis():
    images = [tiny_image(), tiny_image()]

    assert apply({"layout": "NHWC"}, images).shape == (2, 4, 5, 3)


def test_it_fills_defaults():
    assert validate_spec({}) == {
        "resize": None,
        "center_crop": None,
        "color_order": "RGB",
        "scale": 1.0,
        "mean": [0.0, 0.0, 0.0],
        "std": [1.0, 1.0, 1.0],
        "layout": "NCHW",
        "dtype": "float32",
    }
    assert validate_spec({"color_order": "GRAY"})["mean"] == [0.0]


@pytest.mark.parametrize("spec", [{}, DEMO_SPEC, {"color_order": "bgr", "layout": "nhwc"}])
def test_validate_spec_is_idempotent(spec):
    once = validate_spec(spec)

    assert validate_spec(once) == once
    assert json.loads(json.dumps(once)) == once


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"normalize": True}, "normalize: unknown field"),
        ({"resize": {"height": 32, "width": 32, "interpolation": "cubic"}}, "resize.interpolation"),
        ({"resize": {"height": 32, "width": 32}}, "resize.interpolation"),
        ({"resize": {"height": 0, "width": 32, "interpolation": "box"}}, "resize.height"),
        ({"resize": {"height": 32, "width": 3.5, "interpolation": "box"}}, "resize.width"),
        ({"resize": {"height": 8, "width": 8, "interpolation": "box", "x": 1}}, "resize.x"),
        ({"center_crop": {"height": True, "width": 8}}, "center_crop.height"),
        (
            {
                "resize": {"height": 8, "width": 8, "interpolation": "box"},
                "center_crop": {"height": 9, "width": 8},
            },
            "center_crop: 9x8 is larger",
        ),
        ({"color_order": "RGBA"}, "color_order"),
        ({"mean": [0.5, 0.5]}, "mean: has 2 values but the color order has 3"),
        ({"color_order": "GRAY", "std": [0.2, 0.2, 0.2]}, "std: has 3 values"),
        ({"std": [0.2, 0, 0.2]}, "std: contains 0"),
        ({"mean": [0.5, "x", 0.5]}, r"mean\[1\]"),
        ({"scale": float("nan")}, "scale"),
        ({"scale": -1}, "scale"),
        ({"layout": "CHW"}, "layout"),
        ({"dtype": "int8"}, "dtype"),
        ({"dtype": "uint8", "scale": 1 / 255}, "dtype: uint8"),
    ],
)
def test_it_names_the_field_of_an_invalid_spec(spec, message):
    with pytest.raises(SpecError, match=message):
        validate_spec(spec)


def test_it_refuses_a_spec_that_is_not_an_object():
    with pytest.raises(SpecError, match="JSON object"):
        validate_spec([1, 2])
