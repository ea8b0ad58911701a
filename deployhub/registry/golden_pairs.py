"""Hold golden input/output pairs to a version's signature and contract.

Runs in the capped child process (registry/validate.py, kind "golden"), never in
the web process: the file is unpacked under the archive caps, read by
workers/checks/golden.py (the code a worker runs to check an engine), and every pair
held to the version: every input given, with the model's dtype and a shape its
input-shape contract allows; the expected outputs with the model's dtype and
declared shape. The web process gets back the number of pairs and the outputs
the file checks.
"""

import shutil

import numpy as np

from deployhub.registry.archives import safe_extract_zip
from deployhub.registry.contract import BATCH
from deployhub.registry.inspect import InvalidModel
from workers.checks.golden import GoldenFileError, read_golden

MAX_PAIRS = 10_000
# The numpy dtype of each ONNX element type a golden array may hold.
DTYPES = {
    "float": np.float32,
    "double": np.float64,
    "float16": np.float16,
    "bool": np.bool_,
    **{
        name: getattr(np, name)
        for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    },
}


class GoldenError(ValueError):
    """The golden set cannot be attached; the message says why."""


def read_golden_pairs(path, workdir, params, *, cap):
    """Read a golden file and hold every pair to the version; return its pairs and outputs.

    params: format ("npz" or "onnx-pb"), the version's inputs, outputs and contract, and
    the file's caps (max_bytes unpacked, max_members).
    """
    inputs, outputs = params["inputs"], params["outputs"]
    try:
        _unpack(path, workdir / "golden", params, cap)
        pairs = read_golden(
            path,
            [spec["name"] for spec in inputs],
            [spec["name"] for spec in outputs],
            params["format"],
            max_bytes=params["max_bytes"],
        )
    except (GoldenFileError, InvalidModel) as exc:
        raise GoldenError(str(exc)) from exc
    if len(pairs) > MAX_PAIRS:
        raise GoldenError(f"The file holds {len(pairs):,} pairs; the limit is {MAX_PAIRS:,}.")
    contract = (params["contract"] or {}).get("inputs") or {}
    for index, (feeds, expected) in enumerate(pairs):
        where = _where(params["format"], index)
        for spec in inputs:
            _check_input(feeds[spec["name"]], spec, contract.get(spec["name"]), where)
        for spec in outputs:
            if spec["name"] in expected:
                _check_output(expected[spec["name"]], spec, where)
    checked = [spec["name"] for spec in outputs if spec["name"] in pairs[0][1]]
    return {"pairs": len(pairs), "outputs": checked}


def _unpack(path, folder, params, cap):
    """Unpack the file under the caps before the worker's code reads it, then drop the copy.

    Unsafe member names, links, encryption, too many members or bytes, and a compression
    ratio over the cap (a zip bomb) are refused, the ratio as the bytes come out.
    """
    safe_extract_zip(
        path,
        folder,
        max_total_bytes=params["max_bytes"],
        cap=cap,
        max_members=params["max_members"],
    )
    shutil.rmtree(folder)


def _where(golden_format, index):
    return f"pair {index}" if golden_format == "npz" else f"test_data_set {index}"


def _check_dtype(array, spec, role, where):
    dtype = DTYPES.get(spec["dtype"])
    if dtype is None:
        raise GoldenError(
            f"Golden pairs for {spec['dtype']} tensors ({spec['name']!r}) are not supported."
        )
    if array.dtype != dtype:
        raise GoldenError(
            f"The golden {role} {spec['name']!r} ({where}) holds {array.dtype} values, but the "
            f"model's {spec['name']!r} is {spec['dtype']} ({np.dtype(dtype)}): save it as "
            f"{np.dtype(dtype)}."
        )


def _check_input(array, spec, entry, where):
    _check_dtype(array, spec, "input", where)
    if entry is not None and not _fits_contract(array.shape, entry):
        raise GoldenError(
            f"The golden input {spec['name']!r} ({where}) has shape {list(array.shape)}, but the "
            f"contract of {spec['name']!r} takes {_describe(entry)}. In an .npz, axis 0 counts "
            "pairs: one pair of a batch-1 input is saved as x[None], shape [1, 1, ...]."
        )


def _check_output(array, spec, where):
    _check_dtype(array, spec, "output", where)
    declared = spec.get("shape")
    if declared is None:
        return
    fits = len(array.shape) == len(declared) and all(
        not _is_fixed(want) or got == want for got, want in zip(array.shape, declared, strict=True)
    )
    if not fits:
        shown = ", ".join(str(dim) for dim in declared)
        raise GoldenError(
            f"The golden output {spec['name']!r} ({where}) has shape {list(array.shape)}, but the "
            f"model's {spec['name']!r} is [{shown}]."
        )


def _is_fixed(dim):
    return isinstance(dim, int) and not isinstance(dim, bool) and dim > 0


def _fits_contract(shape, entry):
    """Tell whether one feed's full shape, batch axis included, is one the contract allows."""
    dims = entry.get("shape")
    if dims is None:
        return True
    if len(shape) != len(dims):
        return False
    for axis, (got, want) in enumerate(zip(shape, dims, strict=True)):
        if want == BATCH and axis == 0:
            allowed = _within(got, entry["batch"]) if entry.get("batch") else True
        elif isinstance(want, str):
            allowed = _within(got, entry["dynamic"].get(str(axis)))
        else:
            allowed = got == want
        if not allowed:
            return False
    return True


def _within(size, allowed):
    if not allowed:
        return True
    if "sizes" in allowed:
        return size in allowed["sizes"]
    return allowed["min"] <= size <= allowed["max"]


def _describe(entry):
    parts = []
    for axis, dim in enumerate(entry.get("shape") or []):
        if dim == BATCH and axis == 0:
            batch = entry.get("batch") or {}
            parts.append(
                f"batch {'|'.join(map(str, batch['sizes']))}"
                if "sizes" in batch
                else f"batch {batch.get('min')}..{batch.get('max')}"
            )
        elif isinstance(dim, str):
            bounds = entry["dynamic"].get(str(axis)) or {}
            parts.append(f"{bounds.get('min')}..{bounds.get('max')}")
        else:
            parts.append(str(dim))
    return f"[{', '.join(parts)}]"
