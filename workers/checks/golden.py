"""Golden input/output pairs: does an engine reproduce outputs its team vouches for?

A golden set belongs to a model version: inputs, and the outputs the model must
give for them. The hub reads a golden file with this module to validate an
upload, and a worker reads it with the same code to check an engine. Two formats:

- `.npz` (loaded with allow_pickle=False): one array per model input and per
  checked output, named as in the model, each with a leading pair axis. Pair p
  feeds `array[p]` for every input (the whole tensor the model takes, batch axis
  included) and expects `array[p]` of every output in the file. One pair is saved
  with a pair axis of length 1: `np.savez(path, image=x[None], logits=y[None])`.
- `.zip` in the ONNX test-data layout: `test_data_set_N/input_K.pb` and
  `test_data_set_N/output_K.pb` (optionally inside one top-level folder), each a
  serialised TensorProto. A tensor is named by its `name` field or, when that is
  empty, by K: the K-th input or output of the model. Each set is one pair, in
  the order of N.

Every input must be given; outputs may be a subset (at least one). An output
reproduces when every element of every pair satisfies np.isclose(actual,
expected, atol, rtol): |actual - expected| <= atol + rtol * |expected|.
"""

import re
import zipfile
import zlib
from pathlib import Path

import numpy as np

from workers.checks.evaluate import reference_runner
from workers.errors import Cancelled, JobError
from workers.measure import feeds as model_feeds

# Tolerances when the job names none (the hub sends its golden set's own).
DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
# The arrays of one golden file, decompressed, and its zip members.
MAX_BYTES = 256 * 1024**2
MAX_MEMBERS = 2000
EPSILON = 1e-12
PB_MEMBER = re.compile(
    r"(?:(?P<root>[^/]+)/)?test_data_set_(?P<set>\d+)/(?P<role>input|output)_(?P<index>\d+)\.pb"
)
# The two formats, by file extension.
FORMATS = {".npz": "npz", ".zip": "onnx-pb"}
NPZ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)
LAYOUT = (
    "a golden set is an .npz of arrays named by the model's inputs and outputs, with a "
    "leading pair axis, or a .zip of ONNX test data (test_data_set_N/input_K.pb, output_K.pb)"
)


class GoldenFileError(JobError):
    """The golden file cannot be read as golden pairs; the message says why."""


def read_golden(path, input_names, output_names, golden_format=None, max_bytes=None):
    """Return the golden pairs of a file as [(feeds, expected outputs)], each {name: array}.

    input_names and output_names are the model's, in order. golden_format is "npz"
    or "onnx-pb"; by default the file's extension (.npz or .zip) says which.
    """
    max_bytes = max_bytes or MAX_BYTES
    golden_format = golden_format or FORMATS.get(Path(path).suffix.lower())
    if golden_format not in FORMATS.values():
        raise GoldenFileError(f"This is neither an .npz nor a .zip: {LAYOUT}.")
    with _open_zip(path) as archive:
        _check_sizes(archive.infolist(), max_bytes)
    if golden_format == "npz":
        return _npz_pairs(path, input_names, output_names, max_bytes)
    return _pb_pairs(path, input_names, output_names)


def _open_zip(path):
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise GoldenFileError(f"This is not a readable zip archive ({exc}): {LAYOUT}.") from exc


def _check_sizes(infos, max_bytes):
    """Refuse, before reading anything, an archive with too many members or too many bytes."""
    if len(infos) > MAX_MEMBERS:
        raise GoldenFileError(
            f"The golden file holds {len(infos):,} members; the limit is {MAX_MEMBERS:,}."
        )
    declared = sum(info.file_size for info in infos)
    if declared > max_bytes:
        raise GoldenFileError(
            f"The golden file expands to {declared:,} bytes; the limit is {max_bytes:,}."
        )


# .npz -------------------------------------------------------------------------


def _npz_pairs(path, input_names, output_names, max_bytes):
    try:
        npz = np.load(path, allow_pickle=False)
    except NPZ_ERRORS as exc:
        raise GoldenFileError(f"This is not a valid .npz file: {exc}") from exc
    with npz:
        _check_names(npz.files, input_names, output_names, "The .npz")
        arrays = _read_arrays(npz, max_bytes)
    count = _pair_count(arrays)
    return [
        (
            {name: arrays[name][p] for name in input_names},
            {name: arrays[name][p] for name in output_names if name in arrays},
        )
        for p in range(count)
    ]


def _read_arrays(npz, max_bytes):
    """Read every array after its header: no objects, no more than max_bytes in all."""
    total = 0
    for name in npz.files:
        shape, dtype = _guarded(name, npy_header, npz, name)
        if dtype.hasobject:
            raise GoldenFileError(
                f"The golden array {name!r} holds Python objects (dtype=object); "
                "save plain numeric arrays."
            )
        total += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if total > max_bytes:
            raise GoldenFileError(
                f"The golden arrays are more than {max_bytes:,} bytes once decompressed."
            )
    arrays = {name: _guarded(name, npz.__getitem__, name) for name in npz.files}
    for name, array in arrays.items():
        check_array("array", name, array)
    return arrays


def npy_header(npz, name):
    """Return (shape, dtype) of an array in an open npz from its header, reading no data."""
    member = f"{name}.npy" if f"{name}.npy" in npz.zip.namelist() else name
    with npz.zip.open(member) as fp:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
    return shape, dtype


def _guarded(name, read, *args):
    try:
        return read(*args)
    except NPZ_ERRORS as exc:
        raise GoldenFileError(f"The golden array {name!r} could not be read: {exc}") from exc


def _pair_count(arrays):
    """Return the length of the pair axis that every array shares."""
    lengths = {name: array.shape[0] for name, array in arrays.items() if array.ndim}
    scalars = [name for name, array in arrays.items() if not array.ndim]
    if scalars:
        raise GoldenFileError(
            f"The golden array {scalars[0]!r} is a scalar; every array has a leading pair axis."
        )
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"{name!r}: {n}" for name, n in lengths.items())
        raise GoldenFileError(
            f"The golden arrays disagree on the number of pairs (axis 0): {described}."
        )
    count = next(iter(lengths.values()))
    if count == 0:
        raise GoldenFileError("The golden arrays hold no pairs: axis 0 has length 0.")
    return count


def _check_names(names, input_names, output_names, what):
    """Refuse unknown names, a missing input, or no output to check."""
    unknown = [name for name in names if name not in input_names and name not in output_names]
    if unknown:
        raise GoldenFileError(
            f"{what} holds {unknown[0]!r}, which is neither an input nor an output of the "
            f"model (inputs: {_listed(input_names)}; outputs: {_listed(output_names)})."
        )
    missing = [name for name in input_names if name not in names]
    if missing:
        raise GoldenFileError(
            f"{what} has no array for the model input {missing[0]!r}: every input must be given."
        )
    if not any(name in names for name in output_names):
        raise GoldenFileError(
            f"{what} holds no expected output: give at least one of {_listed(output_names)}."
        )


def _listed(names):
    return ", ".join(repr(name) for name in names) or "none"


def check_array(role, name, array):
    """Refuse an array that is not plain numbers, or holds NaN or infinities."""
    if array.dtype.kind not in "biuf":
        raise GoldenFileError(
            f"The golden {role} {name!r} holds {array.dtype} values; golden pairs are numbers."
        )
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise GoldenFileError(f"The golden {role} {name!r} holds NaN or infinite values.")


# ONNX test data (.zip of TensorProto .pb files) ----------------------------------


def _pb_pairs(path, input_names, output_names):
    with _open_zip(path) as archive:
        sets = _pb_sets(archive)
        pairs = [
            _pb_pair(archive, number, sets[number], input_names, output_names)
            for number in sorted(sets)
        ]
    checked = list(pairs[0][1])
    for number, (_, expected) in zip(sorted(sets), pairs, strict=True):
        if sorted(expected) != sorted(checked):
            raise GoldenFileError(
                f"test_data_set_{number} checks the outputs {_listed(sorted(expected))}, the "
                f"first set {_listed(sorted(checked))}: every set checks the same outputs."
            )
    return pairs


def _pb_sets(archive):
    """Return {N: {"input": {K: member}, "output": {K: member}}} of test_data_set_N folders."""
    sets, roots = {}, set()
    for info in archive.infolist():
        if info.is_dir() or _is_junk(info.filename):
            continue
        match = PB_MEMBER.fullmatch(info.filename)
        if match is None:
            raise GoldenFileError(
                f"The zip holds {info.filename!r}, which is not test data: a golden zip holds "
                "only test_data_set_N/input_K.pb and test_data_set_N/output_K.pb."
            )
        roots.add(match["root"])
        folders = sets.setdefault(int(match["set"]), {"input": {}, "output": {}})
        folders[match["role"]][int(match["index"])] = info
    if len(roots) > 1:
        raise GoldenFileError("The zip's test_data_set_N folders must sit side by side.")
    if not sets:
        raise GoldenFileError(f"The zip holds no test_data_set_N folder: {LAYOUT}.")
    return sets


def _is_junk(name):
    # macOS archives carry __MACOSX/, ._name resource forks and .DS_Store files.
    parts = name.split("/")
    return "__MACOSX" in parts or parts[-1].startswith(("._", ".DS_Store"))


def _pb_pair(archive, number, folders, input_names, output_names):
    where = f"test_data_set_{number}"
    feeds = _pb_tensors(archive, folders["input"], input_names, where, "input")
    expected = _pb_tensors(archive, folders["output"], output_names, where, "output")
    _check_names([*feeds, *expected], input_names, output_names, where)
    misplaced = [name for name in feeds if name not in input_names] + [
        name for name in expected if name not in output_names
    ]
    if misplaced:
        raise GoldenFileError(f"{where} names {misplaced[0]!r} in the wrong role.")
    return {name: feeds[name] for name in input_names}, expected


def _pb_tensors(archive, members, names, where, role):
    tensors = {}
    for index in sorted(members):
        name, array = _pb_tensor(archive, members[index], names, index, role)
        if name in tensors:
            raise GoldenFileError(f"{where} gives the {role} {name!r} twice.")
        tensors[name] = array
    return tensors


def _pb_tensor(archive, info, names, index, role):
    """Parse one TensorProto member; return (its name, or the model's K-th name; its array)."""
    import onnx
    from google.protobuf.message import DecodeError
    from onnx import numpy_helper

    try:
        data = archive.read(info)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as exc:
        raise GoldenFileError(f"{info.filename!r} could not be read: {exc}") from exc
    tensor = onnx.TensorProto()
    try:
        tensor.ParseFromString(data)
    except (DecodeError, RuntimeWarning) as exc:
        raise GoldenFileError(f"{info.filename!r} is not a TensorProto: {exc}") from exc
    if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.external_data:
        raise GoldenFileError(
            f"{info.filename!r} keeps its data in another file; save the tensor with its data."
        )
    name = tensor.name or (names[index] if index < len(names) else None)
    if name is None:
        raise GoldenFileError(
            f"{info.filename!r} has no name, and the model has only {len(names)} {role}s "
            "to name it by position."
        )
    try:
        array = numpy_helper.to_array(tensor)
    except Exception as exc:  # onnx raises several unrelated types on bad tensors
        raise GoldenFileError(f"{info.filename!r} could not be read as a tensor: {exc}") from exc
    check_array(role, name, array)
    return name, array


# Comparison -----------------------------------------------------------------------


def evaluate_golden(
    run_engine, model_path, golden_path, params, progress=None, should_stop=None, model_io=None
):
    """Check an engine, then its FP32 source, on a golden file; return the golden result.

    params (the evaluate job's `golden`): set, input_names and output_names (the
    model's, in order), atol, rtol. The source's verdict tells a wrong engine from
    golden pairs the source itself no longer gives. Each pair's inputs are fed in
    the dtypes model_io (the job's) or, without it, the source's inputs give.
    """
    input_names, output_names = params.get("input_names"), params.get("output_names")
    if not input_names or not output_names:
        raise JobError("a golden check needs the model's input_names and output_names")
    atol = float(params.get("atol", DEFAULT_ATOL))
    rtol = float(params.get("rtol", DEFAULT_RTOL))
    metas, run_reference = reference_runner(model_path)
    pairs = [
        (model_feeds.cast_feeds(feeds, model_io or metas), expected)
        for feeds, expected in read_golden(golden_path, input_names, output_names)
    ]
    result = check_golden(run_engine, pairs, output_names, atol, rtol, progress, should_stop)
    reference = check_golden(run_reference, pairs, output_names, atol, rtol, None, should_stop)
    result["reference"] = {"passed": reference["passed"], "failing": reference["failing"]}
    return {"set": params.get("set"), **result}


def summary(result):
    """Say in one line how a golden check went."""
    head = (
        f"golden pairs: {result['pairs']} pairs, atol {result['atol']:g}, rtol {result['rtol']:g}"
    )
    if result["passed"]:
        return f"{head}: every checked output reproduced"
    failures = ", ".join(
        f"{o['name']!r} ({o['mismatched']} of {o['elements']} elements off, "
        f"max abs error {o['max_abs_error']:.3g}, worst pair {o['worst_pair']})"
        for o in result["outputs"]
        if not o["passed"]
    )
    source = (
        "reproduces them" if result["reference"]["passed"] else "does not reproduce them either"
    )
    return f"{head}: not reproduced: {failures}; the FP32 source {source}"


def check_golden(run, pairs, output_names, atol, rtol, progress=None, should_stop=None):
    """Run run(feeds) -> outputs (in output_names order) on every pair; judge each output.

    Returns {"pairs", "atol", "rtol", "passed", "failing": [names], "outputs": [reports]}.
    """
    checked = list(pairs[0][1])
    actual = {name: [] for name in checked}
    for index, (feeds, expected) in enumerate(pairs):
        if should_stop and should_stop():
            raise Cancelled()
        outputs = dict(zip(output_names, run(feeds), strict=False))
        for name in checked:
            if name not in outputs or name not in expected:
                raise JobError(f"pair {index}: no output named {name!r} to compare")
            actual[name].append(outputs[name])
        if progress:
            progress((index + 1) / len(pairs), f"golden pair {index + 1} of {len(pairs)}")
    expected = {name: [pair[1][name] for pair in pairs] for name in checked}
    reports = [compare_output(name, actual[name], expected[name], atol, rtol) for name in checked]
    failing = [report["name"] for report in reports if not report["passed"]]
    return {
        "pairs": len(pairs),
        "atol": atol,
        "rtol": rtol,
        "passed": not failing,
        "failing": failing,
        "outputs": reports,
    }


def compare_output(name, actual, expected, atol, rtol):
    """Compare one output over every pair with np.isclose(atol, rtol) semantics.

    worst_pair is the pair where an element overshoots its tolerance the most
    (|actual - expected| - (atol + rtol * |expected|)); a wrong shape or a
    non-finite value overshoots infinitely.
    """
    elements = mismatched = nonfinite = 0
    max_abs = max_rel = 0.0
    worst_pair, worst_excess, shape_error = None, -np.inf, None
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        elements += want.size
        if got.shape != want.shape:
            mismatched += want.size
            shape_error = shape_error or (
                f"pair {index}: the engine gave shape {list(got.shape)}, "
                f"the golden output has {list(want.shape)}"
            )
            excess = np.inf
        else:
            close = np.isclose(got, want, atol=atol, rtol=rtol)
            finite = np.isfinite(got)
            mismatched += int(close.size - close.sum())
            nonfinite += int(finite.size - finite.sum())
            error = np.abs(got - want)
            if finite.any():
                max_abs = max(max_abs, float(error[finite].max()))
                relative = error[finite] / np.maximum(np.abs(want[finite]), EPSILON)
                max_rel = max(max_rel, float(relative.max()))
            excess = np.inf if not finite.all() else _excess(error, want, atol, rtol)
        if excess > worst_excess:
            worst_pair, worst_excess = index, excess
    return {
        "name": name,
        "passed": mismatched == 0,
        "elements": elements,
        "mismatched": mismatched,
        "mismatched_fraction": mismatched / elements if elements else 0.0,
        "max_abs_error": max_abs,
        "max_rel_error": max_rel,
        "nonfinite": nonfinite,
        "worst_pair": worst_pair,
        "shape_error": shape_error,
    }


def _excess(error, want, atol, rtol):
    if not error.size:
        return -np.inf
    return float((error - (atol + rtol * np.abs(want))).max())
