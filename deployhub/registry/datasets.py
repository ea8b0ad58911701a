"""Turn an uploaded calibration or validation dataset into checked arrays.

Two upload forms: an `.npz` of already-preprocessed tensors, loaded without
unpickling; or a zip of images plus their labels, run through the model
version's own preprocessing code (single-input models). An `.npz` holds one
array per model input, named after it (`np.savez(f, image=..., mask=...)`), or
for a single-input model the array `inputs`; each has one sample per row and
the same number of rows. Labels are those of the version's task, optional, and
needed for validation: a classifier's `labels` (one class index per sample) or
labels.csv here; boxes, masks and strings in dataset_labels.py (which, and the
arrays' checks) and label_formats.py (their files in an image zip). Either way
the result is `{"inputs": {input name: ndarray}, "labels": class indices | None,
"task": the labels' task or "", "targets": {stored label array: ndarray},
"notes": [...]}`, checked against the model's signature and input-shape
contract before it is stored.
"""

import csv
import hashlib
import math
import shutil
import tempfile
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image

from deployhub.registry import dataset_labels, label_formats
from deployhub.registry.archives import (
    Unpacking,
    UnsafeArchive,
    check_members,
    open_zip,
    safe_extract_zip,
)
from deployhub.registry.inspect import InvalidModel
from workers.checks.preprocessing import compile_preprocess

MAX_PIXELS = 50_000_000
STORED = "dataset.npz"  # the checked samples, in the work folder, for the web process to store
# A validation set can hold many thousands of images (archives.py defaults to 2,000 members).
MAX_MEMBERS = 100_000
MAX_ARRAY_BYTES = 2 * 1024**3
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
FLOAT_TYPES = {"float", "double", "float16", "bfloat16"}
INT_TYPES = {
    name: getattr(np, name)
    for name in ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64")
}
NPY_MAGIC = b"\x93NUMPY"
# What np.load and zipfile raise on a file that is not a well-formed .npz.
NPZ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)


class DatasetError(ValueError):
    """The uploaded dataset cannot be used; the message says why."""


def read_dataset(path, workdir, params, *, cap):
    """Load an uploaded dataset, hold it to the version, and store it as the workers read it.

    Runs in the capped child process (registry/validate.py), which hands the web process
    only this small description; the samples are written to workdir/STORED. params: the
    upload's filename, require_labels, the version's inputs, contract, preprocessing and
    task (the name of the task whose labels it takes; classification when absent);
    max_bytes caps an image zip's expansion.
    """
    source, arrays = _load_dataset(path, params, workdir, cap)
    check_against_contract(arrays["inputs"], params["inputs"], params["contract"])
    sha256, size = _write_npz(arrays, workdir / STORED)
    facts = {**describe(arrays), **describe_labels(arrays)}
    return {"source": source, "sha256": sha256, "size": size, **facts}


def _load_dataset(path, params, workdir, cap):
    names = [spec["name"] for spec in params["inputs"]]
    filename, require_labels = params["filename"].lower(), params["require_labels"]
    task = params.get("task") or "classification"
    if filename.endswith(".npz"):
        arrays = load_npz(
            path, names, require_labels=require_labels, cap=cap, workdir=workdir, task=task
        )
        return "npz", arrays
    if not filename.endswith(".zip"):
        raise DatasetError("A dataset is an .npz file or a .zip of images with their labels.")
    if len(names) != 1:
        per_input = ", ".join(f"{name}=..." for name in names)
        raise DatasetError(
            f"An image archive feeds one input, and this model takes {len(names)}: "
            f"upload an .npz with one array per input: np.savez(f, {per_input})."
        )
    if not params["preprocessing"]:
        raise DatasetError("An image dataset needs a preprocessing spec on the version.")
    arrays = load_image_zip(
        path,
        params["preprocessing"],
        workdir=workdir,
        max_bytes=params["max_bytes"],
        cap=cap,
        require_labels=require_labels,
        input_name=names[0],
        task=task,
    )
    return "images", arrays


def _write_npz(arrays, path):
    """Store the samples as the workers read them: `inputs` for one input, else one per name.

    The labels go beside them under their task's array names (`labels`, `label_boxes`, ...).
    Return the file's sha256 and size.
    """
    inputs = arrays["inputs"]
    payload = {"inputs": next(iter(inputs.values()))} if len(inputs) == 1 else dict(inputs)
    payload.update(arrays["targets"])
    np.savez(path, **payload)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest(), path.stat().st_size


def load_npz(
    path,
    input_names=("inputs",),
    *,
    require_labels,
    cap,
    workdir=None,
    max_array_bytes=MAX_ARRAY_BYTES,
    task="classification",
):
    """Load the samples of each model input, and the task's labels, from an .npz.

    The labels are the arrays of dataset_labels.ARRAYS for the task's kind; arrays for
    another task's labels are refused. Raise DatasetError.
    """
    # All arrays together: at most one full-size array per input, and the labels.
    limit = MAX_ARRAY_BYTES * (len(input_names) + 1)
    with open_npz(path, workdir, cap=cap, max_total_bytes=limit) as npz, _label_errors():
        keys = _input_keys(npz.files, list(input_names))
        found = dataset_labels.kinds_in_npz(npz.files)
        read = dataset_labels.labels_task(found, task, require_labels=require_labels) or task
        inputs = {name: read_array(npz, key, max_array_bytes) for name, key in keys.items()}
        names = dataset_labels.ARRAYS.get(dataset_labels.label_kind(read), ())
        targets = {
            name: read_array(npz, name, max_array_bytes) for name in names if name in npz.files
        }
        return _checked(inputs, targets.pop("labels", None), require_labels, read, targets)


@contextmanager
def _label_errors():
    """Report dataset_labels' refusals as this module's."""
    try:
        yield
    except dataset_labels.LabelError as exc:
        raise DatasetError(str(exc)) from exc


def _input_keys(files, names):
    """Return {input name: array name}: `inputs` or the name for one input, else each name."""
    held = ", ".join(files) or "nothing"
    if len(names) == 1:
        key = "inputs" if "inputs" in files or names[0] not in files else names[0]
        if key not in files:
            raise DatasetError(
                f"The .npz has no 'inputs' array (it holds: {held}); save the samples with "
                "np.savez(f, inputs=..., labels=...)."
            )
        return {names[0]: key}
    for name in names:
        if name not in files:
            per_input = ", ".join(f"{n}=..." for n in names)
            raise DatasetError(
                f"The dataset has no array for input {name!r} (it holds: {held}); "
                f"save one per input: np.savez(f, {per_input})."
            )
    return {name: name for name in names}


class NpzArchive:
    """An .npz read under the archive caps, never through np.load's own unzipping.

    Each array's header is read first (its dtype and size, without decompressing the
    data); an array that passes is unpacked to disk by archives.Unpacking, counted
    against the size and compression-ratio caps, and loaded from there without pickles.
    """

    def __init__(self, archive, infos, unpacking, folder):
        self.archive, self.unpacking, self.folder = archive, unpacking, folder
        self.members = {_array_key(i.filename): i for i in infos if not i.is_dir()}
        self.files = list(self.members)

    def header(self, key):
        """Return (shape, dtype) from an array's header, reading no data."""
        with self.archive.open(self.members[key]) as fp:
            version = np.lib.format.read_magic(fp)
            read = np.lib.format.read_array_header_1_0
            if version != (1, 0):
                read = np.lib.format.read_array_header_2_0
            shape, _, dtype = read(fp)
        return shape, dtype

    def __getitem__(self, key):
        info = self.members[key]
        self.unpacking.extract(info, self.folder)
        path = self.folder.joinpath(*PurePosixPath(info.filename).parts)
        try:
            return np.load(path, allow_pickle=False)
        finally:
            path.unlink()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.archive.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _array_key(name):
    return name.removesuffix(".npy")


def open_npz(path, workdir=None, *, cap, max_total_bytes):
    """Open an .npz for reading under the caps (see NpzArchive); raise DatasetError."""
    path = Path(path)
    if _head(path).startswith(NPY_MAGIC):
        raise DatasetError(
            "This is a single .npy array, not an .npz archive; "
            "save one with np.savez(path, inputs=..., labels=...)."
        )
    try:
        archive = open_zip(path)
    except InvalidModel as exc:
        raise DatasetError(f"This is not a valid .npz file: {exc}") from exc
    size = path.stat().st_size
    try:
        infos = check_members(
            archive.infolist(), max_total_bytes=max_total_bytes, cap=cap, archive_size=size
        )
    except InvalidModel as exc:
        archive.close()
        raise DatasetError(str(exc)) from exc
    unpacking = Unpacking(archive, size, max_total_bytes=max_total_bytes, cap=cap)
    folder = Path(tempfile.mkdtemp(prefix="npz-", dir=workdir))
    return NpzArchive(archive, infos, unpacking, folder)


def _head(path):
    try:
        with open(path, "rb") as handle:
            return handle.read(len(NPY_MAGIC))
    except OSError as exc:
        raise DatasetError(f"This is not a valid .npz file: {exc}") from exc


def read_array(npz, key, max_array_bytes):
    """Read one array of an open NpzArchive: its header first, then its data."""
    shape, dtype = _guarded(key, npz.header, key)
    if dtype.hasobject:
        raise DatasetError(
            f"The '{key}' array holds Python objects (dtype=object); save plain numeric arrays."
        )
    size = math.prod(shape) * dtype.itemsize
    if size > max_array_bytes:
        raise DatasetError(
            f"The '{key}' array is {size:,} bytes once decompressed; "
            f"the limit is {max_array_bytes:,}."
        )
    return _guarded(key, npz.__getitem__, key)


def _guarded(key, read, *args):
    try:
        return read(*args)
    except UnsafeArchive as exc:
        raise DatasetError(str(exc)) from exc
    except NPZ_ERRORS as exc:
        raise DatasetError(f"The '{key}' array could not be read: {exc}") from exc


def _checked(inputs, labels, require_labels, task="classification", targets=None, notes=()):
    """Check the samples and their labels: a classifier's `labels`, or another task's targets."""
    if not inputs:
        raise DatasetError("The model lists no inputs, so a dataset has nothing to feed.")
    for name, samples in inputs.items():
        _check_inputs(samples, name)
    count = _sample_count(inputs)
    checked = {"inputs": inputs, "labels": None, "task": "", "targets": {}, "notes": list(notes)}
    if targets:
        kind = dataset_labels.label_kind(task)
        targets = dataset_labels.check_targets(kind, targets, count)
        return {**checked, "task": task, "targets": targets}
    if labels is None:
        if require_labels and dataset_labels.label_kind(task) == "classes":
            raise DatasetError(
                "The dataset has no labels; a validation dataset needs one integer class "
                "label per sample."
            )
        return checked
    _check_labels(labels, count)
    labels = labels.astype(np.int64)
    return {**checked, "labels": labels, "task": task, "targets": {"labels": labels}}


def _check_inputs(samples, name):
    what = "The inputs" if name == "inputs" else f"The samples of {name!r}"
    if samples.dtype.kind not in "iufb":
        raise DatasetError(
            f"{what} hold {samples.dtype} values; save them as a float, integer or bool array."
        )
    if samples.ndim == 0 or len(samples) == 0:
        raise DatasetError(f"{what} hold no samples: axis 0 must count at least one.")
    if samples.dtype.kind == "f" and not np.isfinite(samples).all():
        raise DatasetError(f"{what} contain NaN or infinite values.")


def _sample_count(inputs):
    counts = {name: len(samples) for name, samples in inputs.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{name!r} {count}" for name, count in counts.items())
        raise DatasetError(f"Every input needs one row per sample; the rows differ: {listed}.")
    return next(iter(counts.values()))


def _check_labels(labels, count):
    if labels.dtype.kind not in "iu" or labels.ndim != 1:
        raise DatasetError(
            f"The labels must be a 1-D integer array of class indices; they are "
            f"{labels.dtype} with shape {labels.shape}."
        )
    if len(labels) != count:
        raise DatasetError(f"There are {len(labels)} labels for {count} samples.")
    if labels.min() < 0:
        raise DatasetError("The labels must be class indices (0 or more); some are negative.")


def load_image_zip(
    path,
    spec,
    *,
    require_labels,
    workdir,
    max_bytes,
    cap,
    input_name="inputs",
    max_pixels=MAX_PIXELS,
    max_array_bytes=MAX_ARRAY_BYTES,
    max_members=MAX_MEMBERS,
    task="classification",
):
    """Turn a zip of images plus their labels into the samples of input_name, preprocessed.

    A classifier's labels are labels.csv; other tasks' are read by label_formats and
    mapped into the model input's pixels with the spec's resize and crop.
    """
    preprocess = compile_preprocess(spec)
    limits = (max_pixels, max_array_bytes)
    scratch = Path(tempfile.mkdtemp(prefix="dataset-", dir=workdir))
    try:
        root = _extract(path, scratch / "files", max_bytes, max_members, cap)
        with _label_errors():
            found = label_formats.kinds_in_archive(root, _image_files(root))
            read = dataset_labels.labels_task(found, task, require_labels=require_labels)
            if read is None or dataset_labels.label_kind(read) == "classes":
                return _classified(
                    root, preprocess, require_labels, read or task, input_name, limits
                )
            return _task_labelled(root, spec, preprocess, require_labels, read, input_name, limits)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _classified(root, preprocess, require_labels, task, input_name, limits):
    """Read the images labels.csv lists (or all, unlabelled) with their class indices."""
    need = require_labels and dataset_labels.label_kind(task) == "classes"
    rows = _read_rows(root, need)
    inputs, _ = _tensors(root, [name for name, _ in rows], preprocess, *limits)
    return _checked({input_name: inputs}, _row_labels(rows), need, task)


def _task_labelled(root, spec, preprocess, require_labels, task, input_name, limits):
    """Read the images with another task's labels, mapped into the model input's pixels."""
    labels = label_formats.archive_labels(root, task, _image_names(root))
    inputs, sizes = _tensors(root, labels.names, preprocess, *limits)
    targets, notes = labels.targets(sizes, spec)
    return _checked({input_name: inputs}, None, require_labels, task, targets, notes)


def _extract(path, dest, max_bytes, max_members, cap):
    try:
        safe_extract_zip(path, dest, max_total_bytes=max_bytes, cap=cap, max_members=max_members)
    except InvalidModel as exc:
        raise DatasetError(str(exc)) from exc
    return _content_root(dest)


def _content_root(folder):
    # "Compress folder" tools wrap everything in one top-level folder: look inside it.
    entries = [p for p in folder.iterdir() if not _is_junk(p.name)]
    if len(entries) == 1 and entries[0].is_dir():
        return _content_root(entries[0])
    return folder


def _is_junk(name):
    # macOS archives carry __MACOSX/ and ._name resource forks, which are not images.
    return name.startswith(".") or name == "__MACOSX"


def _read_rows(root, require_labels):
    csv_path = root / "labels.csv"
    if not csv_path.is_file():
        if require_labels:
            raise DatasetError(
                "The archive has no labels.csv; a validation dataset needs one "
                "(header: filename,label)."
            )
        return [(name, None) for name in _image_names(root)]
    try:
        with csv_path.open(newline="", encoding="utf-8-sig") as f:
            return _parse_labels_csv(csv.reader(f), require_labels)
    except UnicodeDecodeError as exc:
        raise DatasetError("labels.csv is not UTF-8 text.") from exc
    except csv.Error as exc:
        raise DatasetError(f"labels.csv could not be parsed: {exc}") from exc


def _image_names(root):
    names = _image_files(root)
    if not names:
        raise DatasetError("The archive holds no images.")
    return names


def _image_files(root):
    """Return the archive's images, sorted; a top-level masks/ folder holds labels, not samples."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix.lower() in IMAGE_SUFFIXES
        and not any(_is_junk(part) for part in p.relative_to(root).parts)
        and p.relative_to(root).parts[0] != "masks"
    )


def _parse_labels_csv(reader, require_labels):
    header = [h.strip().lower() for h in next(reader, [])]
    if header not in (["filename", "label"], ["filename"]) or (
        require_labels and header != ["filename", "label"]
    ):
        raise DatasetError(f"labels.csv must start with the header filename,label; not {header}.")
    rows = [_parse_row(row, reader.line_num, require_labels) for row in reader if row]
    if not rows:
        raise DatasetError("labels.csv lists no images.")
    unlabelled = [name for name, label in rows if label is None]
    if unlabelled and len(unlabelled) < len(rows):
        raise DatasetError(f"labels.csv: {unlabelled[0]!r} has no label; label every row or none.")
    return rows


def _parse_row(row, line, require_labels):
    name = row[0].strip()
    text = row[1].strip() if len(row) > 1 else ""
    if not name:
        raise DatasetError(f"labels.csv line {line}: the filename is empty.")
    if not text:
        if require_labels:
            raise DatasetError(f"labels.csv line {line}: {name!r} has no label.")
        return name, None
    if not (text.isascii() and text.isdigit()):
        raise DatasetError(
            f"labels.csv line {line}: the label {text!r} is not a class index (0, 1, 2...)."
        )
    return name, int(text)


def _row_labels(rows):
    if rows[0][1] is None:
        return None
    return np.array([label for _, label in rows], dtype=np.int64)


def _tensors(root, names, preprocess, max_pixels, max_array_bytes):
    """Return the preprocessed images, stacked, and each image's (width, height) as stored."""
    tensors, sizes = [], []
    for name in names:
        tensor, size = _tensor(root, name, preprocess, max_pixels)
        tensors.append(tensor)
        sizes.append(size)
        if tensors[0].nbytes * len(names) > max_array_bytes:
            raise DatasetError(
                f"{len(names)} images of {tensors[0].nbytes:,} bytes each exceed the "
                f"{max_array_bytes:,} byte limit for a dataset."
            )
    return np.stack(tensors), sizes


def _tensor(root, name, preprocess, max_pixels):
    with open_image(_member_path(root, name), name, max_pixels) as image:
        try:
            return preprocess(image), image.size
        except ValueError as exc:
            raise DatasetError(f"{name!r}: {exc}") from exc


def _member_path(root, name):
    path = (root / name.replace("\\", "/")).resolve()
    if not path.is_relative_to(root.resolve()):
        raise DatasetError(f"labels.csv names {name!r}, which is outside the archive.")
    if not path.is_file():
        raise DatasetError(f"labels.csv names {name!r}, which is not in the archive.")
    return path


def open_image(path, name, max_pixels):
    """Open and decode an image, its pixel count checked on the header first."""
    try:
        image = Image.open(path)
        _check_pixels(image, name, max_pixels)
        image.load()
    except Image.DecompressionBombError as exc:
        raise DatasetError(f"{name!r} is too large to decode safely: {exc}") from exc
    except DatasetError:
        raise
    except Exception as exc:  # Pillow's decoders raise many unrelated types
        raise DatasetError(f"{name!r} could not be read as an image: {exc}") from exc
    return image


def _check_pixels(image, name, max_pixels):
    # Checked on the header, before decoding: a tiny file can declare gigapixels.
    if image.width * image.height > max_pixels:
        image.close()
        raise DatasetError(
            f"{name!r} declares {image.width}x{image.height} pixels, over the "
            f"{max_pixels:,} pixel limit; it is refused as a possible decompression bomb."
        )


def check_against_contract(inputs, model_inputs, contract):
    """Refuse samples that miss a model input or do not fit its dtype and (validated) contract.

    inputs maps each model input's name to its samples, one per row: without a batch
    axis of their own, or the whole input for an input that has no batch axis.
    """
    entries = (contract or {}).get("inputs") or {}
    several = len(model_inputs) > 1
    for spec in model_inputs:
        name = spec["name"]
        samples = inputs.get(name)
        if samples is None:
            per_input = ", ".join(f"{s['name']}=..." for s in model_inputs)
            raise DatasetError(
                f"The dataset has no array for input {name!r}; "
                f"save one per input: np.savez(f, {per_input})."
            )
        if name in entries:
            _check_shape(samples, name, entries[name], several)
        _check_dtype(samples, name, spec["dtype"])


def _check_shape(samples, name, entry, several):
    if not _fits(samples.shape[1:], entry):
        whose = f"The dataset's {name!r} samples" if several else "The dataset's samples"
        raise DatasetError(
            f"{whose} have shape {samples.shape[1:]} but the contract of "
            f"{name!r} expects {_expected(entry)}."
        )


def _sample_axes(entry):
    """Return (axis, dim) for each axis of one sample: all of them when there is no batch axis."""
    shape = entry["shape"] or []
    if entry["batch"] is None:
        return list(enumerate(shape))
    return list(enumerate(shape[1:], start=1))


def _fits(sample_shape, entry):
    axes = _sample_axes(entry)
    if len(sample_shape) != len(axes):
        return False
    for got, (axis, want) in zip(sample_shape, axes, strict=True):
        if isinstance(want, str):
            bounds = entry["dynamic"][str(axis)]
            if not bounds["min"] <= got <= bounds["max"]:
                return False
        elif got != want:
            return False
    return True


def _expected(entry):
    parts = []
    for axis, dim in _sample_axes(entry):
        if isinstance(dim, str):
            bounds = entry["dynamic"][str(axis)]
            parts.append(f"{bounds['min']}..{bounds['max']}")
        else:
            parts.append(str(dim))
    return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"


def _check_dtype(samples, name, dtype):
    kind = samples.dtype.kind
    if dtype in FLOAT_TYPES or dtype.startswith("float8"):
        if kind not in "fiu":
            raise DatasetError(
                f"The dataset holds {samples.dtype} values but {name!r} takes {dtype}: "
                "store float tensors (or integer pixels)."
            )
    elif dtype in INT_TYPES:
        info = np.iinfo(INT_TYPES[dtype])
        if kind not in "iu" or samples.min() < info.min or samples.max() > info.max:
            raise DatasetError(
                f"The dataset holds {samples.dtype} values but {name!r} takes {dtype}: "
                f"store whole numbers from {info.min} to {info.max}."
            )
    elif dtype == "bool":
        if kind != "b" and not (kind in "iu" and np.isin(samples, (0, 1)).all()):
            raise DatasetError(
                f"The dataset holds {samples.dtype} values but {name!r} takes bool: "
                "store a bool array, or integers that are 0 or 1."
            )
    else:
        raise DatasetError(f"Datasets for inputs of type {dtype} ({name!r}) are not supported.")


def describe(arrays):
    """Summarise loaded dataset arrays for display and storage.

    One input: its sample shape and dtype. Several: input_shape lists {"name", "shape",
    "dtype"} for each input, in the model's order, and input_dtype is empty. classes:
    the distinct classes the labels hold (None without labels, or for strings).
    """
    inputs, targets = arrays["inputs"], arrays["targets"]
    [first, *others] = inputs.values()
    if others:
        shape = [
            {"name": name, "shape": list(a.shape[1:]), "dtype": str(a.dtype)}
            for name, a in inputs.items()
        ]
        dtype = ""
    else:
        shape, dtype = list(first.shape[1:]), str(first.dtype)
    return {
        "samples": len(first),
        "input_shape": shape,
        "input_dtype": dtype,
        "labels": bool(targets),
        "classes": dataset_labels.class_count(targets),
    }


def describe_labels(arrays):
    """Return the labels' task ("" without labels) and a line on what they hold."""
    count = len(next(iter(arrays["inputs"].values())))
    summary = dataset_labels.summarise(arrays["targets"], count, arrays["notes"])
    return {"task": arrays["task"], "label_summary": summary}
