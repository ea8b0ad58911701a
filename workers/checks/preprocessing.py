"""Turn a model version's preprocessing spec into the code that feeds the model.

The spec is part of every model version. DeployHub generates a readable Python
function from it, shows that source to the user to copy, and runs exactly that
source itself (`compile_preprocess`), so the hub, the device workers and the
user's application cannot drift apart. numpy and Pillow only: the hub and the
workers both import this module.
"""

import json
import math

INTERPOLATIONS = {
    "nearest": "NEAREST",
    "bilinear": "BILINEAR",
    "bicubic": "BICUBIC",
    "lanczos": "LANCZOS",
    "box": "BOX",
    "hamming": "HAMMING",
}
COLOR_ORDERS = ("RGB", "BGR", "GRAY")
LAYOUTS = ("NCHW", "NHWC")
DTYPES = ("float32", "float16", "uint8")
KEYS = ("resize", "center_crop", "color_order", "scale", "mean", "std", "layout", "dtype")
# ITU-R 601-2 luma, the weights Pillow's convert("L") uses (here without rounding).
GRAY_WEIGHTS = (0.299, 0.587, 0.114)


class SpecError(ValueError):
    """The preprocessing spec is invalid; the message names the field and the problem."""


def validate_spec(spec):
    """Return a normalised copy of a preprocessing spec with defaults filled in, or raise."""
    if not isinstance(spec, dict):
        raise SpecError(f"The preprocessing spec must be a JSON object, not {type(spec).__name__}.")
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise SpecError(f"{unknown[0]}: unknown field (known fields: {', '.join(KEYS)}).")
    color_order = _choice(spec, "color_order", COLOR_ORDERS, "RGB")
    channels = 1 if color_order == "GRAY" else 3
    normalised = {
        "resize": _size(spec.get("resize"), "resize", interpolation=True),
        "center_crop": _size(spec.get("center_crop"), "center_crop", interpolation=False),
        "color_order": color_order,
        "scale": _scale(spec.get("scale", 1.0)),
        "mean": _vector(spec.get("mean", [0.0] * channels), "mean", channels),
        "std": _vector(spec.get("std", [1.0] * channels), "std", channels),
        "layout": _choice(spec, "layout", LAYOUTS, "NCHW"),
        "dtype": _choice(spec, "dtype", DTYPES, "float32"),
    }
    _check_crop_fits(normalised)
    _check_uint8(normalised)
    return normalised


def _choice(spec, field, allowed, default):
    value = spec.get(field, default)
    if not isinstance(value, str) or value.upper() not in [a.upper() for a in allowed]:
        raise SpecError(f"{field}: {value!r} is not one of {', '.join(allowed)}.")
    return next(a for a in allowed if a.upper() == value.upper())


def _size(value, field, *, interpolation):
    if value is None:
        return None
    keys = ("height", "width", "interpolation") if interpolation else ("height", "width")
    if not isinstance(value, dict):
        raise SpecError(f"{field}: must be an object with {', '.join(keys)}.")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise SpecError(f"{field}.{unknown[0]}: unknown field (known: {', '.join(keys)}).")
    size = {axis: _positive_int(value.get(axis), f"{field}.{axis}") for axis in keys[:2]}
    if interpolation:
        size["interpolation"] = _interpolation(value.get("interpolation"), field)
    return size


def _positive_int(value, field):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(f"{field}: must be a positive whole number, not {value!r}.")
    return value


def _interpolation(value, field):
    # Required, not defaulted: libraries disagree on the default (Pillow: bicubic,
    # torchvision: bilinear), and a silent mismatch is what this spec exists to prevent.
    if not isinstance(value, str) or value.lower() not in INTERPOLATIONS:
        raise SpecError(
            f"{field}.interpolation: {value!r} is not one of {', '.join(INTERPOLATIONS)}."
        )
    return value.lower()


def _number(value, field):
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(f"{field}: must be a finite number, not {value!r}.")
    return float(value)


def _scale(value):
    scale = _number(value, "scale")
    if scale <= 0:
        raise SpecError(f"scale: must be greater than 0, not {value!r}.")
    return scale


def _vector(value, field, channels):
    if not isinstance(value, list | tuple):
        raise SpecError(f"{field}: must be a list of {channels} numbers, not {value!r}.")
    if len(value) != channels:
        raise SpecError(
            f"{field}: has {len(value)} values but the color order has {channels} "
            f"channel{'s' if channels > 1 else ''}."
        )
    numbers = [_number(v, f"{field}[{i}]") for i, v in enumerate(value)]
    if field == "std" and 0.0 in numbers:
        raise SpecError("std: contains 0, which would divide by zero.")
    return numbers


def _check_crop_fits(spec):
    resize, crop = spec["resize"], spec["center_crop"]
    if resize and crop and (crop["height"] > resize["height"] or crop["width"] > resize["width"]):
        raise SpecError(
            f"center_crop: {crop['height']}x{crop['width']} is larger than the "
            f"{resize['height']}x{resize['width']} resize."
        )


def _check_uint8(spec):
    # Casting 0..1 or mean-centred values to uint8 leaves only 0s and 1s: a 0-255 mismatch.
    channels = len(spec["mean"])
    if spec["dtype"] == "uint8" and (
        spec["scale"] != 1.0 or spec["mean"] != [0.0] * channels or spec["std"] != [1.0] * channels
    ):
        raise SpecError(
            "dtype: uint8 feeds raw 0-255 pixels; scale, mean and std must stay 1, 0, 1."
        )


def generate_code(spec, title=None):
    """Return the source of standalone preprocess(image) and preprocess_batch(images) functions."""
    spec = validate_spec(spec)
    lines = _header(spec, title)
    lines += ["import numpy as np", "from PIL import Image", "", ""]
    lines += _preprocess_function(spec)
    lines += ["", ""] + _batch_function()
    return "\n".join(lines) + "\n"


def _header(spec, title):
    # splitlines() so that a title can never end the comment and inject code.
    lines = [f"# {line}".rstrip() for line in (title or "").splitlines()]
    lines.append("# Generated by DeployHub from this preprocessing spec:")
    lines += [f"#   {key}: {json.dumps(value)}" for key, value in spec.items()]
    return lines


def _preprocess_function(spec):
    out_layout = "CHW" if spec["layout"] == "NCHW" else "HWC"
    body = [
        "def preprocess(image):",
        f'    """Turn one image into the model\'s {out_layout} {spec["dtype"]} input.',
        "",
        "    image: a PIL image, or an HxWxC uint8 NumPy array in RGB order.",
        "    Returns one tensor without the batch axis.",
        '    """',
        "    if isinstance(image, np.ndarray):",
        "        if image.dtype != np.uint8:",
        '            raise TypeError(f"expected a uint8 RGB array, got dtype {image.dtype}")',
        "        image = Image.fromarray(image)",
        '    image = image.convert("RGB")',
    ]
    body += _resize_lines(spec["resize"])
    body += _crop_lines(spec["center_crop"], resized=spec["resize"] is not None)
    body.append("    x = np.asarray(image, dtype=np.float32)  # HxWx3, RGB, 0..255")
    body += _color_lines(spec["color_order"])
    body += _normalise_lines(spec)
    if spec["layout"] == "NCHW":
        body.append("    x = x.transpose(2, 0, 1)  # HWC -> CHW")
    return body + _cast_lines(spec["dtype"])


def _resize_lines(resize):
    if resize is None:
        return []
    method = INTERPOLATIONS[resize["interpolation"]]
    size = f"({resize['width']}, {resize['height']})"
    return [f"    image = image.resize({size}, Image.Resampling.{method})  # (width, height)"]


def _crop_lines(crop, *, resized):
    if crop is None:
        return []
    height, width = crop["height"], crop["width"]
    lines = [f"    # Center crop to {height}x{width}; offsets rounded like torchvision's."]
    if not resized:
        lines += [
            f"    if image.height < {height} or image.width < {width}:",
            "        raise ValueError(",
            f'            f"image is {{image.height}}x{{image.width}}, '
            f'smaller than the {height}x{width} crop"',
            "        )",
        ]
    return lines + [
        f"    top = int(round((image.height - {height}) / 2.0))",
        f"    left = int(round((image.width - {width}) / 2.0))",
        f"    image = image.crop((left, top, left + {width}, top + {height}))",
    ]


def _color_lines(color_order):
    if color_order == "BGR":
        return ["    x = x[:, :, ::-1]  # RGB -> BGR"]
    if color_order == "GRAY":
        weights = ", ".join(f"[{w!r}]" for w in GRAY_WEIGHTS)
        return [
            "    # RGB -> GRAY: ITU-R 601-2 luma (Pillow's convert('L') weights, not rounded)",
            f"    x = x @ np.array([{weights}], dtype=np.float32)  # HxWx1",
        ]
    return []


def _normalise_lines(spec):
    lines = []
    if spec["scale"] != 1.0:
        lines.append(f"    x = x * np.float32({spec['scale']!r})")
    channels = len(spec["mean"])
    if spec["mean"] != [0.0] * channels or spec["std"] != [1.0] * channels:
        lines += [
            f"    mean = np.array({spec['mean']!r}, dtype=np.float32)",
            f"    std = np.array({spec['std']!r}, dtype=np.float32)",
            "    x = (x - mean) / std",
        ]
    return lines


def _cast_lines(dtype):
    if dtype == "uint8":
        return ["    return np.ascontiguousarray(np.clip(np.rint(x), 0, 255), dtype=np.uint8)"]
    return [f"    return np.ascontiguousarray(x, dtype=np.{dtype})"]


def _batch_function():
    return [
        "def preprocess_batch(images):",
        '    """Preprocess several images and stack them along a new batch axis 0."""',
        "    return np.stack([preprocess(image) for image in images])",
    ]


def _namespace(spec):
    namespace = {"__name__": "deployhub_preprocessing"}
    exec(compile(generate_code(spec), "<deployhub preprocessing>", "exec"), namespace)
    return namespace


def compile_preprocess(spec):
    """Run the generated source and return its preprocess(image) function."""
    return _namespace(spec)["preprocess"]


def apply(spec, images):
    """Preprocess a sequence of images into one batch with the spec's layout and dtype."""
    images = list(images)
    if not images:
        raise ValueError("apply() needs at least one image.")
    return _namespace(spec)["preprocess_batch"](images)
