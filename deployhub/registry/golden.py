"""Attach golden input/output pairs to a version, checked against its signature and contract.

The file is read in the capped child process (golden_pairs.py) by
workers/checks/golden.py, the code a worker runs to check an engine, and held to the
version there: every input given, with the model's dtype and a shape its
input-shape contract allows; the expected outputs with the model's dtype and
declared shape. It is stored as uploaded, or not at all.

Default tolerances (np.isclose: |actual - expected| <= atol + rtol * |expected|):
rtol 1e-3 is the relative tolerance of ONNX's own backend test runner; atol 1e-4
is the floor for elements near zero, where relative error means nothing. FP32
engines of the same graph differ from the source by about 1e-6 of the values
summed (another summation order, FMA, Conv+BatchNorm folded), so a correct FP32
engine passes with a wide margin, while a changed weight or bias moves outputs
by far more. FP16 and INT8 engines need a golden set with looser tolerances.
"""

import math
from pathlib import Path

from deployhub.core.store import placed, workspace
from deployhub.registry.archives import ZIP_MAGIC, check_filename
from deployhub.registry.golden_pairs import GoldenError
from deployhub.registry.models import GoldenFormat, GoldenSet, golden_upload_path
from deployhub.registry.uploads import head, read_in_child, received
from deployhub.teams.models import Event
from workers.checks import golden as worker_golden
from workers.checks.golden import DEFAULT_ATOL, DEFAULT_RTOL

FORMATS = {".npz": GoldenFormat.NPZ, ".zip": GoldenFormat.ONNX_PB}
ACCEPTED = (
    "upload an .npz of arrays named by the model's inputs and outputs, each with a leading "
    "pair axis, or a .zip of ONNX test data (test_data_set_N/input_K.pb, output_K.pb)"
)


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
        facts = read_pairs(path, golden_format, version, work)
        golden = GoldenSet(
            model_version=version,
            name=name,
            original_filename=filename,
            sha256=sha256,
            size=size,
            format=golden_format,
            pairs=facts["pairs"],
            input_names=[spec["name"] for spec in version.inputs],
            output_names=facts["outputs"],
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
    with placed(path, golden.file.name):
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


def read_pairs(path, golden_format, version, work):
    """Read the golden file in the capped child process; return its pairs and checked outputs."""
    if not version.inputs or not version.outputs:
        raise GoldenError(f"{version} declares no inputs or outputs to check pairs against.")
    params = {
        "format": golden_format,
        "inputs": version.inputs,
        "outputs": version.outputs,
        "contract": version.contract,
        "max_bytes": worker_golden.MAX_BYTES,
        "max_members": worker_golden.MAX_MEMBERS,
    }
    return read_in_child("golden", path, work, params, refusal=GoldenError)
