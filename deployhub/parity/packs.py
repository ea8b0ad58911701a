"""Check an uploaded parity pack against a version before anything is stored.

The zip goes through the registry's archive checks (no '..', links or bombs),
its images through the dataset loader's image checks (pixel limit before
decoding), and its tensors.npz is read without unpickling. Members are paired
by workers/parity.py, the same rules the worker reads the pack by.
"""

import math

import numpy as np

from deployhub.registry.archives import safe_extract_zip
from deployhub.registry.datasets import DatasetError, open_image, open_npz, read_array
from deployhub.registry.inspect import InvalidModel
from workers.parity import PackError, check_pairs, index_pack, without_batch_axis

MAX_IMAGES = 64  # "a few": a pack is a spot check, not a dataset
MAX_MEMBERS = 4 * MAX_IMAGES  # room for folders and macOS resource forks
MAX_PACK_BYTES = 512 * 1024**2  # extracted
MAX_PIXELS = 4096 * 4096
MAX_TENSOR_BYTES = 64 * 1024**2


def check_pack(path, version, work, *, cap):
    """Validate a received pack for this version; return {"samples", "names"} or raise PackError.

    The pack and its tensors.npz unpack under the compression-ratio cap (zip bombs).
    """
    folder = work / "pack"
    names = _extract(path, folder, cap)
    tensors, images = index_pack(names)
    if len(images) > MAX_IMAGES:
        raise PackError(
            f"The pack holds {len(images)} images; a parity check takes at most {MAX_IMAGES}: "
            "a few images that cover your inputs are enough."
        )
    dims = sample_dims(version)
    npz_path = folder / tensors
    with _guarded(open_npz, npz_path, work, cap=cap, max_total_bytes=MAX_PACK_BYTES) as npz:
        check_pairs(images, npz.files)
        for stem in sorted(images):
            _check_tensor(_guarded(read_array, npz, stem, MAX_TENSOR_BYTES), stem, dims)
    for name in images.values():
        _guarded(open_image, folder / name, name, MAX_PIXELS).close()
    return {"samples": len(images), "names": sorted(images)}


def _extract(path, folder, cap):
    try:
        return safe_extract_zip(
            path, folder, max_total_bytes=MAX_PACK_BYTES, cap=cap, max_members=MAX_MEMBERS
        )
    except InvalidModel as exc:
        raise PackError(str(exc)) from exc


def _guarded(read, *args, **kwargs):
    """Call a dataset-loader helper, turning its refusal into a PackError."""
    try:
        return read(*args, **kwargs)
    except DatasetError as exc:
        raise PackError(str(exc).replace("The .npz", "tensors.npz")) from exc


def sample_dims(version):
    """Return the model input's per-sample dims: ints, or (min, max) for dynamic axes."""
    if len(version.inputs) != 1:
        raise PackError(
            f"Parity checks need a model with one input; {version} has {len(version.inputs)}."
        )
    spec = version.inputs[0]
    entry = (version.contract.get("inputs") or {}).get(spec["name"]) if version.contract else None
    if entry and entry.get("shape"):
        return [
            (entry["dynamic"][str(axis)]["min"], entry["dynamic"][str(axis)]["max"])
            if isinstance(dim, str)
            else dim
            for axis, dim in enumerate(entry["shape"][1:], start=1)
        ]
    shape = spec.get("shape")
    return [d if isinstance(d, int) else (1, math.inf) for d in shape[1:]] if shape else None


def transposes(dims):
    """Return the dims and their channels-last / channels-first transposes (for 3-D inputs)."""
    if len(dims) != 3:
        return [dims]
    return [dims, [dims[1], dims[2], dims[0]], [dims[2], dims[0], dims[1]]]


def _fits(shape, dims):
    return len(shape) == len(dims) and all(
        _fits_dim(got, want) for got, want in zip(shape, dims, strict=True)
    )


def _fits_dim(got, want):
    if isinstance(want, tuple):
        return want[0] <= got <= want[1]
    return got == want


def _check_tensor(array, stem, dims):
    if array.dtype.kind not in "iuf":
        raise PackError(
            f"The tensor {stem!r} holds {array.dtype} values; save the numbers the model was fed."
        )
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise PackError(f"The tensor {stem!r} contains NaN or infinite values.")
    shape = without_batch_axis(array.shape)
    if dims is not None and not any(_fits(shape, option) for option in transposes(dims)):
        raise PackError(
            f"The tensor {stem!r} has shape {tuple(array.shape)}; the model takes "
            f"{_shown(dims)} per sample (NCHW or NHWC), with or without a leading batch axis of 1."
        )


def _shown(dims):
    parts = [f"{d[0]}..{d[1]}" if isinstance(d, tuple) else str(d) for d in dims]
    return f"({', '.join(parts)})"
