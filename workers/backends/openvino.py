"""OpenVINO: an ONNX model converted to OpenVINO IR and compiled for one device plugin.

The artifact is `engine.zip`, stored uncompressed: the IR (`model.xml` and
its weights `model.bin`), `build.json` (the build config and the OpenVINO
build that made it) and, when `export_blob` is on (the default on the CPU),
`model.blob`, the compiled model as `CompiledModel.export_model()` writes it.

The IR runs on any machine with the same OpenVINO release and device plugin.
The blob is tied to the CPU it was compiled on as well: its kernels follow the
CPU's ISA level, and a bf16 inference precision only takes effect where the CPU
has bf16 instructions (AMX or AVX512-BF16). Loading imports the blob when this
OpenVINO build wrote it and compiles the IR otherwise. INT8 is NNCF's
post-training quantisation on the version's calibration dataset; the
quantised IR keeps FakeQuantize ops that the CPU plugin runs in u8/i8.
"""

import json
import shutil
import sys
import zipfile
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from workers.backends import artifacts
from workers.backends.base import (
    Backend,
    CompileResult,
    cpu_flags,
    cpu_isa,
    tool_version,
    with_defaults,
)
from workers.backends.graph_report import (
    NOTHING_QUANTISED,
    conv_groups,
    histogram,
    quantized_nodes,
)
from workers.errors import JobError

DEFAULT_DEVICE = "CPU"
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
PRECISIONS = ("fp32", "bf16", "int8")
# Other spellings a build config may use for a precision: OpenVINO's own name for fp32.
PRECISION_ALIASES = {"f32": "fp32"}
DEFAULT_HINT = "LATENCY"
PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT")
# Build config preset -> nncf.QuantizationPreset member.
PRESETS = {"performance": "PERFORMANCE", "mixed": "MIXED"}
INT8_DEFAULTS = {"calibration_samples": 300, "preset": "performance", "fast_bias_correction": True}
CONFIG_KEYS = ("device", "precision", "performance_hint", "export_blob", *INT8_DEFAULTS)
IR_FILE = "model.xml"
WEIGHTS_FILE = "model.bin"
BLOB_FILE = "model.blob"
BUILD_FILE = "build.json"
ENGINE_ARCHIVE = "engine.zip"
NO_BF16 = "bf16 needs AMX or AVX-512 BF16; this CPU has neither"
NO_CALIBRATION = "int8 needs the version's calibration dataset"
# Graph inputs, outputs and weights: not counted as operators, as ONNX keeps weights apart.
STRUCTURAL_OPS = ("Parameter", "Result", "Constant")
STRUCTURAL_LAYERS = ("Input", "Output", "Const")


def _turn_off_telemetry():
    """Keep OpenVINO's model converter and NNCF from sending usage telemetry from this process.

    Both report usage through `openvino_telemetry` unless its per-user consent
    file says no (`opt_in_out --opt_out`), spawning a process to send it and
    writing files under ~/intel; both fall back to a no-op stub when that module
    does not import. A worker must not phone home (it usually cannot), so the
    module is made unimportable here. It runs when this file loads, which the
    registry does before anything imports openvino (the fingerprint does).
    """
    sys.modules.setdefault("openvino_telemetry", None)


_turn_off_telemetry()


@dataclass
class LoadedModel:
    """A compiled model ready to run, and whether it came from the blob or the IR."""

    compiled: object  # openvino.CompiledModel
    request: object  # openvino.InferRequest
    source: str  # "blob" or "ir"
    reason: str = ""  # why the IR was compiled instead of importing the blob


class OpenVinoBackend(Backend):
    """Intel OpenVINO, compiled for one device plugin (CPU, GPU, NPU)."""

    name = "openvino"
    runtime = "openvino"
    extra = "openvino"
    runs_on_cpu = True
    # Its ONNX frontend still reads opset 6, but every build is measured against its source
    # in ONNX Runtime, which runs opset 7 and later: older files are converted first.
    min_opset = 7
    max_opset = 22
    unsupported_ops = frozenset({"StringNormalizer", "TfIdfVectorizer", "RegexFullMatch"})
    auto_builds = {"fp32": {}, "bf16": {"precision": "bf16"}, "int8": {"precision": "int8"}}
    runtime_fields = {"version": str, "devices": [str]}
    # int8: NNCF's post-training quantisation of the converted model.
    build_imports = {"int8": ("nncf", "nncf.openvino.quantization.quantize_model")}

    @classmethod
    def probe_runtime(cls):
        """Return OpenVINO's release and the devices its plugins see, None if it is absent."""
        found = super().probe_runtime()
        if found is None:
            return None
        # An imported openvino says "2026.4.1-22982-<hash>-releases/2026/4", its metadata
        # "2026.4.1": report the release either way, so importing it does not look like an upgrade.
        return {"version": release(found["version"]), "devices": available_devices()}

    @classmethod
    def artifact_problem(cls, path):
        """A zip of the IR (XML and weights), build.json and maybe the compiled blob."""
        allowed = (IR_FILE, WEIGHTS_FILE, BUILD_FILE, BLOB_FILE)
        required = (IR_FILE, WEIGHTS_FILE)
        return artifacts.ir_problem(path, IR_FILE, required, allowed)

    @classmethod
    def compat_fields(cls, fingerprint, build_config):
        """Return OpenVINO's release, the device plugin and, for a compiled blob, the CPU."""
        fields = {
            "openvino": release(tool_version(fingerprint, "openvino")),
            "device": device_of(build_config),
        }
        if exports_blob(build_config):
            fields["cpu_isa"] = cpu_isa(fingerprint)
            fields["bf16_hardware"] = _has_bf16(cpu_flags(fingerprint))
        return fields

    @classmethod
    def canonical_config(cls, build_config):
        """Return the config with device, precision (fp32 for f32), hint, blob, int8 settings."""
        config = dict(build_config or {})
        if config.get("precision") is not None:
            config["precision"] = precision_of(config)
        defaults = {
            "device": device_of(config),
            "precision": "fp32",
            "performance_hint": DEFAULT_HINT,
            "export_blob": device_of(config) == DEFAULT_DEVICE,
        }
        config = with_defaults(config, defaults)
        return with_defaults(config, INT8_DEFAULTS) if precision_of(config) == "int8" else config

    @classmethod
    def check_config(cls, build_config):
        """Refuse unknown keys and values, a blob off the CPU, INT8 settings on other builds."""
        config = build_config or {}
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise JobError(
                f"openvino build config has unknown keys {unknown}; known: {list(CONFIG_KEYS)}"
            )
        _check_choice({"precision": precision_of(config)}, "precision", PRECISIONS)
        _check_choice(config, "performance_hint", PERFORMANCE_HINTS)
        _check_device(config)
        _check_int8_settings(config)

    def compile(
        self,
        source,
        build_config,
        workdir,
        *,
        timing_cache=None,
        calibration=None,
        progress=None,
        model_io=None,
    ):
        """Convert the ONNX model, quantise it for int8, compile it; zip the IR and the blob.

        model_io (the version's signature and contract) says how calibration feeds the model.
        """
        import openvino as ov

        self.check_config(build_config)
        config, report = build_config or {}, progress or _ignore_progress
        source, workdir = Path(source), Path(workdir)
        core, device = ov.Core(), device_of(config)
        _check_device_here(core, device, precision_of(config))
        report(0.1, f"converting {source.name} with OpenVINO {ov.get_version()}")
        model = ov.convert_model(str(source))
        quantised = ""
        if precision_of(config) == "int8":
            report(0.3, "quantising to int8 with NNCF")
            model, quantised = _quantise(model, calibration, config, model_io, source)
        ov.save_model(model, str(workdir / IR_FILE), compress_to_fp16=False)
        report(0.6, f"compiling for {device} with {compile_properties(config)}")
        compiled = core.compile_model(model, device, compile_properties(config))
        blob = _export_blob(compiled, workdir) if exports_blob(config) else None
        artifact = _archive(workdir, config, blob)
        graph = graph_report(source, model, compiled)
        if precision_of(config) == "int8":
            graph["quantized_nodes"] = quantized_nodes(graph["after"])
        report(1.0, "compiled")
        log = _build_log(core, config, quantised, graph, blob, artifact)
        return CompileResult(
            artifact=artifact, log=log, tool_versions=_tool_versions(config), graph_report=graph
        )

    def load(self, artifact, build_config):
        """Open an engine: import its blob if this OpenVINO build wrote it, else compile the IR."""
        import openvino as ov

        folder = _unpack(Path(artifact))
        core, device = ov.Core(), device_of(build_config)
        properties = compile_properties(build_config)
        reason = _blob_refusal(folder, ov.get_version())
        if not reason:
            try:
                compiled = core.import_model((folder / BLOB_FILE).read_bytes(), device, properties)
                return LoadedModel(compiled, compiled.create_infer_request(), "blob")
            except RuntimeError as exc:  # another CPU or plugin build: the IR still runs
                reason = f"importing the blob failed: {exc}"
        compiled = core.compile_model(str(folder / IR_FILE), device, properties)
        return LoadedModel(compiled, compiled.create_infer_request(), "ir", reason)

    def infer(self, handle, feeds):
        """Run the loaded model's infer request on the feeds; return every output, in order."""
        results = handle.request.infer(feeds)
        # Copies: the arrays are views of the request's tensors, rewritten by the next call.
        return [results[output].copy() for output in handle.compiled.outputs]


@cache
def available_devices():
    """Return OpenVINO's available devices (["CPU", "GPU"]), None if it cannot say; once."""
    try:
        import openvino

        return list(openvino.Core().available_devices)
    except Exception:  # a broken install or plugin: unknown, not "no devices"
        return None


def release(version):
    """Return an OpenVINO version as its release: "2026.4.1-22982-e213a14..." -> "2026.4.1".

    The fingerprint reports the package version before openvino is imported and
    the runtime's build string after; both name the same release.
    """
    return None if version is None else str(version).split("-")[0]


def device_of(build_config):
    """Return the device plugin a build config compiles for."""
    return (build_config or {}).get("device") or DEFAULT_DEVICE


def precision_of(build_config):
    """Return the precision a build config asks for: "fp32" (also spelt "f32"), "bf16", "int8"."""
    precision = (build_config or {}).get("precision") or "fp32"
    return PRECISION_ALIASES.get(precision, precision) if isinstance(precision, str) else precision


def exports_blob(build_config):
    """Return True when a build exports the compiled blob (by default on the CPU)."""
    config = build_config or {}
    return bool(config.get("export_blob", device_of(config) == DEFAULT_DEVICE))


def compile_properties(build_config):
    """Return the plugin properties a build compiles and loads with.

    INT8 models compile with the f32 hint: their FakeQuantize ops keep the
    quantised parts in u8/i8. The hint is always given, since the CPU plugin
    picks bf16 by itself on CPUs that have it.
    """
    precision = precision_of(build_config)
    return {
        "INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32",
        "PERFORMANCE_HINT": (build_config or {}).get("performance_hint") or DEFAULT_HINT,
    }


def device_capabilities(core, device):
    """Return what the device plugin says it can compute in (["FP32", "BF16", "INT8", ...])."""
    return list(core.get_property(device, "OPTIMIZATION_CAPABILITIES"))


def graph_report(source, model, compiled):
    """Return the ONNX source's operators, the OpenVINO model's, the runtime graph's and findings.

    "after" counts the converted (and for int8 quantised) model's ops, leaving
    out inputs, outputs and constants; "runtime" counts the nodes the plugin
    executes, where fusion shows.
    """
    import onnx

    onnx_model = onnx.load(str(source), load_external_data=False)
    before, after = histogram(onnx_model), _model_histogram(model)
    nodes = _runtime_nodes(compiled)
    runtime = _runtime_histogram(nodes) if nodes else None
    fused = [_node_line(before, after, runtime)]
    fused += _folding_lines(onnx_model, after)
    fused += _int8_lines(model, after)
    fused += _fusion_lines(nodes, model)
    if runtime:
        precisions = ", ".join(f"{n} {kind}" for kind, n in runtime["precisions"].items())
        fused.append(f"runtime nodes by precision: {precisions}")
    return {"before": before, "after": after, "runtime": runtime, "fused": fused}


def _check_choice(config, key, choices):
    """Raise JobError when config[key] is set to something outside choices."""
    if key in config and config[key] not in list(choices):
        raise JobError(f"openvino {key} {config[key]!r} is not one of {list(choices)}")


def _check_device(config):
    """Raise JobError for a device that is not a name, or a blob asked of another plugin."""
    device = config.get("device", DEFAULT_DEVICE)
    if not isinstance(device, str) or not device:
        raise JobError(f"openvino device must be a plugin name such as 'CPU', not {device!r}")
    blob = config.get("export_blob", device == DEFAULT_DEVICE)
    if not isinstance(blob, bool):
        raise JobError(f"openvino export_blob must be true or false, not {blob!r}")
    if blob and device != DEFAULT_DEVICE:
        raise JobError(
            f"openvino export_blob is for the CPU plugin only: a {device} blob would depend "
            "on hardware the fingerprint does not describe; build the IR (export_blob false)"
        )


def _check_int8_settings(config):
    """Raise JobError for INT8 settings on another precision, or with values NNCF refuses."""
    given = [key for key in INT8_DEFAULTS if key in config]
    if given and precision_of(config) != "int8":
        raise JobError(f"openvino {', '.join(given)} apply to precision 'int8' only")
    samples = config.get("calibration_samples", 1)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise JobError(f"openvino calibration_samples must be a whole number ≥ 1, not {samples!r}")
    _check_choice(config, "preset", PRESETS)
    if not isinstance(config.get("fast_bias_correction", True), bool):
        raise JobError("openvino fast_bias_correction must be true or false")


def _check_device_here(core, device, precision):
    """Raise JobError when this OpenVINO lacks the device, or the device cannot compute bf16."""
    available = list(core.available_devices)
    if device not in available:
        raise JobError(f"this worker's OpenVINO has no {device} device; it has {available}")
    if precision == "bf16" and "BF16" not in device_capabilities(core, device):
        raise JobError(NO_BF16 if device == DEFAULT_DEVICE else f"the {device} plugin has no bf16")


def _quantise(model, calibration, config, model_io, source):
    """Return the model quantised to INT8 by NNCF on the calibration samples, and a log line.

    The samples are fed as workers/measure/feeds.py batches them for model_io (the job's; without
    it, the ONNX source's inputs): every input, at the model's default batch.
    """
    import nncf

    asked = config.get("calibration_samples", INT8_DEFAULTS["calibration_samples"])
    batches, used, available = _calibration_batches(calibration, model_io, source, asked)
    preset = config.get("preset", INT8_DEFAULTS["preset"])
    fast = config.get("fast_bias_correction", INT8_DEFAULTS["fast_bias_correction"])
    quantised = nncf.quantize(
        model,
        nncf.Dataset(batches),  # each item is already {input name: batch}
        preset=getattr(nncf.QuantizationPreset, PRESETS[preset]),
        subset_size=len(batches),
        fast_bias_correction=fast,
    )
    line = (
        f"int8: NNCF {nncf.__version__} post-training quantisation, preset {preset}, "
        f"{used} calibration samples (asked {asked}, the dataset has {available}) in "
        f"{len(batches)} batches, {'fast' if fast else 'full'} bias correction"
    )
    return quantised, line


def _calibration_batches(calibration, model_io, source, asked):
    """Return (the calibration feeds, samples in them, samples in the dataset)."""
    import numpy as np

    from workers.measure import feeds

    if calibration is None:
        raise JobError(f"{NO_CALIBRATION}: upload one (kind calibration) and build again")
    specs = feeds.input_specs(model_io or feeds.model_io_from_onnx(source))
    arrays, _ = feeds.load_dataset(calibration, specs, what="calibration")
    available = len(next(iter(arrays.values())))
    arrays = {name: np.ascontiguousarray(array[:asked]) for name, array in arrays.items()}
    batches = list(feeds.dataset_batches(arrays, specs))
    return [fed for fed, _ in batches], sum(real for _, real in batches), available


def _export_blob(compiled, workdir):
    """Write the compiled model as the plugin exports it; return the file."""
    blob = workdir / BLOB_FILE
    blob.write_bytes(compiled.export_model().getvalue())
    return blob


def _archive(workdir, config, blob):
    """Zip the IR, the blob (if any) and build.json, uncompressed; return the zip."""
    import openvino as ov

    record = {"openvino": ov.get_version(), "device": device_of(config), "build_config": config}
    (workdir / BUILD_FILE).write_text(json.dumps(record, indent=2, sort_keys=True))
    names = [IR_FILE, WEIGHTS_FILE, BUILD_FILE] + ([blob.name] if blob else [])
    archive = workdir / ENGINE_ARCHIVE
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as out:
        for name in names:
            out.write(workdir / name, name)
    return archive


def _unpack(artifact):
    """Write the engine archive's files into a fresh folder beside it; return the folder.

    Only the names this backend writes are read, so no member lands elsewhere.
    """
    folder = artifact.with_name(f"{artifact.name}.unpacked")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    with zipfile.ZipFile(artifact) as archive:
        names = set(archive.namelist())
        missing = [name for name in (IR_FILE, WEIGHTS_FILE, BUILD_FILE) if name not in names]
        if missing:
            raise JobError(f"the OpenVINO engine archive lacks {', '.join(missing)}")
        for name in (IR_FILE, WEIGHTS_FILE, BUILD_FILE, BLOB_FILE):
            if name in names:
                (folder / name).write_bytes(archive.read(name))
    return folder


def _blob_refusal(folder, version):
    """Return why the unpacked engine's blob cannot be imported here, "" when it can."""
    if not (folder / BLOB_FILE).is_file():
        return "the engine has no compiled blob"
    built_with = json.loads((folder / BUILD_FILE).read_text()).get("openvino")
    if built_with != version:
        return f"the blob was compiled by OpenVINO {built_with}, this is {version}"
    return ""


def _model_histogram(model):
    """Return {"nodes": n, "operators": {op: count}} of an OpenVINO model, weights left out."""
    counts = Counter(
        op.get_type_name()
        for op in model.get_ordered_ops()
        if op.get_type_name() not in STRUCTURAL_OPS
    )
    return {"nodes": sum(counts.values()), "operators": dict(sorted(counts.items()))}


def _runtime_nodes(compiled):
    """Return (layer type, original op names, precision) of each executed node; [] if hidden."""
    try:
        ops = compiled.get_runtime_model().get_ordered_ops()
    except RuntimeError:  # a plugin that does not show its runtime graph
        return []
    nodes = []
    for op in ops:
        info = op.get_rt_info()
        layer = _rt_text(info, "layerType")
        if layer not in STRUCTURAL_LAYERS:
            names = [name for name in _rt_text(info, "originalLayersNames").split(",") if name]
            nodes.append((layer, names, _rt_text(info, "runtimePrecision")))
    return nodes


def _rt_text(info, key):
    """Return a runtime-info entry as text ("" when absent)."""
    return info[key].astype(str) if key in info else ""


def _runtime_histogram(nodes):
    """Return the runtime graph's node count, layer types and precisions."""
    layers = Counter(layer for layer, _, _ in nodes)
    precisions = Counter(precision for _, _, precision in nodes)
    return {
        "nodes": len(nodes),
        "operators": dict(sorted(layers.items())),
        "precisions": dict(precisions.most_common()),
    }


def _node_line(before, after, runtime):
    """Return the node counts from the ONNX graph to what runs."""
    line = f"nodes: {before['nodes']} ONNX → {after['nodes']} OpenVINO ops"
    return f"{line} → {runtime['nodes']} runtime nodes" if runtime else line


def _folding_lines(onnx_model, after):
    """Return what the conversion folded: Conv+BatchNormalization groups into convolutions."""
    groups = sum(conv_groups(onnx_model))
    if not groups or after["operators"].get("BatchNormInference"):
        return []
    return [
        f"{groups} Conv+BatchNormalization groups folded at conversion: "
        "the scale into the convolution weights, the shift into an Add"
    ]


def _int8_lines(model, after):
    """Return where the quantised model enters INT8 and how many weights it stores as INT8."""
    fake_quantize = after["operators"].get("FakeQuantize", 0)
    if not fake_quantize:
        return []
    weights = sum(
        1
        for op in model.get_ordered_ops()
        if op.get_type_name() == "Constant"
        and op.get_output_element_type(0).get_type_name() in ("i8", "u8")
    )
    return [
        f"{fake_quantize} FakeQuantize ops quantise activations to 8 bits; "
        f"{weights} weight tensors are stored as INT8 (dequantised by Convert + Multiply)"
    ]


def _fusion_lines(nodes, model):
    """Return "3 × Convolution + Add + Relu run as one Convolution node each" lines."""
    kind_of = {op.get_friendly_name(): op.get_type_name() for op in model.get_ordered_ops()}
    groups = Counter()
    for layer, names, _ in nodes:
        kinds = list(dict.fromkeys(kind_of[name] for name in names if name in kind_of))
        if len(kinds) > 1:
            groups[(" + ".join(kinds), layer)] += 1
    return [
        f"{count} × {kinds} run as one {layer} node each"
        for (kinds, layer), count in groups.items()
    ]


def _build_log(core, config, quantised, graph, blob, artifact):
    """Return the lines that say how the engine was built."""
    import openvino as ov

    device = device_of(config)
    properties = ", ".join(f"{key} {value}" for key, value in compile_properties(config).items())
    lines = [
        f"openvino {ov.get_version()}, {device} ({core.get_property(device, 'FULL_DEVICE_NAME')}),"
        f" precision {precision_of(config)} ({properties})"
    ]
    lines += [quantised] if quantised else []
    lines += [NOTHING_QUANTISED] if graph.get("quantized_nodes") == 0 else []
    lines += graph["fused"]
    if blob:
        lines.append(f"compiled blob {blob.name}: {blob.stat().st_size} bytes (this build and CPU)")
    lines.append(f"artifact {artifact.name}: {artifact.stat().st_size} bytes")
    return "\n".join(lines) + "\n"


def _tool_versions(config):
    """Return the versions of the tools the build used."""
    import openvino as ov

    versions = {"openvino": ov.get_version()}
    if precision_of(config) == "int8":
        import nncf

        versions["nncf"] = nncf.__version__
    return versions


def _has_bf16(flags):
    """Return True when the CPU flags include bf16 instructions, None when flags are unknown."""
    if flags is None:
        return None
    return any(flag in flags for flag in BF16_FLAGS)


def _ignore_progress(fraction, message):
    """Accept a progress report and do nothing with it."""
