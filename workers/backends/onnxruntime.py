"""ONNX Runtime: an ONNX model optimised offline for one execution provider.

The artifact is `engine.onnx`, the model as ONNX Runtime saves it after its
graph optimisations (`SessionOptions.optimized_model_filepath`). A source with
external data gives `engine.zip` instead: `engine.onnx` and its weights in
`engine.onnx.data`, written by ONNX Runtime next to it, stored uncompressed.
Levels "extended" and "all" apply layout transformations chosen for the CPU's
instruction set, so such a model is keyed on the CPU's ISA level.

Precision "int8" quantises statically to QDQ with the version's calibration
data, after `quant_pre_process` (shape inference and fusion: without it the
BatchNormalization nodes stay between quantised convolutions and INT8 can be
slower than FP32); "fp16" converts the weights for GPU providers. Either way
the result is then optimised like an FP32 model. On the CPU, ONNX Runtime
turns a QDQ model into integer kernels whose speed, and some of whose choices,
follow VNNI, so an INT8 model optimised for the CPU is keyed on VNNI as well.
"""

import platform
import zipfile
from functools import partial
from pathlib import Path

from workers.backends import artifacts
from workers.backends.base import (
    Backend,
    BuildLog,
    CompileResult,
    cpu_flags,
    cpu_isa,
    gpu_compute_capability,
    tool_version,
    with_defaults,
)
from workers.backends.graph_report import (
    NOTHING_QUANTISED,
    histogram,
    onnx_graph_report,
    quantised_by_authors,
    quantized_nodes,
)
from workers.errors import JobError
from workers.fingerprint import cpu_flags_here

# Build config optimization_level -> onnxruntime.GraphOptimizationLevel member.
LEVELS = {
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
DEFAULT_LEVEL = "all"
DEFAULT_PROVIDER = "CPUExecutionProvider"
# Levels whose layout transformations depend on the CPU's instruction set.
ISA_DEPENDENT_LEVELS = ("extended", "all")
GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")
PRECISIONS = ("fp32", "fp16", "int8")
DEFAULT_PRECISION = "fp32"
# The int8 settings, their defaults and allowed values (build config -> onnxruntime names).
INT8_DEFAULTS = {
    "quant_format": "qdq",
    "per_channel": True,
    "activation_type": "uint8",
    "weight_type": "int8",
    "calibration_method": "minmax",
    "preprocess": True,
    "calibration_samples": 100,
}
QUANT_FORMATS = {"qdq": "QDQ", "qoperator": "QOperator"}
QUANT_TYPES = {"uint8": "QUInt8", "int8": "QInt8"}
CALIBRATION_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
CHOICES = {
    "quant_format": QUANT_FORMATS,
    "activation_type": QUANT_TYPES,
    "weight_type": QUANT_TYPES,
    "calibration_method": CALIBRATION_METHODS,
}
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")
CONFIG_KEYS = ("provider", "optimization_level", "precision", *INT8_DEFAULTS)
ENGINE_FILE = "engine.onnx"
EXTERNAL_DATA_FILE = "engine.onnx.data"
ENGINE_ARCHIVE = "engine.zip"
# The first IR version whose graph inputs need not list the initializers.
MIN_IR_WITHOUT_LISTING = 4
# QDQ quantisation writes DequantizeLinear with a per-channel axis: opset 13 operators.
INT8_MIN_OPSET = 13
FP16_ON_CPU = "fp16 conversion is for GPU providers; on the CPU use int8"
NO_CALIBRATION = (
    "int8 needs the version's calibration dataset: attach one (version page, Datasets) "
    "and build again"
)


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime with a chosen execution provider, optimisation level and precision."""

    name = "onnxruntime"
    runtime = "onnxruntime"
    extra = "worker"
    runs_on_cpu = True
    harness_runs_engine = True
    gpu_precisions = {"fp16": "fp16 conversion is for GPU providers; on the CPU use int8"}
    # ONNX Runtime only guarantees ai.onnx opset 7 and later; older operators
    # (BatchNormalization-6, Add with broadcast) have no kernel.
    min_opset = 7
    max_opset = 23
    extra_domains = ("com.microsoft",)
    auto_builds = {"fp32": {}, "int8": {"precision": "int8"}}
    runtime_fields = {"version": str, "providers": [str]}
    # int8: quantize_static after quant_pre_process, whose symbolic shape inference needs sympy.
    build_imports = {
        "int8": (
            "onnxruntime.quantization",
            "onnxruntime.quantization.shape_inference",
            "onnxruntime.tools.symbolic_shape_infer",
        ),
        "fp16": ("onnxruntime.transformers.float16",),
    }

    @classmethod
    def probe_runtime(cls):
        """Return ONNX Runtime's version and execution providers, None if it is absent."""
        try:
            import onnxruntime
        except (ImportError, OSError):
            return None
        return {
            "version": onnxruntime.__version__,
            "providers": onnxruntime.get_available_providers(),
        }

    @classmethod
    def artifact_problem(cls, path):
        """An ONNX file that parses, or a zip of exactly engine.onnx and its weights."""
        if zipfile.is_zipfile(path):
            allowed = (ENGINE_FILE, EXTERNAL_DATA_FILE)
            return artifacts.onnx_in_zip_problem(path, ENGINE_FILE, allowed)
        return artifacts.onnx_problem(Path(path).read_bytes())

    @classmethod
    def compat_fields(cls, fingerprint, build_config):
        """Return ORT's version, the provider, the level, and the CPU or GPU it bakes in."""
        provider, level = provider_of(build_config), level_of(build_config)
        fields = {
            "onnxruntime": tool_version(fingerprint, "onnxruntime"),
            "provider": provider,
            "optimization_level": level,
        }
        if provider == DEFAULT_PROVIDER and level in ISA_DEPENDENT_LEVELS:
            fields["cpu_isa"] = cpu_isa(fingerprint)
            if precision_of(build_config) == "int8":
                fields["cpu_vnni"] = has_vnni(cpu_flags(fingerprint))
        if provider in GPU_PROVIDERS:
            fields["compute_capability"] = gpu_compute_capability(fingerprint)
        return fields

    @classmethod
    def canonical_config(cls, build_config):
        """Return the config with its provider, level and precision, and int8's settings."""
        config = with_defaults(
            build_config,
            {
                "provider": DEFAULT_PROVIDER,
                "optimization_level": DEFAULT_LEVEL,
                "precision": DEFAULT_PRECISION,
            },
        )
        return with_defaults(config, INT8_DEFAULTS) if precision_of(config) == "int8" else config

    @classmethod
    def check_config(cls, build_config):
        """Refuse unknown keys, levels and precisions, fp16 on the CPU, bad int8 settings."""
        config = build_config or {}
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise JobError(
                f"onnxruntime build config has unknown keys {unknown}; known: {list(CONFIG_KEYS)}"
            )
        if level_of(config) not in LEVELS:
            raise JobError(
                f"onnxruntime optimization_level {level_of(config)!r} is not one of {list(LEVELS)}"
            )
        _check_precision(config)

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
        """Quantise or convert as the precision asks, then optimise for the provider.

        model_io (the version's signature and contract) says how calibration feeds the model.
        """
        import onnxruntime as ort

        self.check_config(build_config)
        provider, level = provider_of(build_config), level_of(build_config)
        _check_provider(ort, provider)
        build = _Build(Path(source), Path(workdir), progress or _ignore_progress)
        build.model_io = model_io
        build.note(
            f"onnxruntime {ort.__version__}, {provider}, precision {precision_of(build_config)}"
        )
        build.source = weights_as_constants(build)
        model = _convert_precision(build, build_config, calibration)
        target, artifact = _optimise(ort, build, model, provider, level)
        report = onnx_graph_report(source, target)
        build.note(f"artifact {artifact.name}: {artifact.stat().st_size} bytes")
        build.notes += [f"graph: {line}" for line in report["fused"]]
        if precision_of(build_config) == "int8":
            _note_quantised(build, report)
        build.report(1.0, "built")
        return CompileResult(
            artifact=artifact,
            log=build.log(),
            tool_versions={"onnxruntime": ort.__version__},
            graph_report=report,
        )

    def load(self, artifact, build_config):
        """Open an optimised model with its provider, optimisations off (they are done)."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        model = engine_model_path(Path(artifact))
        return ort.InferenceSession(str(model), options, providers=[provider_of(build_config)])

    def infer(self, handle, feeds):
        """Run the session on the feeds; return every output."""
        return handle.run(None, feeds)


class _Build(BuildLog):
    """The stages of one build, with the source and the folder it builds in."""

    def __init__(self, source, workdir, progress):
        super().__init__(progress)
        self.source, self.workdir = source, workdir
        self.model_io = None


def provider_of(build_config):
    """Return the execution provider a build config asks for."""
    return (build_config or {}).get("provider") or DEFAULT_PROVIDER


def level_of(build_config):
    """Return the graph optimisation level a build config asks for."""
    return (build_config or {}).get("optimization_level") or DEFAULT_LEVEL


def precision_of(build_config):
    """Return the precision a build config asks for ("fp32", "fp16", "int8")."""
    return (build_config or {}).get("precision") or DEFAULT_PRECISION


def int8_setting(build_config, name):
    """Return an int8 setting of a build config, or its default."""
    value = (build_config or {}).get(name)
    return INT8_DEFAULTS[name] if value is None else value


def has_vnni(flags):
    """Return True when the CPU flags include VNNI (int8 dot products), None when unknown."""
    if flags is None:
        return None
    return any(flag in flags for flag in VNNI_FLAGS)


def has_external_data(path):
    """Return True when an ONNX model keeps tensors in files beside it."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    return any(uses_external_data(tensor) for tensor in model.graph.initializer)


def engine_model_path(artifact):
    """Return the ONNX file of an engine: the artifact, or engine.onnx unpacked from its zip.

    Call only on an engine whose sha256 and signature were verified.
    """
    if not zipfile.is_zipfile(artifact):
        return artifact
    folder = artifact.with_name(f"{artifact.name}.unpacked")
    with zipfile.ZipFile(artifact) as archive:
        archive.extractall(folder)
    model = folder / ENGINE_FILE
    if not model.is_file():
        raise JobError(f"the engine archive holds no {ENGINE_FILE}")
    return model


def weights_as_constants(build):
    """Return the source, or a copy whose graph inputs no longer list its initializers.

    ONNX IR < 4 lists every initializer as a graph input (IR 4 and later allow
    it, as an initializer a caller may override). ONNX Runtime's optimisations
    fold some of those initializers away but keep the inputs, so the model it
    saves asks at first run for feeds nobody gives ("Required inputs ... are
    missing"). DeployHub never feeds initializers (the version's signature leaves
    them out), so the copy makes them constants, at IR 4 at least. Only the
    graph is rewritten: external data stays where it is, the copy sits beside
    the source so its relative locations still resolve, and no tensor is read.
    """
    import onnx

    model = onnx.load(str(build.source), load_external_data=False)
    weights = {tensor.name for tensor in model.graph.initializer}
    inputs = list(model.graph.input)
    listed = [value for value in inputs if value.name in weights]
    if not listed:
        return build.source
    del model.graph.input[:]
    model.graph.input.extend(value for value in inputs if value.name not in weights)
    ir_version, model.ir_version = model.ir_version, max(model.ir_version, MIN_IR_WITHOUT_LISTING)
    folder = build.source.parent if has_external_data(build.source) else build.workdir
    copy = folder / f"{build.source.stem}.constants.onnx"
    onnx.save(model, str(copy))
    raised = f" (IR version raised to {model.ir_version})" if ir_version != model.ir_version else ""
    build.note(
        f"IR {ir_version}: {len(listed)} initializers listed as graph inputs were made "
        f"constants{raised}"
    )
    return copy


def _note_quantised(build, report):
    """Record how many nodes of the int8 build are quantised; say so when none is."""
    report["quantized_nodes"] = quantized_nodes(report["after"])
    if report["quantized_nodes"] == 0:
        build.note(NOTHING_QUANTISED)


def _check_provider(ort, provider):
    """Raise JobError when this ONNX Runtime lacks the provider."""
    available = ort.get_available_providers()
    if provider not in available:
        raise JobError(
            f"this worker's onnxruntime has no {provider}; it has {', '.join(available)}"
        )


def _optimise(ort, build, model, provider, level):
    """Save the model as ONNX Runtime optimises it; return (engine.onnx, the artifact)."""
    target = build.workdir / ENGINE_FILE
    external = has_external_data(model)
    options = _build_options(ort, level, target, external)
    with build.stage(0.8, f"optimising ({provider}, level {level})"):
        ort.InferenceSession(str(model), options, providers=[provider])
    build.note(f"graph optimisation level {level} (GraphOptimizationLevel.{LEVELS[level]})")
    artifact = _archive(target, target.with_name(EXTERNAL_DATA_FILE)) if external else target
    return target, artifact


def _build_options(ort, level, target, external):
    """Return session options that save the optimised model to target."""
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    options.optimized_model_filepath = str(target)
    if external:
        # Without this ORT inlines every weight, and a model over 2 GB cannot be saved.
        key = "session.optimized_model_external_initializers_file_name"
        options.add_session_config_entry(key, EXTERNAL_DATA_FILE)
    return options


def _archive(model, data):
    """Zip the optimised model and its external data, uncompressed; return the zip."""
    archive = model.with_name(ENGINE_ARCHIVE)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as out:
        out.write(model, model.name)
        if data.exists():
            out.write(data, data.name)
    return archive


def _ignore_progress(fraction, message):
    """Accept a progress report and do nothing with it."""


def _check_precision(config):
    """Refuse an unknown precision, fp16 on the CPU, and int8 settings that cannot build."""
    precision = precision_of(config)
    if precision not in PRECISIONS:
        raise JobError(f"onnxruntime precision {precision!r} is not one of {list(PRECISIONS)}")
    if precision == "fp16" and provider_of(config) not in GPU_PROVIDERS:
        raise JobError(FP16_ON_CPU)
    int8_keys = sorted(name for name in INT8_DEFAULTS if name in config)
    if int8_keys and precision != "int8":
        raise JobError(f"{int8_keys} apply to precision int8 only; this build is {precision}")
    for name, choices in CHOICES.items():
        value = int8_setting(config, name)
        if not isinstance(value, str) or value not in choices:
            raise JobError(f"onnxruntime {name} {value!r} is not one of {list(choices)}")
    for name in ("per_channel", "preprocess"):
        if not isinstance(int8_setting(config, name), bool):
            raise JobError(f"onnxruntime {name} must be true or false")
    samples = int8_setting(config, "calibration_samples")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise JobError("onnxruntime calibration_samples must be a whole number of at least 1")


def _convert_precision(build, build_config, calibration):
    """Return the model to optimise: the source, or its int8 or fp16 conversion."""
    precision = precision_of(build_config)
    if precision == "int8":
        return _quantize_int8(build, build_config, calibration)
    if precision == "fp16":
        return _convert_fp16(build)
    return build.source


def _quantize_int8(build, build_config, calibration):
    """Quantise the source statically with the calibration data; return the QDQ model."""
    from onnxruntime import quantization

    refuse_quantised(build.source)
    if calibration is None:
        raise JobError(NO_CALIBRATION)
    folder = build.workdir / "int8"
    folder.mkdir(exist_ok=True)
    build.source = opset_for_int8(build, folder)
    external = has_external_data(build.source)
    model = build.source
    if int8_setting(build_config, "preprocess"):
        model = _preprocess(build, folder, external)
    else:
        build.note("quant_pre_process skipped (preprocess false): expect unfused nodes")
    reader = _calibration_reader(model, calibration, build_config, build.model_io)
    build.note(f"calibration: {len(reader)} samples of {reader.input_name}")
    quantized = folder / "quantized.onnx"
    with build.stage(0.4, f"quantising to int8 ({_describe_int8(build_config)})"):
        quantization.quantize_static(
            str(model),
            str(quantized),
            reader,
            **_quantize_options(quantization, build_config),
            reduce_range=_reduce_range(build, build_config),
            use_external_data_format=external,
        )
    return quantized


def refuse_quantised(source):
    """Raise JobError when the source is quantised already (Q/DQ pairs, integer operators).

    quantize_static would quantise it twice, and fails on its Q/DQ pairs with
    errors that name neither the model nor the cause (a KeyError on a scale).
    """
    import onnx

    why = quantised_by_authors(histogram(onnx.load(str(source), load_external_data=False)))
    if why:
        raise JobError(
            f"int8: the model is {why}: build it with precision fp32, which runs its "
            "quantised operators as they are"
        )


def _reduce_range(build, build_config):
    """Return True when u8s8 kernels would saturate here: then quantise weights to 7 bits.

    Without VNNI, ONNX Runtime's x86 u8s8 kernels add pairs of products in 16 bits
    (vpmaddubsw), which saturate; with 7-bit weights they cannot. The engine's
    compatibility key holds VNNI for int8, so such a build serves only such CPUs.
    """
    saturates = u8s8_saturates(build_config, platform.machine(), cpu_flags_here())
    if saturates:
        build.note("int8: this CPU has no VNNI, so weights are quantised to 7 bits (reduce_range)")
    return saturates


def u8s8_saturates(build_config, machine, flags):
    """Return True when an int8 build with these settings saturates on this x86 CPU without VNNI."""
    types = [int8_setting(build_config, name) for name in ("activation_type", "weight_type")]
    x86 = machine.lower() in ("x86_64", "amd64", "i686", "x86")
    return types == ["uint8", "int8"] and x86 and has_vnni(flags) is False


def opset_for_int8(build, folder):
    """Return the source, or a copy converted to opset 13 when it is older.

    QDQ quantisation writes DequantizeLinear with a per-channel axis, which
    opset 13 brought: quantising an older model gives one ONNX Runtime refuses
    ("Unrecognized attribute: axis for operator DequantizeLinear").
    """
    import onnx

    from workers.checks.convert import convert_model, default_opset  # numpy: not on every hub

    model = onnx.load(str(build.source), load_external_data=False)
    opset = default_opset(model)
    if opset is None or opset >= INT8_MIN_OPSET:
        return build.source
    external = has_external_data(build.source)
    with build.stage(0.05, f"converting opset {opset} to {INT8_MIN_OPSET} for QDQ quantisation"):
        converted = convert_model(onnx.load(str(build.source)), INT8_MIN_OPSET)
        copy = folder / f"opset{INT8_MIN_OPSET}.onnx"
        onnx.save(
            converted, str(copy), save_as_external_data=external, location=f"{copy.name}.data"
        )
    build.note(
        f"int8: opset {opset} converted to {INT8_MIN_OPSET} with onnx.version_converter "
        "(QDQ quantisation writes opset 13 operators)"
    )
    return copy


def _preprocess(build, folder, external):
    """Run quant_pre_process (shape inference, fusion) on the source; return its output."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    output = folder / "preprocessed.onnx"
    with build.stage(0.1, "quant_pre_process: shape inference and fusion before quantising"):
        try:
            quant_pre_process(str(build.source), str(output), save_as_external_data=external)
        except Exception as error:  # its symbolic shape inference asserts on some graphs
            build.note(
                f"quant_pre_process's symbolic shape inference failed "
                f"({type(error).__name__}: {error or 'no message'}); "
                "preprocessing again with ONNX shape inference only"
            )
            quant_pre_process(
                str(build.source),
                str(output),
                skip_symbolic_shape=True,
                save_as_external_data=external,
            )
    return output


def _quantize_options(quantization, build_config):
    """Return quantize_static's keyword arguments for a build config."""
    setting = partial(int8_setting, build_config)
    return {
        "quant_format": getattr(quantization.QuantFormat, QUANT_FORMATS[setting("quant_format")]),
        "per_channel": setting("per_channel"),
        "activation_type": getattr(quantization.QuantType, QUANT_TYPES[setting("activation_type")]),
        "weight_type": getattr(quantization.QuantType, QUANT_TYPES[setting("weight_type")]),
        "calibrate_method": getattr(
            quantization.CalibrationMethod, CALIBRATION_METHODS[setting("calibration_method")]
        ),
    }


def _describe_int8(build_config):
    """Return the int8 settings as one phrase for the log."""
    setting = partial(int8_setting, build_config)
    channel = "per channel" if setting("per_channel") else "per tensor"
    return (
        f"{setting('quant_format')}, {channel}, activations {setting('activation_type')}, "
        f"weights {setting('weight_type')}, {setting('calibration_method')} calibration"
    )


class CalibrationReader:
    """Feed calibration batches to quantize_static (its CalibrationDataReader): each a dict
    of every model input, made by workers/measure/feeds.py."""

    def __init__(self, batches, samples, input_names):
        self.batches, self.samples, self.index = batches, samples, 0
        self.input_name = ", ".join(input_names)

    def get_next(self):
        """Return the next {input name: batch}, None when every batch was read."""
        if self.index >= len(self.batches):
            return None
        self.index += 1
        return self.batches[self.index - 1]

    def __len__(self):
        return self.samples


def _calibration_reader(model, calibration, build_config, model_io=None):
    """Return a CalibrationReader over the calibration dataset, at the model's default batch.

    model_io (the job's) says what the model takes; without it, the model's graph inputs.
    """
    from workers.measure import feeds

    specs = feeds.input_specs(model_io or feeds.model_io_from_onnx(model))
    count = int8_setting(build_config, "calibration_samples")
    arrays, _ = feeds.load_dataset(calibration, specs, count, what="calibration")
    batches = list(feeds.dataset_batches(arrays, specs))
    samples = sum(real for _, real in batches)
    return CalibrationReader([fed for fed, _ in batches], samples, [s.name for s in specs])


def _convert_fp16(build):
    """Convert the source's float32 tensors to float16, inputs and outputs kept; return it."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    output = build.workdir / "fp16" / "model.onnx"
    output.parent.mkdir(exist_ok=True)
    external = has_external_data(build.source)
    with build.stage(0.3, "converting to fp16 (inputs and outputs stay float32)"):
        model = convert_float_to_float16(onnx.load(str(build.source)), keep_io_types=True)
        onnx.save(model, str(output), save_as_external_data=external, location="model.onnx.data")
    return output
