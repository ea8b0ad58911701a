"""What a TensorRT build will do, decided without TensorRT: pure functions on plain data.

The builder in `tensorrt.py` turns these decisions into calls on the real
`tensorrt` module; everything that needs no GPU lives here so that it is
tested on any machine: which builder flags a config sets, which hardware
compatibility level, the optimisation profile a contract gives, how caches
are named, how a failed build is classified, how parser errors read.

Nothing here imports tensorrt, numpy or torch. Names of TensorRT enum members
are returned as strings ("FP16", "AMPERE_PLUS") and looked up on the module by
the builder, so a member a TensorRT release lacks fails there, by name.

The builder targets TensorRT 10.x: TensorRT 11 removed the precision flags
(FP16, BF16, INT8) and calibrators in favour of strongly typed networks.
"""

import json
import re
from collections import Counter

from workers.errors import JobError

PRECISIONS = ("fp32", "fp16", "bf16", "int8")
INT8_MODES = ("calibration", "qdq")
HARDWARE_LEVELS = ("none", "same_compute_capability", "ampere_plus")
DEFAULTS = {
    "precision": "fp16",
    "int8_mode": "calibration",
    "workspace_mb": 4096,
    "optimization_level": 3,
    "hardware_compatibility": "none",
    "version_compatible": False,
    "calibration_samples": 512,
}
# "contract" is the model version's input-shape contract; the hub adds it to the build config.
CONFIG_KEYS = (*DEFAULTS, "contract")
OPTIMIZATION_LEVELS = range(6)
_BOUNDS = ("min", "opt", "max")  # a contract range's keys, in profile order
# build_config["hardware_compatibility"] -> trt.HardwareCompatibilityLevel member (None: unset).
HARDWARE_MEMBERS = {
    "none": None,
    "ampere_plus": "AMPERE_PLUS",
    "same_compute_capability": "SAME_COMPUTE_CAPABILITY",
}
SUPPORTED_MAJOR = 10
CACHE_KINDS = ("timing", "calibration")
# Calibration batches: this many samples each, fewer when the dataset is smaller.
CALIBRATION_BATCH = 8
# TensorRT DataType member name -> torch dtype attribute, for the inference buffers.
TORCH_DTYPES = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT8": "int8",
    "UINT8": "uint8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
}
# Categories of a failed build, most specific first: the first that matches any message wins.
# The hub reads the category from the start of the job's error (deployhub/jobs/models.py).
CATEGORY_PATTERNS = (
    (
        "unsupported_operator",
        r"UNSUPPORTED_NODE|No importer registered for op|Plugin not found|"
        r"unsupported operator|operator \S+ is not supported",
    ),
    (
        "out_of_memory",
        r"Error Code 2: OutOfMemory|out of memory|MEM_ALLOC_FAILED|FAILED_ALLOCATION|"
        r"Requested amount of GPU memory|memory is insufficient|insufficient memory",
    ),
    (
        "runtime_missing",
        r"No module named '?tensorrt|libnvinfer|libcud\w*\.so|cannot open shared object|"
        r"CUDA initialization failure|no CUDA-capable device|CUDA driver version is insufficient|"
        r"initialization error|NVML could not",
    ),
    ("timeout", r"timed? ?out|timeout|time limit"),
    (
        "shape_or_contract",
        r"optimi[sz]ation profile|dimension|shape|broadcast|reshape|kMIN|kOPT|kMAX|"
        r"dynamic input|profile \d",
    ),
)
# How parser messages and build logs name the failing node, most informative first.
NODE_PATTERNS = (
    r"with name: (?P<name>\S+) and operator",
    r"While parsing node number (?P<index>\d+) \[(?P<op>[\w.]+) -> \"(?P<output>[^\"]*)\"\]",
    r"[Ii]n node (?P<index>\d+)",
    r"\bI[A-Z]\w*Layer (?P<name>[^\s:]+):",
    r"implementation for node (?P<name>\S+?)\.?(?:\s|\)|$)",
)


class TensorRTBuildError(JobError):
    """A TensorRT build failed; the message starts with its category, as the hub reads it."""

    def __init__(self, category, node, text):
        self.category, self.node = category, node
        super().__init__(f"{category}: {text}")


def resolved(build_config):
    """Return the build config with every default filled in (the contract left out)."""
    config = build_config or {}
    return {key: config[key] if config.get(key) is not None else DEFAULTS[key] for key in DEFAULTS}


def check_config(build_config):
    """Raise JobError when a TensorRT build config is not one this builder can build."""
    config = build_config or {}
    if not isinstance(config, dict):
        raise JobError("a tensorrt build config must be a JSON object")
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise JobError(
            f"tensorrt build config has unknown keys {unknown}; known: {list(CONFIG_KEYS)}"
        )
    settings = resolved(config)
    _check_choice(settings, "precision", PRECISIONS)
    _check_choice(settings, "int8_mode", INT8_MODES)
    _check_choice(settings, "hardware_compatibility", HARDWARE_LEVELS)
    if "int8_mode" in config and settings["precision"] != "int8":
        raise JobError(
            f"tensorrt int8_mode applies to precision int8 only; this build is "
            f"{settings['precision']}"
        )
    _check_whole(settings, "workspace_mb", minimum=1)
    _check_whole(settings, "calibration_samples", minimum=1)
    _check_whole(settings, "optimization_level", minimum=0)
    if settings["optimization_level"] not in OPTIMIZATION_LEVELS:
        raise JobError(
            f"tensorrt optimization_level {settings['optimization_level']} is not 0 to 5 "
            "(3 is TensorRT's default; higher builds longer for possibly faster engines)"
        )
    if not isinstance(settings["version_compatible"], bool):
        raise JobError("tensorrt version_compatible must be true or false")
    contract = config.get("contract")
    if contract is not None and not isinstance(contract, dict):
        raise JobError("the contract in a tensorrt build config must be a JSON object")


def builder_flags(build_config):
    """Return the trt.BuilderFlag member names to set for a build config, in order.

    - fp32: none. (TF32 is cleared instead: see cleared_flags.)
    - fp16: FP16. TensorRT may pick FP16 kernels where they are faster; the
      engine's inputs and outputs keep the model's types.
    - bf16: BF16, same rules with bfloat16 (Ampere and newer).
    - int8, calibration or qdq: INT8 and FP16. INT8 lets TensorRT run layers in
      int8, with scales from the calibrator (implicit quantisation) or from
      the model's Q/DQ nodes (explicit quantisation, which needs the flag on a
      weakly typed network too); FP16 gives the layers that have no int8
      kernel an fp16 fallback rather than fp32.
    - version_compatible: VERSION_COMPATIBLE, so later TensorRT 10.x runtimes
      load the engine (it embeds its lean runtime; loading allows host code).

    No precision constraint flags (OBEY/PREFER_PRECISION_CONSTRAINTS): they
    only act on layer precisions set by hand, and this builder sets none.
    """
    settings = resolved(build_config)
    flags = {
        "fp32": [],
        "fp16": ["FP16"],
        "bf16": ["BF16"],
        "int8": ["INT8", "FP16"],
    }[settings["precision"]]
    if settings["version_compatible"]:
        flags = [*flags, "VERSION_COMPATIBLE"]
    return flags


def cleared_flags(build_config):
    """Return the trt.BuilderFlag member names to clear: TF32 for an fp32 build.

    TensorRT enables TF32 by default, which rounds FP32 matrix inputs to 10
    mantissa bits on Ampere and newer. "fp32" is the accuracy reference, and
    should compute the same on every GPU, so it gets IEEE FP32.
    """
    return ["TF32"] if resolved(build_config)["precision"] == "fp32" else []


def hardware_level(build_config):
    """Return the trt.HardwareCompatibilityLevel member name to set, None to leave it unset."""
    return HARDWARE_MEMBERS[resolved(build_config)["hardware_compatibility"]]


def needs_calibration(build_config):
    """Return True when the build calibrates INT8 scales from a dataset."""
    settings = resolved(build_config)
    return settings["precision"] == "int8" and settings["int8_mode"] == "calibration"


def workspace_bytes(build_config):
    """Return the workspace memory pool limit in bytes."""
    return resolved(build_config)["workspace_mb"] * 2**20


def check_tensorrt_version(version):
    """Raise JobError unless the TensorRT version is one this builder is written for (10.x)."""
    major = str(version).split(".")[0]
    if major != str(SUPPORTED_MAJOR):
        raise JobError(
            f"runtime_missing: this worker's TensorRT builder is written for TensorRT "
            f"{SUPPORTED_MAJOR}.x; found {version}: pip install deployhub[tensorrt]"
        )


def profiles_from_contract(contract, model_inputs):
    """Return the optimisation profiles for a network: [{input name: (min, opt, max)}].

    model_inputs are the network's inputs, [{"name", "shape"}], a dim being an
    int when fixed and -1, None or a name when dynamic. Only inputs with a
    dynamic dim get shapes; a network without one needs no profile and gets [].

    The contract (deployhub/registry/contract.py, validated by the hub) gives
    each dynamic axis its range:
    - batch {"min", "opt", "max"}: taken as written;
    - batch {"sizes": [...]}: one profile from the smallest size to the
      largest, opt the largest. A list of sizes says the model is fed batches
      of exactly those sizes; listing more than one means batching, whose
      point is throughput at the large sizes, so the kernels are timed there
      (opt) and the smaller sizes still run (min). A latency-bound class lists
      one size and gets min = opt = max. (A profile per size would tune each
      size but multiply build time and make every run pick its profile.)
    - another symbolic axis: its "dynamic" range; an axis the contract fixes
      although the model leaves it symbolic: that size.
    """
    dynamic = [spec for spec in model_inputs if not all(_is_fixed(d) for d in _dims(spec))]
    if not dynamic:
        return []
    if not isinstance(contract, dict) or not isinstance(contract.get("inputs"), dict):
        names = ", ".join(_describe_dynamic(spec) for spec in dynamic)
        raise JobError(
            f"shape_or_contract: TensorRT needs the input-shape contract to build profiles "
            f"for {names}; set the version's contract"
        )
    return [{spec["name"]: _input_profile(spec, contract["inputs"]) for spec in dynamic}]


def describe_profiles(profiles):
    """Return readable lines for the log: "profile 0: x min 1x16 opt 2x16 max 2x16"."""
    lines = []
    for index, profile in enumerate(profiles):
        for name, shapes in profile.items():
            low, opt, high = ("x".join(map(str, shape)) for shape in shapes)
            lines.append(f"profile {index}: {name} min {low} opt {opt} max {high}")
    return lines


def calibration_plan(sample_count, calibration_samples, fixed_batch=None):
    """Return (batch size, number of batches) to calibrate with; raise JobError when too few.

    Up to calibration_samples samples are used, in batches of CALIBRATION_BATCH
    (fewer when the dataset is smaller), or of the network's batch when it is
    fixed; a last partial batch is left out.
    """
    used = min(sample_count, calibration_samples)
    batch = fixed_batch if fixed_batch else min(CALIBRATION_BATCH, used)
    if used < 1 or used < batch:
        raise JobError(
            f"shape_or_contract: INT8 calibration needs at least {max(batch, 1)} samples "
            f"(the network's batch); the dataset gives {used}"
        )
    return batch, used // batch


def network_model_io(network_inputs, contract=None):
    """Return the model_io (workers/measure/feeds.py) of a network's inputs, [{"name", "shape",
    "dtype"}] with -1 for a dynamic dim and a numpy dtype name, under the contract."""
    return {
        "inputs": [
            {
                "name": spec["name"],
                "dtype": spec["dtype"],
                "shape": [dim if _is_fixed(dim) else None for dim in _dims(spec)],
            }
            for spec in network_inputs
        ],
        "contract": contract if isinstance(contract, dict) else None,
    }


def calibration_batch(allowed, used):
    """Return the batch to calibrate at: the largest allowed size up to CALIBRATION_BATCH and
    the samples there are, else the smallest allowed."""
    fitting = [size for size in allowed if size <= min(CALIBRATION_BATCH, used)]
    return max(fitting) if fitting else min(allowed)


def calibration_feeds(dataset, model_io, calibration_samples):
    """Return (batch, [{input name: batch array}], {input name: shape fed}) to calibrate with.

    The dataset's samples are read and batched by workers/measure/feeds.py for every input of
    model_io (network_model_io's), at a batch the contract or the network allows;
    a last partial batch is left out (calibration_plan).
    """
    from workers.measure import feeds

    specs = feeds.input_specs(model_io)
    arrays, _ = feeds.load_dataset(dataset, specs, what="calibration")
    specs = feeds.fitted(specs, arrays)
    used = min(len(next(iter(arrays.values()))), calibration_samples)
    allowed = feeds.common_batches(specs)
    batch = 1
    if any(spec.batched for spec in specs):
        feeds.default_batch(specs)  # raises when no batch size suits every input
        batch = calibration_batch(allowed if isinstance(allowed, list) else _capped(allowed), used)
    rows, batch = feeds.rows_per_run(specs, batch)
    _, count = calibration_plan(used, calibration_samples, rows)
    batches = []
    for fed, _real in feeds.dataset_batches(arrays, specs, batch):
        if len(batches) == count:
            break
        batches.append(fed)
    shapes = {name: tuple(array.shape) for name, array in batches[0].items()}
    return batch, batches, shapes


def _capped(allowed):
    """Return a range of batch sizes cut to the ones calibration could use."""
    return range(allowed.start, min(allowed.stop, allowed.start + CALIBRATION_BATCH + 1))


def calibration_fields(tensorrt_version, model_sha256, dataset_sha256, calibration_samples):
    """Return the fields a calibration cache depends on, for compat_key and cache_name.

    INT8 scales depend on the model, the samples and the TensorRT release that
    computed them, not on the GPU, so the cache is shared by the devices of one
    TensorRT version (the patch level, as the engine key uses).
    """
    return {
        "tensorrt": ".".join(str(tensorrt_version).split(".")[:3]),
        "model_sha256": model_sha256,
        "dataset_sha256": dataset_sha256,
        "calibration_samples": calibration_samples,
    }


def cache_name(kind, compat_key):
    """Return the storage name of a timing or calibration cache for a compatibility key.

    A timing cache holds kernel timings of one GPU and TensorRT version: key it
    with the engine's compat key. A calibration cache: key it with
    compat_key("tensorrt", calibration_fields(...)).
    """
    if kind not in CACHE_KINDS:
        raise ValueError(f"cache kind {kind!r} is not one of {CACHE_KINDS}")
    backend, _, digest = str(compat_key).partition(":")
    if not backend or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ValueError(f"{compat_key!r} is not a compatibility key ('<backend>:<sha256>')")
    return f"{backend}-{kind}-{digest}.cache"


def classify_build_error(messages):
    """Return (category, failing node or None) of a failed build from its messages.

    Categories: unsupported_operator, out_of_memory, runtime_missing, timeout,
    shape_or_contract, and internal when nothing more specific matches.
    """
    messages = [str(message) for message in messages or []]
    for category, pattern in CATEGORY_PATTERNS:
        matching = [m for m in messages if re.search(pattern, m, re.IGNORECASE)]
        if matching:
            return category, _first_node(matching + messages)
    return "internal", _first_node(messages)


def parser_error_text(errors):
    """Return the ONNX parser's errors as one readable text, each with its failing node.

    errors: [{"node": index (-1 when not at a node), "node_name", "operator",
    "code", "desc"}], read from trt.OnnxParser.get_error(i).
    """
    if not errors:
        return "TensorRT's ONNX parser refused the model without saying why"
    lines = [_parser_error_line(error) for error in errors]
    return "TensorRT's ONNX parser refused the model: " + "; ".join(lines)


def parser_error(errors):
    """Return the TensorRTBuildError for parser errors, classified, naming the first node."""
    text = parser_error_text(errors)
    category, _ = classify_build_error([_parser_error_line(error) for error in errors])
    named = [_node_label(error) for error in errors if _node_label(error)]
    return TensorRTBuildError(category, named[0] if named else None, text)


def build_error(messages, doing="build the engine"):
    """Return the TensorRTBuildError of a failed step from TensorRT's error messages."""
    category, node = classify_build_error(messages)
    where = f" at node {node}" if node else ""
    said = " | ".join(messages[-5:]) if messages else "it said nothing more"
    return TensorRTBuildError(category, node, f"TensorRT could not {doing}{where}: {said}")


def layer_summary(engine_information):
    """Return {"layers": n, "layer_types": {type: count}} from the inspector's JSON.

    The engine inspector lists layers as objects with a "LayerType" when the
    engine was built with ProfilingVerbosity.DETAILED, as bare names otherwise
    (types are then unknown).
    """
    layers = json.loads(engine_information).get("Layers") or []
    types = Counter(_layer_type(layer) for layer in layers)
    return {"layers": len(layers), "layer_types": dict(sorted(types.items()))}


def describe_settings(build_config, tensorrt_version):
    """Return the build's settings as one log line."""
    settings = resolved(build_config)
    flags = ", ".join(builder_flags(settings)) or "none"
    cleared = "".join(f", cleared {flag}" for flag in cleared_flags(settings))
    mode = f" ({settings['int8_mode']})" if settings["precision"] == "int8" else ""
    return (
        f"tensorrt {tensorrt_version}, precision {settings['precision']}{mode}, "
        f"flags {flags}{cleared}, workspace {settings['workspace_mb']} MiB, "
        f"optimisation level {settings['optimization_level']}, "
        f"hardware compatibility {settings['hardware_compatibility']}, "
        f"version compatible {str(settings['version_compatible']).lower()}"
    )


def gpu_problems(fingerprint):
    """Return what this host lacks to build and run TensorRT engines, from its fingerprint.

    Each item is one sentence: no driver, no GPU, no CUDA, or no CUDA build of
    torch (its CUDA tensors hold the inference and calibration buffers).
    """
    fingerprint = fingerprint or {}
    problems = []
    gpus = fingerprint.get("gpus")
    if fingerprint.get("nvidia_driver") is None and gpus is None:
        problems.append("no NVIDIA driver found (NVML could not initialise)")
    elif not gpus:
        problems.append("the NVIDIA driver reports no GPU")
    elif not (fingerprint.get("cuda") or {}).get("driver_api"):
        problems.append("the NVIDIA driver reports no CUDA version")
    torch = fingerprint.get("torch")
    if not isinstance(torch, dict):
        problems.append(
            "torch is not installed: TensorRT's input and output buffers are torch CUDA "
            "tensors: pip install deployhub[torch] (a CUDA build)"
        )
    elif not torch.get("cuda"):
        problems.append(
            f"torch {torch.get('version')} is a CPU build: TensorRT's input and output buffers "
            "are torch CUDA tensors; install a CUDA build of torch"
        )
    return problems


def _check_choice(settings, key, choices):
    if settings[key] not in choices:
        raise JobError(f"tensorrt {key} {settings[key]!r} is not one of {list(choices)}")


def _check_whole(settings, key, minimum):
    value = settings[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise JobError(f"tensorrt {key} must be a whole number of at least {minimum}")


def _is_fixed(dim):
    return isinstance(dim, int) and not isinstance(dim, bool) and dim > 0


def _dims(spec):
    return spec.get("shape") or []


def _describe_dynamic(spec):
    axes = [str(axis) for axis, dim in enumerate(_dims(spec)) if not _is_fixed(dim)]
    return f"{spec['name']!r} (dynamic axes {', '.join(axes)})"


def _input_profile(spec, entries):
    """Return (min, opt, max) shapes of one dynamic network input from its contract entry."""
    name = spec["name"]
    entry = entries.get(name)
    if not isinstance(entry, dict) or not isinstance(entry.get("shape"), list):
        raise JobError(f"shape_or_contract: the contract has no entry for the input {name!r}")
    dims = _dims(spec)
    if len(entry["shape"]) != len(dims):
        raise JobError(
            f"shape_or_contract: the network's {name!r} has {len(dims)} axes; "
            f"the contract's shape has {len(entry['shape'])}"
        )
    ranges = [_axis_range(name, axis, dim, entry) for axis, dim in enumerate(dims)]
    return tuple(tuple(r[bound] for r in ranges) for bound in range(3))


def _axis_range(name, axis, dim, entry):
    """Return (min, opt, max) of one axis: fixed by the model, the contract, or a range."""
    if _is_fixed(dim):
        return dim, dim, dim
    written = entry["shape"][axis]
    if axis == 0 and written == "batch":
        return _batch_range(name, entry.get("batch"))
    if _is_fixed(written):
        return written, written, written
    bounds = (entry.get("dynamic") or {}).get(str(axis))
    if not isinstance(bounds, dict) or not all(_is_fixed(bounds.get(k)) for k in _BOUNDS):
        raise JobError(
            f"shape_or_contract: axis {axis} of {name!r} is dynamic and the contract gives "
            "it no min, opt and max"
        )
    return tuple(bounds[k] for k in _BOUNDS)


def _batch_range(name, batch):
    """Return (min, opt, max) of the batch axis: a range as written, sizes smallest..largest."""
    if isinstance(batch, dict) and batch.get("sizes"):
        sizes = batch["sizes"]
        return min(sizes), max(sizes), max(sizes)
    if isinstance(batch, dict) and all(_is_fixed(batch.get(k)) for k in _BOUNDS):
        return tuple(batch[k] for k in _BOUNDS)
    raise JobError(f"shape_or_contract: the contract gives the batch of {name!r} no sizes or range")


def _first_node(messages):
    """Return the failing node named in the first message that names one, else None."""
    for message in messages:
        for pattern in NODE_PATTERNS:
            found = re.search(pattern, message)
            if found:
                return _node_from_match(found.groupdict())
    return None


def _node_from_match(groups):
    if groups.get("name"):
        return groups["name"]
    if groups.get("output"):
        return f"#{groups['index']} ({groups['op']} -> {groups['output']})"
    return f"#{groups['index']}"


def _node_label(error):
    """Return how a parser error names its node: its name, else its index, else None."""
    if error.get("node_name"):
        return error["node_name"]
    node = error.get("node", -1)
    return f"#{node}" if isinstance(node, int) and node >= 0 else None


def _parser_error_line(error):
    """Return one parser error as "node 'conv1' (#3, Conv): UNSUPPORTED_NODE: ..."."""
    code = str(error.get("code") or "").removeprefix("ErrorCode.")
    desc = str(error.get("desc") or "").strip()
    node, index = error.get("node_name"), error.get("node", -1)
    details = [f"#{index}"] if isinstance(index, int) and index >= 0 else []
    details += [error["operator"]] if error.get("operator") else []
    if node:
        where = f"node {node}" + (f" ({', '.join(details)})" if details else "")
    elif details:
        where = f"node {', '.join(details)}"
    else:
        where = "the graph"
    return f"{where}: {code}: {desc}" if code else f"{where}: {desc}"


def _layer_type(layer):
    """Return an inspector layer's type, "unknown" when it is listed by name only."""
    return (layer.get("LayerType") if isinstance(layer, dict) else None) or "unknown"


# A serialised engine (a "plan") opens with this tag, a little-endian uint32 ("ftrt"), then
# its serialisation version; TensorRT's own samples check the same before deserialising.
PLAN_MAGIC = 0x74727466
PLAN_HEADER_BYTES = 28


def plan_problem(head):
    """Say why bytes that open a file are not a TensorRT plan's ("" when they are)."""
    if len(head) < PLAN_HEADER_BYTES:
        return f"it is {len(head)} bytes long: shorter than a TensorRT plan's header"
    if int.from_bytes(head[:4], "little") != PLAN_MAGIC:
        return "it does not open with a TensorRT plan's tag"
    return ""
