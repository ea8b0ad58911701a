"""Make the arrays fed to a model, from its signature and its input-shape contract.

Every worker path that runs a model builds its feeds here: synthetic feeds for
benchmarks, sweeps, side-by-side runs, export checks and smoke tests; batches of
dataset samples for evaluation, golden checks and INT8 calibration.

What a model takes is its `model_io` (the claim answer's key, docs/protocol.md):
    {"inputs": [{"name": "image", "dtype": "float", "shape": ["N", 3, 32, 32]}],
     "outputs": [...], "contract": {"inputs": {"image": {...}}} or None}
(the contract's format is at the top of deployhub/registry/contract.py). Without
one, a loaded session's own inputs (`session.get_inputs()`) or the ONNX file's
graph inputs say what they can: each input's dtype and shape, a symbolic axis 0
read as a batch axis of any size.

Batches: an input's allowed batch sizes are the contract's ("sizes", or a
min..max range), or the size the model fixes. An input without a batch axis (a
scalar, or a contract entry whose "batch" is null) is fed whole. Dynamic
non-batch axes take the contract's "opt" size.

Datasets (.npz) keep one sample per row: the array `inputs` for a one-input
model, or one array per model input named after it, all with the same number
of rows. Label arrays are optional: `labels` and every `label_*` array (which
tasks read which: workers/tasks). Most have a row per sample; the per-object
ones (label_boxes, label_classes, label_keypoints) have a row per labelled
object and `label_sample` gives each one's sample. A model with an input without
a batch axis is fed one row per run (its other inputs get that row as their batch).
"""

from dataclasses import dataclass

import numpy as np

from workers.errors import JobError

# Numpy dtypes by the names ONNX gives them (TensorProto names in lower case) and numpy's.
DTYPES = {
    "float": np.float32,
    "float32": np.float32,
    "float16": np.float16,
    "double": np.float64,
    "float64": np.float64,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "bool": np.bool_,
}
# A batch axis nothing constrains takes any size.
ANY_BATCH = range(1, 2**31)
# Random integers stay small and non-negative, so they are valid indices, ids and flags.
INTEGER_HIGH = 2
# Label arrays with a row per labelled object, not per sample: label_sample says whose.
OBJECT_LABELS = ("label_boxes", "label_classes", "label_keypoints", "label_sample")


@dataclass(frozen=True)
class InputSpec:
    """One model input as it is fed: its dtype, its shape without the batch, its batch sizes.

    shape holds every axis but the batch (all of them when there is no batch axis),
    an int where the size is known and None where a dataset may choose it;
    allowed is None without a batch axis, else a list or range of batch sizes.
    """

    name: str
    dtype: np.dtype
    shape: tuple
    allowed: object
    dynamic: dict
    guessed: bool = False  # the batch axis was read from the shape alone (no contract)
    fixed_by_model: bool = False  # the model's own shape fixes the batch size
    symbols: tuple = ()  # the name of each axis of shape that has one ("H"), for messages

    @property
    def batched(self):
        """Return True when axis 0 is a batch axis."""
        return self.allowed is not None

    def feed_shape(self, batch, unsized=None):
        """Return the full shape fed at this batch: unknown axes at the contract's opt, or
        at unsized where the contract gives none (None: refuse)."""
        sizes = tuple(
            self.dynamic.get(axis, unsized if size is None else size)
            for axis, size in enumerate(self.shape)
        )
        if None in sizes:
            raise JobError(self._unsized(sizes.index(None)))
        return (batch, *sizes) if self.batched else sizes

    def _unsized(self, axis):
        """Return why an axis has no size to feed: symbolic, and no range in the contract."""
        position = axis + 1 if self.batched else axis
        symbol = self.symbols[axis] if axis < len(self.symbols) else None
        what = (
            f"a symbolic dimension {symbol!r}" if isinstance(symbol, str) else "a dynamic dimension"
        )
        return (
            f"input {self.name!r} has {what} at position {position} "
            "and the version's input-shape contract gives it no range; only the batch "
            "dimension (position 0) may be symbolic without one: set the contract, or export "
            "the model with fixed height, width and sequence length"
        )


def model_io_of(model_io_or_metas):
    """Return a model_io dict from a model_io dict or a session's input metas."""
    if isinstance(model_io_or_metas, dict):
        return model_io_or_metas
    return {"inputs": [_meta_input(meta) for meta in model_io_or_metas], "contract": None}


def model_io_from_onnx(path):
    """Return the model_io an ONNX file declares (its inputs minus weights; no contract)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {tensor.name for tensor in graph.initializer}
    return {
        "inputs": [_graph_value(value) for value in graph.input if value.name not in weights],
        "outputs": [_graph_value(value) for value in graph.output],
        "contract": None,
    }


class Specs(tuple):
    """The InputSpecs of a model, resolved: input_specs returns them as they are."""


def input_specs(model_io_or_metas):
    """Return an InputSpec per model input, in order (a model_io, metas, or Specs)."""
    if isinstance(model_io_or_metas, Specs):
        return model_io_or_metas
    model_io = model_io_of(model_io_or_metas)
    inputs = model_io.get("inputs") or []
    entries = ((model_io.get("contract") or {}).get("inputs")) or {}
    return Specs(_spec(spec, entries.get(spec["name"]), _batch_axis(inputs)) for spec in inputs)


def batch_sizes(model_io, input_name):
    """Return the batch sizes an input allows (a list or range); None without a batch axis."""
    for spec in input_specs(model_io):
        if spec.name == input_name:
            return spec.allowed
    raise JobError(f"the model has no input named {input_name!r}")


def common_batches(specs):
    """Return the batch sizes every batched input allows (a list or range)."""
    allowed = [spec.allowed for spec in specs if spec.batched]
    lists = [set(sizes) for sizes in allowed if not isinstance(sizes, range)]
    ranges = [sizes for sizes in allowed if isinstance(sizes, range)]
    if lists:
        return [size for size in sorted(set.intersection(*lists)) if all(size in r for r in ranges)]
    return range(
        max((r.start for r in ranges), default=1), min((r.stop for r in ranges), default=2)
    )


def default_batch(model_io_or_metas):
    """Return the batch to feed when none is asked: 1 when allowed, else the smallest allowed."""
    specs = input_specs(model_io_or_metas)
    allowed = common_batches(specs)
    if not len(allowed):
        raise JobError(f"no batch size suits every input: {_describe_batches(specs)}")
    return 1 if 1 in allowed else min(allowed)


def check_batch(model_io_or_metas, batch, asked="batch_size is {batch}", to="change it"):
    """Raise JobError, saying which input refuses it, when a batch size is not allowed.

    asked is how the message opens ({batch} filled in); to, what a symbolic batch
    dimension would let the user do.
    """
    specs = input_specs(model_io_or_metas)
    if batch != 1 and not any(spec.batched for spec in specs):
        raise JobError(
            f"{asked.format(batch=batch)} but no input of the model has a batch axis: "
            "it is fed one whole input at a time (batch 1)"
        )
    for spec in specs:
        if spec.batched and batch not in spec.allowed:
            raise JobError(f"{asked.format(batch=batch)} but {_why_not(spec, to)}")


def synthetic_feeds(model_io_or_metas, batch=None, seed=0, unsized=None):
    """Return random feeds {input name: array} of each input's dtype at a batch size.

    batch None takes default_batch; a batch an input does not allow raises JobError.
    A symbolic axis the contract gives no range takes unsized (None: JobError).
    """
    specs = input_specs(model_io_or_metas)
    batch = default_batch(specs) if batch is None else batch
    check_batch(specs, batch)
    rng = np.random.default_rng(seed)
    return {
        spec.name: random_array(rng, spec.dtype, spec.feed_shape(batch, unsized)) for spec in specs
    }


def random_array(rng, dtype, shape):
    """Return a random array of a dtype: normal floats, small integers, fair booleans."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype == np.uint8:
        return rng.integers(0, 256, shape, dtype=np.uint8)
    if dtype.kind in "iu":
        return rng.integers(0, INTEGER_HIGH, shape, dtype=dtype)
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def load_dataset(path, model_io_or_metas, max_samples=None, what="dataset"):
    """Return ({input name: samples, one per row}, {label array name: array} or None).

    A one-input model reads the array `inputs` (or one named after its input); a
    model with several inputs reads one array per input. Rows past max_samples are
    left out, of the labels too (per-object rows whose label_sample is past them);
    every input array is checked against its input and cast to its dtype. Without a
    label array (`labels`, `label_*`), the labels are None.
    """
    specs = input_specs(model_io_or_metas)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = _dataset_arrays(data, specs, what)
            labels = _label_arrays(data)
    except JobError:
        raise
    except (OSError, ValueError, EOFError) as error:
        raise JobError(f"the {what} dataset is not a readable .npz: {error}") from error
    count = _row_count(arrays, what)
    if max_samples is not None:
        count = min(count, max_samples)
    arrays = {spec.name: cast(arrays[spec.name][:count], spec, what) for spec in specs}
    for spec in fitted(specs, arrays):
        check_samples(spec, arrays[spec.name], what)
    return arrays, _labels_of_rows(labels, count, what)


def _label_arrays(data):
    """Return an open npz's label arrays ({name: array}), None when it has none."""
    names = [name for name in data.files if name == "labels" or name.startswith("label_")]
    return {name: data[name] for name in names} or None


def _labels_of_rows(labels, count, what):
    """Return the labels of the first count samples: per-sample arrays cut to count rows,
    per-object arrays to the objects whose label_sample is below count."""
    if labels is None:
        return None
    objects = [name for name in OBJECT_LABELS if name in labels]
    if not objects:
        return {name: array[:count] for name, array in labels.items()}
    kept = _kept_objects(labels, objects, count, what)
    return {
        name: array[kept] if name in objects else array[:count] for name, array in labels.items()
    }


def _kept_objects(labels, objects, count, what):
    """Return which per-object label rows belong to the first count samples; refuse
    per-object arrays without label_sample, or of other lengths than it."""
    sample = labels.get("label_sample")
    if sample is None or sample.ndim != 1 or sample.dtype.kind not in "iu":
        raise JobError(
            f"the {what} dataset has {', '.join(objects)} but no 1-D integer 'label_sample' "
            "saying which sample each row belongs to"
        )
    lengths = {name: len(labels[name]) for name in objects}
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"{name!r}: {length}" for name, length in lengths.items())
        raise JobError(
            f"the {what} dataset's per-object label arrays disagree on rows: {described}"
        )
    return sample < count


def cast(array, spec, what="dataset"):
    """Return samples in an input's dtype; refuse fractions for an integer or bool input."""
    return cast_to(array, spec.name, spec.dtype, what)


def cast_to(array, name, dtype, what="dataset"):
    """Return an array in a dtype; refuse fractions for an integer or bool input `name`."""
    array = np.asarray(array)
    if dtype.kind in "biu" and array.dtype.kind not in "biu":
        raise JobError(
            f"the {what} array for {name!r} holds {array.dtype} values; the input takes "
            f"{dtype}: store whole numbers"
        )
    return np.ascontiguousarray(array, dtype=dtype)


def check_samples(spec, samples, what="dataset"):
    """Raise JobError unless every row of samples fits the input (sample shape, fixed axes)."""
    expected = spec.shape
    fits = samples.ndim == len(expected) + 1 and all(
        size is None or size == got for size, got in zip(expected, samples.shape[1:], strict=False)
    )
    if not fits:
        takes = [("any" if size is None else size) for size in expected]
        sample = "one sample" if spec.batched else "the whole input"
        raise JobError(
            f"the {what} samples are {list(samples.shape)} for input {spec.name!r}; each row "
            f"must be {sample}, of shape {takes} (the rows stacked: N x {takes})"
        )


def rows_per_run(model_io_or_metas, batch=None):
    """Return (dataset rows per run, batch fed) for feeding a dataset at a batch size."""
    specs = input_specs(model_io_or_metas)
    batch = default_batch(specs) if batch is None else batch
    check_batch(specs, batch)
    whole = not any(spec.batched for spec in specs) or not all(spec.batched for spec in specs)
    return (1 if whole else batch), batch


def dataset_batches(dataset_arrays, model_io_or_metas, batch=None):
    """Yield (feeds, number of real samples in them) over a dataset's rows, in order.

    Rows go batch by batch; a last, shorter batch is fed as it is when the model
    allows its size, else padded by repeating its samples. A model with an input
    without a batch axis takes one row per run (its batched inputs that row,
    repeated to the batch when 1 is not allowed).
    """
    specs = fitted(input_specs(model_io_or_metas), dataset_arrays)
    rows, batch = rows_per_run(specs, batch)
    count = _row_count(dataset_arrays, "dataset")
    allowed = common_batches(specs)
    for start in range(0, count, rows):
        real = min(rows, count - start)
        size = batch if rows == 1 or real not in allowed else real
        picked = start + np.arange(size) % real if size != real else None  # rows in order
        yield (
            {
                spec.name: _rows(dataset_arrays[spec.name], start, real, picked, spec)
                for spec in specs
            },
            real,
        )


def fitted(specs, dataset_arrays):
    """Return specs as a dataset reads them: an input whose axis 0 was only guessed to be a
    batch (a fixed size, no contract) has none when each row is the whole input."""
    return Specs(
        _without_batch(spec)
        if spec.guessed and np.ndim(dataset_arrays.get(spec.name)) == len(spec.shape) + 2
        else spec
        for spec in specs
    )


def _without_batch(spec):
    """Return an InputSpec whose guessed batch axis is an ordinary fixed axis."""
    return InputSpec(spec.name, spec.dtype, (spec.allowed[0], *spec.shape), None, spec.dynamic)


def per_sample(output, batch, real):
    """Return one run's output as a list of each real sample's output.

    An output whose axis 0 has the batch's size holds one row per sample (padding
    dropped); any other output belongs to the run as a whole.
    """
    output = np.asarray(output)
    if output.ndim and output.shape[0] == batch:
        return list(output[:real])
    return [output]


def batch_of(feeds, model_io_or_metas):
    """Return the batch size feeds are at (1 for a model without a batch axis)."""
    for spec in input_specs(model_io_or_metas):
        if spec.batched and spec.name in feeds:
            return int(np.shape(feeds[spec.name])[0])
    return 1


def cast_feeds(feeds, model_io_or_metas, what="golden"):
    """Return feeds (whole tensors, batch included) cast to each input's dtype."""
    wanted = dtypes(model_io_or_metas)
    return {
        name: cast_to(array, name, wanted[name], what) if name in wanted else array
        for name, array in feeds.items()
    }


def dtypes(model_io_or_metas):
    """Return {input name: numpy dtype}, shapes left unread."""
    if isinstance(model_io_or_metas, Specs):
        return {spec.name: spec.dtype for spec in model_io_or_metas}
    inputs = model_io_of(model_io_or_metas).get("inputs") or []
    return {spec["name"]: _dtype(spec) for spec in inputs}


def _rows(array, start, real, picked, spec):
    """Return the rows fed to one input: a batch of rows, or one row whole."""
    if not spec.batched:
        return np.asarray(array[start])
    if picked is None:
        return array[start : start + real]
    return array[picked]


def _row_count(arrays, what):
    """Return the number of rows every array has; refuse arrays that disagree, or none."""
    counts = {name: len(array) if np.ndim(array) else 0 for name, array in arrays.items()}
    if len(set(counts.values())) > 1:
        described = ", ".join(f"{name!r}: {count}" for name, count in counts.items())
        raise JobError(f"the {what} arrays disagree on the number of samples: {described}")
    count = next(iter(counts.values()), 0)
    if count == 0:
        raise JobError(f"the {what} dataset has no samples")
    return count


def _dataset_arrays(data, specs, what):
    """Return {input name: array} from an open npz, in either layout."""
    names = [spec.name for spec in specs]
    if all(name in data.files for name in names):
        return {name: data[name] for name in names}
    if len(names) == 1 and "inputs" in data.files:
        return {names[0]: data["inputs"]}
    if len(names) == 1:
        raise JobError(
            f"the {what} dataset is not an .npz with 'inputs' (or {names[0]!r}); "
            f"it holds: {', '.join(data.files) or 'nothing'}"
        )
    missing = [name for name in names if name not in data.files]
    raise JobError(
        f"the model has the inputs {', '.join(map(repr, names))}: the {what} dataset needs "
        f"one array per input, named after it (no array for {missing[0]!r}; it holds: "
        f"{', '.join(data.files) or 'nothing'})"
    )


def _meta_input(meta):
    """Return a session's input meta (name, type "tensor(float)", shape) as a model_io input."""
    if isinstance(meta, dict):
        return meta
    kind = str(meta.type)
    dtype = kind[len("tensor(") : -1] if kind.startswith("tensor(") else kind
    shape = None if meta.shape is None else list(meta.shape)
    return {"name": meta.name, "dtype": dtype, "shape": shape, "type": kind}


def _graph_value(value):
    """Return an ONNX graph input or output as a model_io entry."""
    from onnx import TensorProto

    tensor = value.type.tensor_type
    dims = [_graph_dim(dim) for dim in tensor.shape.dim]
    return {
        "name": value.name,
        "dtype": TensorProto.DataType.Name(tensor.elem_type).lower(),
        "shape": dims if tensor.HasField("shape") else None,
    }


def _graph_dim(dim):
    """Return an ONNX dim as its size, its name, or None (dynamic, unnamed).

    A negative size is how several exporters write a dynamic axis (-1): None, as
    ONNX Runtime's get_inputs() reports it.
    """
    if dim.HasField("dim_value"):
        return dim.dim_value if dim.dim_value >= 0 else None
    return dim.dim_param or None


def _batch_axis(inputs):
    """Return what axis 0 must be for an input without a contract entry to be read as a
    batch axis: symbolic (None) when some input's is, else the first input's fixed size."""
    shapes = [spec.get("shape") for spec in inputs if spec.get("shape")]
    if not shapes or any(_is_symbolic(shape[0]) for shape in shapes):
        return None
    return shapes[0][0]


def _spec(spec, entry, batch_axis):
    """Return the InputSpec of one model_io input and its contract entry (or None).

    Without an entry, axis 0 is a batch axis when it is symbolic, or, in a model
    whose every axis 0 is fixed, when it has the first input's size.
    """
    name, shape = spec["name"], spec.get("shape")
    dtype = _dtype(spec)
    if isinstance(entry, dict) and isinstance(entry.get("shape"), list):
        return _contract_spec(name, dtype, shape, entry)
    if shape is None:
        raise JobError(
            f"input {name!r} declares no shape and the version has no input-shape contract "
            "for it: set the contract"
        )
    batched = bool(shape) and (_is_symbolic(shape[0]) or shape[0] == batch_axis)
    allowed = (ANY_BATCH if _is_symbolic(shape[0]) else [shape[0]]) if batched else None
    guessed = batched and not _is_symbolic(shape[0])
    rest = shape[1:] if batched else shape
    sizes = tuple(dim if _is_fixed(dim) else None for dim in rest)
    return InputSpec(name, dtype, sizes, allowed, {}, guessed, guessed, tuple(rest))


def _contract_spec(name, dtype, shape, entry):
    """Return the InputSpec of an input from its contract entry (shape, batch, dynamic)."""
    written, batch = entry["shape"], entry.get("batch")
    batched = bool(written) and batch is not None
    axes = written[1:] if batched else written
    offset = 1 if batched else 0
    model = (shape[offset:] if batched else shape) if shape else [None] * len(axes)
    sizes, dynamic = [], {}
    for index, (dim, model_dim) in enumerate(zip(axes, model, strict=False)):
        if _is_fixed(model_dim) or _is_fixed(dim):
            sizes.append(model_dim if _is_fixed(model_dim) else dim)
            continue
        bounds = (entry.get("dynamic") or {}).get(str(index + offset)) or {}
        sizes.append(None)
        if _is_fixed(bounds.get("opt")):
            dynamic[index] = bounds["opt"]
    model_batch = shape[0] if shape and batched else None
    allowed = _allowed(batch, model_batch) if batched else None
    fixed = _is_fixed(model_batch)
    return InputSpec(name, dtype, tuple(sizes), allowed, dynamic, False, fixed, tuple(axes))


def _allowed(batch, model_dim):
    """Return the batch sizes a contract's batch entry allows (the model's fixed size wins)."""
    if _is_fixed(model_dim):
        return [model_dim]
    if isinstance(batch, dict) and batch.get("sizes"):
        return sorted(batch["sizes"])
    if isinstance(batch, dict) and all(_is_fixed(batch.get(key)) for key in ("min", "max")):
        return range(batch["min"], batch["max"] + 1)
    return ANY_BATCH


def _dtype(spec):
    """Return the numpy dtype of a model_io input, or raise JobError naming it."""
    dtype = DTYPES.get(str(spec.get("dtype")))
    if dtype is None:
        kind = spec.get("type") or spec.get("dtype")
        supported = ", ".join(sorted(set(DTYPES) - {"float32", "float64"}))
        raise JobError(f"input {spec['name']!r} has type {kind}; supported: {supported}")
    return np.dtype(dtype)


def _describe_batches(specs):
    """Return each batched input's allowed sizes, for a message."""
    return "; ".join(
        f"{spec.name!r}: {_sizes_text(spec.allowed)}" for spec in specs if spec.batched
    )


def _sizes_text(allowed):
    """Return allowed batch sizes as text: "2, 4" or "1..8"."""
    if isinstance(allowed, range):
        return f"{allowed.start}..{allowed.stop - 1}"
    return ", ".join(map(str, allowed))


def _why_not(spec, to):
    """Return why an input refuses a batch size."""
    if isinstance(spec.allowed, list) and spec.fixed_by_model:
        return (
            f"the model's batch dimension is fixed at {spec.allowed[0]}; "
            f"export it with a symbolic batch dimension to {to}"
        )
    return (
        f"the input-shape contract of {spec.name!r} allows batch sizes {_sizes_text(spec.allowed)}"
    )


def _is_symbolic(dim):
    return not _is_fixed(dim)


def _is_fixed(dim):
    return isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0
