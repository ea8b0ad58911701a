"""The input-shape contract: which shapes a model version will be built and fed with.

Input shapes are the contract between a model and its runtimes: compilers build
for exact shapes (or explicit min/opt/max profiles), so every input names its
fixed dims, its allowed batch sizes and a range for each remaining dynamic axis.

A model input, as `inspect.inspect_onnx` reports it:
    {"name": "image", "dtype": "float", "shape": ["N", 3, 32, 32]}
(ints are fixed dims, strings symbolic, None unknown; the shape itself may be None.)

A contract:
    {"inputs": {"image": {"shape": ["batch", 3, 32, 32],
                          "batch": {"sizes": [1, 8, 16]},
                          "dynamic": {}}}}
"batch" is {"sizes": [...]} or {"min", "opt", "max"}; "dynamic" maps the index
(a string) of every other symbolic axis to {"min", "opt", "max"}.
"""

import math

BATCH = "batch"
RANGE_KEYS = ("min", "opt", "max")
HW_REASON = (
    "dynamic height/width cost speed unless the runtime gets explicit min/opt/max profiles; "
    "fix them at export and pad odd sizes"
)
TENSOR_CORE_REASON = "tensor cores work on multiples of 8"


class ContractError(ValueError):
    """The input-shape contract is invalid; the message says why."""


def batch_range_contract(name, sample_shape, low=1, opt=8, high=32):
    """Return a contract for one input of fixed sample_shape and a batch from low to high."""
    batch = {"min": low, "opt": opt, "max": high}
    return {"inputs": {name: {"shape": [BATCH, *sample_shape], "batch": batch, "dynamic": {}}}}


def default_contract(inputs):
    """Propose a contract for a model's inputs; symbolic non-batch axes still need ranges."""
    return {"inputs": {spec["name"]: _default_entry(spec["shape"]) for spec in inputs}}


def _default_entry(shape):
    if shape is None:
        return {"shape": None, "batch": {"sizes": [1]}, "dynamic": {}}
    if not shape:
        return {"shape": [], "batch": None, "dynamic": {}}
    batch = [shape[0]] if _is_fixed(shape[0]) else [1]
    contract_shape, dynamic = [BATCH], {}
    for axis, dim in enumerate(shape[1:], start=1):
        if _is_fixed(dim):
            contract_shape.append(dim)
        else:
            contract_shape.append(dim or f"axis{axis}")
            dynamic[str(axis)] = dict.fromkeys(RANGE_KEYS)  # to be filled in by the user
    return {"shape": contract_shape, "batch": {"sizes": batch}, "dynamic": dynamic}


def _is_fixed(dim):
    return isinstance(dim, int) and not isinstance(dim, bool) and dim > 0


def validate_contract(contract, inputs, *, max_elements=10**9):
    """Return a normalised copy of the contract for these model inputs, or raise ContractError."""
    if not isinstance(contract, dict) or set(contract) != {"inputs"}:
        raise ContractError('The contract must be a JSON object with one key, "inputs".')
    entries = contract["inputs"]
    if not isinstance(entries, dict):
        raise ContractError('The contract\'s "inputs" must map each input name to its contract.')
    _check_names(entries, [spec["name"] for spec in inputs])
    normalised = {}
    for spec in inputs:
        entry = _entry(entries[spec["name"]], spec)
        _check_size(spec["name"], entry, max_elements)
        normalised[spec["name"]] = entry
    return {"inputs": normalised}


def _check_names(entries, names):
    missing = [n for n in names if n not in entries]
    if missing:
        raise ContractError(f"The contract has no entry for the model input {missing[0]!r}.")
    extra = sorted(n for n in entries if n not in names)
    if extra:
        listed = ", ".join(repr(n) for n in names)
        raise ContractError(
            f"The contract names {extra[0]!r}, which is not an input of the model "
            f"(its inputs: {listed})."
        )


def _entry(entry, spec):
    name = spec["name"]
    if not isinstance(entry, dict):
        raise ContractError(f"The contract of {name!r} must be an object with shape and batch.")
    unknown = sorted(set(entry) - {"shape", "batch", "dynamic"})
    if unknown:
        raise ContractError(f"The contract of {name!r} has an unknown key {unknown[0]!r}.")
    shape = _shape(entry.get("shape"), spec)
    batch = _batch(entry.get("batch"), name, shape, spec["shape"])
    dynamic = _dynamic(entry.get("dynamic") or {}, name, shape)
    return {"shape": shape, "batch": batch, "dynamic": dynamic}


def _shape(shape, spec):
    name, model_shape = spec["name"], spec["shape"]
    if not isinstance(shape, list):
        raise ContractError(f"The contract of {name!r} needs its full shape, as a list.")
    if model_shape is not None and len(shape) != len(model_shape):
        raise ContractError(
            f"The model's {name!r} has {len(model_shape)} axes; "
            f"the contract's shape has {len(shape)}."
        )
    if shape and shape[0] != BATCH:
        raise ContractError(f'Axis 0 of {name!r} is the batch axis: write it as "{BATCH}".')
    for axis, dim in enumerate(shape[1:], start=1):
        _check_dim(name, axis, dim, model_shape[axis] if model_shape else None)
    return list(shape)


def _check_dim(name, axis, dim, model_dim):
    if not _is_fixed(dim) and not (isinstance(dim, str) and dim and dim != BATCH):
        raise ContractError(
            f"Axis {axis} of {name!r} must be a positive whole number or a symbolic name, "
            f"not {dim!r}."
        )
    if _is_fixed(model_dim) and dim != model_dim:
        raise ContractError(
            f"The model fixes axis {axis} of {name!r} to {model_dim}; the contract says {dim!r}."
        )


def _batch(batch, name, shape, model_shape):
    if not shape:
        if batch is not None:
            raise ContractError(f"{name!r} is a scalar: it has no batch axis.")
        return None
    if isinstance(batch, dict) and set(batch) == {"sizes"}:
        result = {"sizes": _sizes(batch["sizes"], name)}
    elif isinstance(batch, dict) and set(batch) == set(RANGE_KEYS):
        result = _range(batch, f"the batch of {name!r}")
    else:
        raise ContractError(
            f'The batch of {name!r} must be {{"sizes": [...]}} or {{"min", "opt", "max"}}.'
        )
    fixed = model_shape[0] if model_shape else None
    if _is_fixed(fixed) and _batch_sizes(result) != {fixed}:
        allowed = ", ".join(map(str, sorted(_batch_sizes(result))))
        raise ContractError(
            f"The model fixes axis 0 (batch) of {name!r} to {fixed}; the contract allows {allowed}."
        )
    return result


def _batch_sizes(batch):
    if "sizes" in batch:
        return set(batch["sizes"])
    return {batch["min"], batch["opt"], batch["max"]}


def _sizes(sizes, name):
    if not isinstance(sizes, list) or not sizes or not all(_is_fixed(s) for s in sizes):
        raise ContractError(
            f"The batch sizes of {name!r} must be a non-empty list of positive whole numbers, "
            f"not {sizes!r}."
        )
    return sorted(set(sizes))


def _range(value, what):
    if (
        not isinstance(value, dict)
        or set(value) != set(RANGE_KEYS)
        or all(v is None for v in value.values())
    ):
        raise ContractError(f"{_cap(what)} needs a range: min, opt and max.")
    if not all(_is_fixed(value[k]) for k in RANGE_KEYS):
        raise ContractError(f"The min, opt and max of {what} must be positive whole numbers.")
    if not value["min"] <= value["opt"] <= value["max"]:
        raise ContractError(
            f"The range of {what} needs min <= opt <= max; "
            f"it has {value['min']}, {value['opt']}, {value['max']}."
        )
    return {k: value[k] for k in RANGE_KEYS}


def _cap(text):
    return text[:1].upper() + text[1:]


def _dynamic(dynamic, name, shape):
    if not isinstance(dynamic, dict):
        raise ContractError(f"The dynamic axes of {name!r} must map axis numbers to ranges.")
    symbolic = {axis for axis, dim in enumerate(shape) if axis > 0 and isinstance(dim, str)}
    ranges = {}
    for key, value in dynamic.items():
        axis = _axis_number(key, name)
        if axis not in symbolic:
            raise ContractError(
                f"The contract gives a range for axis {key} of {name!r}, "
                f"which is not a dynamic axis of its shape."
            )
        ranges[axis] = value
    return {
        str(axis): _range(ranges.get(axis), f"dynamic axis {axis} ({shape[axis]!r}) of {name!r}")
        for axis in sorted(symbolic)
    }


def _axis_number(key, name):
    try:
        return int(key)
    except (TypeError, ValueError):
        raise ContractError(
            f"The dynamic axes of {name!r} are keyed by axis number, not {key!r}."
        ) from None


def _check_size(name, entry, max_elements):
    shape = _largest_shape(entry)
    elements = math.prod(shape)
    if elements > max_elements:
        raise ContractError(
            f"The largest shape of {name!r}, {shape}, has {elements:,} elements; "
            f"the limit is {max_elements:,}."
        )


def _largest_shape(entry):
    batch = entry["batch"]
    biggest = max(_batch_sizes(batch)) if batch else None
    return _fill(entry, biggest, "max")


def _fill(entry, batch, bound):
    shape = []
    for axis, dim in enumerate(entry["shape"]):
        if axis == 0:
            shape.append(batch)
        elif isinstance(dim, str):
            shape.append(entry["dynamic"][str(axis)][bound])
        else:
            shape.append(dim)
    return shape


def contract_warnings(contract, inputs, *, gpu):
    """List what in the contract will cost speed on the target, each with its reason."""
    # No size limit here: warnings are about speed; validity was checked at save time.
    contract = validate_contract(contract, inputs, max_elements=math.inf)
    warnings = []
    for name, entry in contract["inputs"].items():
        warnings += _hw_warnings(name, entry)
        if gpu and entry["batch"]:
            warnings += _tensor_core_warnings(name, entry["batch"])
    return warnings


def _hw_warnings(name, entry):
    shape = entry["shape"]
    if len(shape) != 4:
        return []
    axes = (1, 2) if _looks_nhwc(shape) else (2, 3)
    dynamic = [axis for axis in axes if isinstance(shape[axis], str)]
    if not dynamic:
        return []
    which = " and ".join(f"{axis} ({'height' if axis == axes[0] else 'width'})" for axis in dynamic)
    plural = "axes" if len(dynamic) > 1 else "axis"
    verb = "are" if len(dynamic) > 1 else "is"
    return [f"{plural.capitalize()} {which} of {name!r} {verb} dynamic: {HW_REASON}."]


def _looks_nhwc(shape):
    # Channels are few (1 gray, 3 RGB, 4 RGBA): a small fixed last axis and no
    # small fixed axis 1 means channels last.
    def small(dim):
        return _is_fixed(dim) and dim <= 4

    return small(shape[3]) and not small(shape[1])


def _tensor_core_warnings(name, batch):
    if "sizes" in batch:
        odd = [s for s in batch["sizes"] if s != 1 and s % 8]
        what = f"batch size{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))}"
    else:
        keys = [k for k in ("opt", "max") if batch[k] != 1 and batch[k] % 8]
        odd = [batch[k] for k in keys]
        what = "batch " + " and ".join(f"{k} {batch[k]}" for k in keys)
    if not odd:
        return []
    verb = "are not multiples" if len(odd) > 1 else "is not a multiple"
    return [f"The {what} of {name!r} {verb} of 8: {TENSOR_CORE_REASON}."]


def concrete_shapes(contract, batch=None):
    """Return the shape to feed each input: given (or first/opt) batch, dynamic axes at opt."""
    return {
        name: _fill(entry, _pick_batch(name, entry["batch"], batch), "opt")
        for name, entry in contract["inputs"].items()
    }


def _pick_batch(name, allowed, batch):
    if allowed is None:
        return None
    if batch is None:
        return allowed["sizes"][0] if "sizes" in allowed else allowed["opt"]
    if "sizes" in allowed and batch not in allowed["sizes"]:
        sizes = ", ".join(map(str, allowed["sizes"]))
        raise ContractError(f"Batch {batch} is not allowed for {name!r} (sizes: {sizes}).")
    if "min" in allowed and not allowed["min"] <= batch <= allowed["max"]:
        raise ContractError(
            f"Batch {batch} is outside {allowed['min']}..{allowed['max']} for {name!r}."
        )
    return batch
