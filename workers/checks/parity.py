"""Preprocessing parity: does a version's spec reproduce what its training pipeline fed the model?

A parity pack is a zip of a few raw images and `tensors.npz`, holding one array
per image, keyed by the image's file name without its extension: the tensor the
training pipeline made from that image (with or without a leading batch axis
of 1). The worker applies the version's spec with workers/checks/preprocessing.py,
the code the product itself runs, and compares. On a mismatch it tries the
usual suspects one at a time (channels swapped, /255, mean/std, NHWC vs NCHW,
another interpolation), then in pairs, and says which variant of the spec
reproduces training. The hub imports this module too, to read a pack by the
same rules when it validates an upload.
"""

import itertools
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image

from workers.checks import preprocessing
from workers.errors import Cancelled, JobError

TENSORS = "tensors.npz"
# The image formats the dataset loader takes (deployhub/registry/datasets.py).
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
# Pipelines that agree differ by float32 rounding, about 1e-7 of the pixel range;
# any real mismatch is off by 1/255 (0.004) or far more. Hence 1e-3 of the 0-1 range.
UNIT_TOLERANCE = 1e-3
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
SPEC_SHARE = 0.2  # of the progress bar: applying the spec; the rest is the diagnosis


class PackError(JobError):
    """The parity pack does not hold what it should; the message says what to fix."""


# Reading a pack ----------------------------------------------------------------


def index_pack(names):
    """Return (tensors member, {stem: image member}) from a pack's member names, or raise."""
    files = [name for name in names if not name.endswith("/") and not _is_junk(name)]
    prefix = _wrapping_folder(files)
    tensors, images = None, {}
    for name in files:
        relative = name[len(prefix) :]
        if relative == TENSORS:
            tensors = name
        else:
            _add_image(images, name, relative)
    if tensors is None:
        raise PackError(f"The pack has no {TENSORS}. {pack_format()}")
    if not images:
        raise PackError(f"The pack holds no images. {pack_format()}")
    return tensors, images


def pack_format():
    """Say in one sentence what a parity pack holds."""
    suffixes = ", ".join(sorted(IMAGE_SUFFIXES))
    return (
        f"A parity pack is a .zip of a few raw images ({suffixes}) and {TENSORS}, which holds "
        "for each image the tensor the training pipeline made from it, keyed by the image's "
        "file name without its extension (np.savez('tensors.npz', cat=..., dog=...))."
    )


def _is_junk(name):
    # macOS archives carry __MACOSX/ and ._name resource forks, which are not images.
    return any(part.startswith(".") or part == "__MACOSX" for part in PurePosixPath(name).parts)


def _wrapping_folder(files):
    """Return the folder that "compress folder" tools wrap everything in ("" when none)."""
    prefix = ""
    while files and all(name[len(prefix) :].count("/") >= 1 for name in files):
        heads = {name[len(prefix) :].split("/", 1)[0] for name in files}
        if len(heads) != 1:
            break
        prefix += heads.pop() + "/"
    return prefix


def _add_image(images, name, relative):
    path = PurePosixPath(relative)
    if "/" in relative:
        raise PackError(
            f"{name!r} is in a folder: put the images and {TENSORS} side by side at the top "
            "of the zip."
        )
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise PackError(f"{name!r} is neither an image nor {TENSORS}. {pack_format()}")
    if path.stem in images:
        raise PackError(
            f"Two images are named {path.stem!r} ({images[path.stem]!r} and {name!r}); "
            "tensors are keyed by name, so every image needs its own."
        )
    images[path.stem] = name


def check_pairs(images, keys):
    """Refuse an image without a tensor, or a tensor without an image, naming them."""
    missing = sorted(set(images) - set(keys))
    if missing:
        raise PackError(
            f"{TENSORS} has no tensor for the image {images[missing[0]]!r}: add an array "
            f"named {missing[0]!r}."
        )
    extra = sorted(set(keys) - set(images))
    if extra:
        raise PackError(f"{TENSORS} holds {extra[0]!r}, but the pack has no image of that name.")


def without_batch_axis(shape):
    """Return a tensor's per-sample shape: a leading batch axis of 1 dropped from a 4-D shape."""
    shape = tuple(shape)
    return shape[1:] if len(shape) == 4 and shape[0] == 1 else shape


@dataclass
class Sample:
    """One image of a pack and the tensor training made from it."""

    name: str
    image: Image.Image
    expected: np.ndarray


def load_pack(path, folder):
    """Extract a parity pack (validated by the hub) into folder; return its samples."""
    with zipfile.ZipFile(path) as archive:
        tensors, images = index_pack(archive.namelist())
        archive.extractall(folder)
    with np.load(Path(folder) / tensors, allow_pickle=False) as npz:
        check_pairs(images, npz.files)
        return [
            Sample(stem, _read_image(Path(folder) / images[stem]), _expected(npz, stem))
            for stem in sorted(images)
        ]


def _read_image(path):
    try:
        with Image.open(path) as image:
            image.load()
            return image.copy()
    except Exception as exc:  # Pillow's decoders raise many unrelated types
        raise PackError(f"{path.name!r} could not be read as an image: {exc}") from exc


def _expected(npz, stem):
    array = npz[stem]
    if array.dtype.kind not in "iuf":
        raise PackError(f"The tensor {stem!r} holds {array.dtype} values; save numbers.")
    return array.reshape(without_batch_axis(array.shape))


# Comparing ---------------------------------------------------------------------


def default_tolerance(spec):
    """Return 1e-3 of the 0-1 pixel range, in the units of the spec's output."""
    return UNIT_TOLERANCE * 255 * spec["scale"] / min(abs(s) for s in spec["std"])


def _error(actual, expected):
    """Return the largest |actual - expected|; None when shapes differ or a value is not finite."""
    if actual.shape != expected.shape:
        return None
    error = float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64))))
    return error if math.isfinite(error) else None


@dataclass
class Outcome:
    """How one variant of the spec compares with training, sample by sample."""

    errors: list
    shapes: list
    tolerance: float

    @property
    def matches(self):
        return all(e is not None and e <= self.tolerance for e in self.errors)

    @property
    def max_error(self):
        """Return the largest error over the samples; None if any shape differs."""
        return None if None in self.errors else max(self.errors)

    def rank(self):
        """Return a sort key: matching first, then the smallest error."""
        return (not self.matches, math.inf if self.max_error is None else self.max_error)


def compare(spec, samples, tolerance):
    """Apply a spec to every sample and compare with training's tensors."""
    preprocess = preprocessing.compile_preprocess(spec)
    actual = [_apply(preprocess, sample) for sample in samples]
    errors = [_error(a, s.expected) for a, s in zip(actual, samples, strict=True)]
    return Outcome(errors, [list(a.shape) for a in actual], tolerance)


def _apply(preprocess, sample):
    try:
        return preprocess(sample.image)
    except ValueError as exc:  # an image smaller than a center crop without resize
        raise PackError(f"{sample.name!r}: {exc}") from exc


# The usual suspects ------------------------------------------------------------


@dataclass
class Suspect:
    """One way training may have differed from the spec, as a change to the spec."""

    name: str
    phrase: str  # "if channels are swapped"
    detail: str  # "the spec says RGB, training fed BGR"
    change: object  # fn(spec) -> spec

    def sentence(self):
        return f"matches {self.phrase}: {self.detail}"


def suspects(spec):
    """Return the suspects that apply to this spec; mean/std changes come last (see _pair)."""
    found = [_swapped(spec), _scaled(spec), _layout(spec)]
    found += _interpolations(spec) + [_normalised(spec)]
    return [suspect for suspect in found if suspect is not None]


def _swapped(spec):
    if spec["color_order"] == "GRAY":
        return None
    other = "BGR" if spec["color_order"] == "RGB" else "RGB"
    return Suspect(
        "channels_swapped",
        "if channels are swapped",
        f"the spec says {spec['color_order']}, training fed {other}",
        lambda s: {**s, "color_order": other},
    )


def _scaled(spec):
    scale = spec["scale"]
    if scale == 1.0:
        return Suspect(
            "extra_scale",
            "with an extra /255",
            "the spec feeds 0–255, training scaled to 0–1",
            lambda s: {**s, "scale": 1 / 255, "dtype": _float(s)},
        )
    if math.isclose(scale, 1 / 255):
        phrase, detail = "without /255", "the spec scales to 0–1, training fed 0–255"
    else:
        phrase = f"without the ×{scale:.6g} scale"
        detail = f"the spec multiplies pixels by {scale:.6g}, training fed them unscaled"
    return Suspect("missing_scale", phrase, detail, lambda s: {**s, "scale": 1.0})


def _float(spec):
    # uint8 specs feed raw pixels only; a variant that scales or normalises is float.
    return "float32" if spec["dtype"] == "uint8" else spec["dtype"]


def _layout(spec):
    other = "NHWC" if spec["layout"] == "NCHW" else "NCHW"
    return Suspect(
        "layout",
        f"in {other} layout",
        f"the spec says {spec['layout']}, training fed {other}",
        lambda s: {**s, "layout": other},
    )


def _interpolations(spec):
    if spec["resize"] is None:
        return []
    said = spec["resize"]["interpolation"]
    return [
        Suspect(
            f"interpolation:{method}",
            f"with {method} resizing",
            f"the spec says {said}",
            lambda s, m=method: {**s, "resize": {**s["resize"], "interpolation": m}},
        )
        for method in preprocessing.INTERPOLATIONS
        if method != said
    ]


def _normalised(spec):
    channels = len(spec["mean"])
    if spec["mean"] != [0.0] * channels or spec["std"] != [1.0] * channels:
        return Suspect(
            "missing_mean_std",
            "without mean/std normalisation",
            f"the spec subtracts mean {_numbers(spec['mean'])} and divides by std "
            f"{_numbers(spec['std'])}, training did not normalise",
            lambda s: {**s, "mean": [0.0] * channels, "std": [1.0] * channels},
        )
    if channels != 3:
        return None
    return _imagenet(spec)


def _imagenet(spec):
    # Per output channel: a BGR spec lists its mean and std in BGR order.
    order = slice(None, None, -1) if spec["color_order"] == "BGR" else slice(None)
    mean, std = IMAGENET_MEAN[order], IMAGENET_STD[order]

    def change(s):
        unit = 255 * s["scale"]  # ImageNet's mean/std are in 0-1 units
        return {
            **s,
            "mean": [m * unit for m in mean],
            "std": [d * unit for d in std],
            "dtype": _float(s),
        }

    return Suspect(
        "extra_mean_std",
        "with ImageNet mean/std normalisation",
        f"the spec does not normalise, training subtracted mean {_numbers(mean)} and divided "
        f"by std {_numbers(std)} (in 0–1 units)",
        change,
    )


def _numbers(values):
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def _pair(first, second):
    """Return a suspect that makes both changes (second after first)."""
    return Suspect(
        f"{first.name}+{second.name}",
        f"{first.phrase} and {second.phrase}",
        f"{first.detail}; {second.detail}",
        lambda s: second.change(first.change(s)),
    )


def _pairs(found):
    # Two interpolations at once cannot both be what training did.
    return [
        _pair(a, b)
        for a, b in itertools.combinations(found, 2)
        if not (a.name.startswith("interpolation:") and b.name.startswith("interpolation:"))
    ]


# The check ---------------------------------------------------------------------


class Checker:
    """Runs the spec and its variants on a pack's samples, reporting progress."""

    def __init__(self, spec, samples, tolerance, progress, should_stop):
        self.spec, self.samples = spec, samples
        self.tolerance = tolerance  # None: 1e-3 of each variant's own 0-1 range
        self.progress, self.should_stop = progress, should_stop

    def tolerance_for(self, spec):
        return self.tolerance if self.tolerance is not None else default_tolerance(spec)

    def outcome(self, spec):
        if self.should_stop():
            raise Cancelled("stopped while comparing")
        return compare(spec, self.samples, self.tolerance_for(spec))

    def try_all(self, candidates, start, end, label):
        """Try each suspect; return [(suspect, outcome)]."""
        tried = []
        for index, suspect in enumerate(candidates):
            self.progress(
                start + (end - start) * index / len(candidates), f"{label}: {suspect.name}"
            )
            variant = preprocessing.validate_spec(suspect.change(self.spec))
            tried.append((suspect, self.outcome(variant)))
        return tried

    def diagnose(self):
        """Try single suspects, then pairs when none alone matches; return [(suspect, outcome)]."""
        found = suspects(self.spec)
        tried = self.try_all(found, SPEC_SHARE, 0.5, "trying one change")
        if not any(outcome.matches for _, outcome in tried):
            tried += self.try_all(_pairs(found), 0.5, 1.0, "trying two changes")
        return tried


def check_parity(pack_path, params, folder, progress=lambda f, m: None, should_stop=lambda: False):
    """Compare the spec in params with a parity pack and diagnose a mismatch; return the result."""
    spec, tolerance = _spec_of(params), _tolerance_of(params)
    progress(0.0, "reading the parity pack")
    samples = load_pack(pack_path, folder)
    checker = Checker(spec, samples, tolerance, progress, should_stop)
    progress(0.05, f"applying the spec to {len(samples)} images")
    outcome = checker.outcome(spec)
    tried = [] if outcome.matches else checker.diagnose()
    progress(1.0, "compared")
    return _result(spec, samples, outcome, tried, tolerance is None)


def _spec_of(params):
    try:
        return preprocessing.validate_spec(params.get("spec"))
    except preprocessing.SpecError as exc:
        raise JobError(f"the job's preprocessing spec is invalid: {exc}") from exc


def _tolerance_of(params):
    value = params.get("tolerance")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise JobError(f"tolerance must be a positive number, not {value!r}")
    if not math.isfinite(value):
        raise JobError("tolerance must be finite")
    return float(value)


# The result ---------------------------------------------------------------------


def _result(spec, samples, outcome, tried, default):
    best = min(tried, key=lambda pair: pair[1].rank()) if tried else None
    cause = best[0].sentence() if best and best[1].matches else None
    return {
        "passed": outcome.matches,
        "samples": len(samples),
        "tolerance": outcome.tolerance,
        "tolerance_source": "default" if default else "param",
        "max_abs_error": outcome.max_error,
        "per_sample": _per_sample(samples, outcome, best),
        "diagnosis": [_entry(suspect, result) for suspect, result in tried],
        "best_suspect": best[0].name if best else None,
        "cause": cause,
        "summary": _summary(samples, outcome, best, cause),
        "spec": spec,
    }


def _per_sample(samples, outcome, best):
    rows = []
    for index, sample in enumerate(samples):
        rows.append(
            {
                "name": sample.name,
                "expected_shape": list(sample.expected.shape),
                "shape": outcome.shapes[index],
                "max_abs_error": outcome.errors[index],
                "suspect_max_abs_error": best[1].errors[index] if best else None,
            }
        )
    return rows


def _entry(suspect, outcome):
    error = outcome.max_error
    if outcome.matches:
        message = suspect.sentence()
    elif error is None:
        message = f"no: {suspect.phrase}, the shapes still differ"
    else:
        message = f"no: {suspect.phrase}, the largest difference is still {error:.3g}"
    return {
        "suspect": suspect.name,
        "matches": outcome.matches,
        "max_abs_error": error,
        "tolerance": outcome.tolerance,
        "message": message,
    }


def _summary(samples, outcome, best, cause):
    count = f"{len(samples)} image{'s' if len(samples) != 1 else ''}"
    if outcome.matches:
        return (
            f"The spec reproduces the training tensors of {count}: max abs error "
            f"{outcome.max_error:.3g} ≤ {outcome.tolerance:.3g}."
        )
    if cause:
        return f"The spec does not reproduce training; it {cause}."
    closest = ""
    if best is not None and best[1].max_error is not None:
        closest = f" (closest: {best[0].phrase}, off by {best[1].max_error:.3g})"
    return (
        f"The spec does not reproduce training ({_mismatch(samples, outcome)}); "
        f"no single suspect or pair of them explains it{closest}."
    )


def _mismatch(samples, outcome):
    for index, sample in enumerate(samples):
        if outcome.errors[index] is None:
            return (
                f"{sample.name!r}: the spec makes a {tuple(outcome.shapes[index])} tensor, "
                f"training fed {tuple(sample.expected.shape)}"
            )
    return f"max abs error {outcome.max_error:.3g} > {outcome.tolerance:.3g}"
