"""Attach golden input/output pairs to a version, checked against its signature and contract.

The file is read by workers/golden.py, the code a worker runs to check an
engine, and then held to the version: every input given, with the model's
dtype and a shape its input-shape contract allows; the expected outputs with
the model's dtype and declared shape. It is stored as uploaded, or not at all.

Default tolerances (np.isclose: |actual - expected| <= atol + rtol * |expected|):
rtol 1e-3 is the relative tolerance of ONNX's own backend test runner; atol 1e-4
is the floor for elements near zero, where relative error means nothing. FP32
engines of the same graph differ from the source by about 1e-6 of the values
summed (another summation order, FMA, Conv+BatchNorm folded), so a correct FP32
engine passes with a wide margin, while a changed weight or bias moves outputs
by far more. FP16 and INT8 engines need a golden set with looser tolerances.
"""

import math
import shutil
from pathlib import Path

import numpy as np
from django.db import transaction

from deployhub.registry.archives import ZIP_MAGIC, check_filename, safe_extract_zip
from deployhub.registry.contract import BATCH
from deployhub.registry.inspect import InvalidModel
from deployhub.registry.models import GoldenFormat, GoldenSet, golden_upload_path
from deployhub.registry.uploads import head, placed, ratio_cap, received, workspace
from deployhub.teams.models import Event
from workers import golden as worker_golden
from workers.golden import DEFAULT_ATOL, DEFAULT_RTOL, GoldenFileError, read_golden

MAX_PAIRS = 10_000
FORMATS = {".npz": GoldenFormat.NPZ, ".zip": GoldenFormat.ONNX_PB}
ACCEPTED = (
    "upload an .npz of arrays named by the model's inputs and outputs, each with a leading "
    "pair axis, or a .zip of ONNX test data (test_data_set_N/input_K.pb, output_K.pb)"
)
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


def create_golden_set(version, uploaded_file, user, *, name, atol=None, rtol=None):
    """Check a golden file against the version and store it, or store nothing and raise."""
    filename = check_filename(Path(uploaded_file.name or "").name or "")
    golden_format = _format_of(filename)
    name, atol, rtol = _checked_fields(version, name, atol, rtol)
    with received(uploaded_file) as (path, sha256, size), workspace() as work:
        if not head(path, 4).startswith(ZIP_MAGIC):
            raise GoldenError(
                f"This file is not a zip archive (.npz files are zips too): {ACCEPTED}."
            )
        if existing := version.golden_sets.filter(sha256=sha256).first():
            raise GoldenError(
                f"This file is already the golden set {existing.name!r} of {version}."
            )
        pairs = load_golden(path, golden_format, version, work)
        golden = GoldenSet(
            model_version=version,
            name=name,
            original_filename=filename,
            sha256=sha256,
            size=size,
            format=golden_format,
            pairs=len(pairs),
            input_names=[spec["name"] for spec in version.inputs],
            output_names=[spec["name"] for spec in version.outputs if spec["name"] in pairs[0][1]],
            atol=atol,
            rtol=rtol,
            created_by=user,
        )
        return _save(golden, path)


def _format_of(filename):
    suffix = Path(filename).suffix.lower()
    if suffix not in FORMATS:
        raise GoldenError(
            f"DeployHub does not take {suffix or 'extension-less'} golden files: {ACCEPTED}."
        )
    return FORMATS[suffix]


def _checked_fields(version, name, atol, rtol):
    """Return (name, atol, rtol) checked, the defaults filled in."""
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise GoldenError("A golden set needs a name of 1 to 100 characters.")
    if version.golden_sets.filter(name=name).exists():
        raise GoldenError(f"{version} already has a golden set named {name!r}.")
    return name, _tolerance("atol", atol, DEFAULT_ATOL), _tolerance("rtol", rtol, DEFAULT_RTOL)


def _tolerance(what, value, default):
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise GoldenError(f"{what} must be a number of 0 or more, not {value!r}.")
    return number


def _save(golden, path):
    """Place the file and save the row in one go; on any failure, neither stays."""
    golden.file.name = golden_upload_path(golden, "")
    with placed(path, golden.file.name), transaction.atomic():
        golden.save()
        Event.record(
            golden.team,
            golden.created_by,
            "golden.created",
            golden,
            version=golden.model_version_id,
            sha256=golden.sha256,
            pairs=golden.pairs,
            after="stored",
        )
    return golden


def load_golden(path, golden_format, version, work):
    """Read a golden file with the worker's code and hold every pair to the version."""
    if not version.inputs or not version.outputs:
        raise GoldenError(f"{version} declares no inputs or outputs to check pairs against.")
    input_names = [spec["name"] for spec in version.inputs]
    output_names = [spec["name"] for spec in version.outputs]
    try:
        _unpack(path, work / "golden")
        pairs = read_golden(path, input_names, output_names, golden_format)
    except (GoldenFileError, InvalidModel) as exc:
        raise GoldenError(str(exc)) from exc
    if len(pairs) > MAX_PAIRS:
        raise GoldenError(f"The file holds {len(pairs):,} pairs; the limit is {MAX_PAIRS:,}.")
    for index, (feeds, expected) in enumerate(pairs):
        where = _where(golden_format, index)
        for spec in version.inputs:
            entry = (version.contract.get("inputs") or {}).get(spec["name"])
            _check_input(feeds[spec["name"]], spec, entry, where)
        for spec in version.outputs:
            if spec["name"] in expected:
                _check_output(expected[spec["name"]], spec, where)
    return pairs


def _unpack(path, folder):
    """Unpack the file under the caps before the worker's code reads it, then drop the copy.

    Unsafe member names, links, encryption, too many members or bytes, and a compression
    ratio over the cap (a zip bomb) are refused, the ratio as the bytes come out.
    """
    safe_extract_zip(
        path,
        folder,
        max_total_bytes=worker_golden.MAX_BYTES,
        cap=ratio_cap(),
        max_members=worker_golden.MAX_MEMBERS,
    )
    shutil.rmtree(folder)


def _where(golden_format, index):
    return f"pair {index}" if golden_format == GoldenFormat.NPZ else f"test_data_set {index}"


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
