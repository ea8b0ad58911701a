"""Check an uploaded parity pack against a version before anything is stored.

The pack is read in a capped child process (`python -m deployhub.parity.packs`,
served by registry/validate.py), never in the web process, which gets back the
sample names only. The zip goes through the registry's archive checks (no '..',
links, or bombs: the compression-ratio cap holds for the pack and its
tensors.npz), its images through the dataset loader's image checks (pixel limit
before decoding), and its tensors.npz is read without unpickling. Members are
paired by workers/checks/parity.py, the same rules the worker reads the pack by.
"""

import math
import sys

import numpy as np

from deployhub.registry.archives import safe_extract_zip
from deployhub.registry.datasets import DatasetError, open_image, open_npz, read_array
from deployhub.registry.inspect import InvalidModel
from deployhub.registry.validate import serve
from workers.checks.parity import PackError, check_pairs, index_pack, without_batch_axis

KIND = "parity-pack"
MAX_IMAGES = 64  # "a few": a pack is a spot check, not a dataset
MAX_MEMBERS = 4 * MAX_IMAGES  # room for folders and macOS resource forks
MAX_PACK_BYTES = 512 * 1024**2  # extracted
MAX_PIXELS = 4096 * 4096
MAX_TENSOR_BYTES = 64 * 1024**2


def pack_params(version):
    """Return what the child needs to check a pack for this version: its input and the limits."""
    if len(version.inputs) != 1:
        raise PackError(
            f"Parity checks need a model with one input; {version} has {len(version.inputs)}."
        )
    return {
        "input": version.inputs[0],
        "contract": version.contract,
        "max_images": MAX_IMAGES,
        "max_members": MAX_MEMBERS,
        "max_pixels": MAX_PIXELS,
        "max_pack_bytes": MAX_PACK_BYTES,
        "max_tensor_bytes": MAX_TENSOR_BYTES,
    }


def read_pack(path, work, params, cap):
    """Validate a pack in the child; return {"samples", "names"} or raise PackError.

    The pack and its tensors.npz unpack under the compression-ratio cap (zip bombs).
    """
    folder = work / "pack"
    names = _extract(path, folder, params, cap)
    tensors, images = index_pack(names)
    if len(images) > params["max_images"]:
        raise PackError(
            f"The pack holds {len(images)} images; a parity check takes at most "
            f"{params['max_images']}: a few images that cover your inputs are enough."
        )
    dims = sample_dims(params["input"], params["contract"])
    limit, tensor_limit = params["max_pack_bytes"], params["max_tensor_bytes"]
    with _guarded(open_npz, folder / tensors, work, cap=cap, max_total_bytes=limit) as npz:
        check_pairs(images, npz.files)
        for stem in sorted(images):
            _check_tensor(_guarded(read_array, npz, stem, tensor_limit), stem, dims)
    for name in images.values():
        _guarded(open_image, folder / name, name, params["max_pixels"]).close()
    return {"samples": len(images), "names": sorted(images)}


def _extract(path, folder, params, cap):
    try:
        return safe_extract_zip(
            path,
            folder,
            max_total_bytes=params["max_pack_bytes"],
            cap=cap,
            max_members=params["max_members"],
        )
    except InvalidModel as exc:
        raise PackError(str(exc)) from exc


def _guarded(read, *args, **kwargs):
    """Call a dataset-loader helper, turning its refusal into a PackError."""
    try:
        return read(*args, **kwargs)
    except DatasetError as exc:
        raise PackError(str(exc).replace("The .npz", "tensors.npz")) from exc


def sample_dims(spec, contract):
    """Return the model input's per-sample dims: ints, or (min, max) for dynamic axes."""
    entry = ((contract or {}).get("inputs") or {}).get(spec["name"])
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


if __name__ == "__main__":
    serve({KIND: read_pack}, sys.argv[1:])
