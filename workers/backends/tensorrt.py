"""TensorRT: a serialized engine built from ONNX for one GPU architecture and toolchain.

An engine does not travel to another TensorRT version, another compute
capability or, often, another driver. Two build flags relax that: a
version-compatible engine runs on later TensorRT releases of the same major
version, and a hardware-compatible ("ampere_plus") engine on any GPU from
Ampere (sm_80) on.

The builder uses TensorRT 10's Python API: the ONNX parser fills an explicit
batch network (the only kind TensorRT 10 has); the build config takes its
flags, workspace, optimisation level, compatibility level and profiles from
the pure decisions in `tensorrt_plan`; the timing cache goes in and comes out;
INT8 is calibrated from the version's dataset (IInt8EntropyCalibrator2) or
taken from the model's Q/DQ nodes. The artifact is `engine.plan`; beside it in
workdir are `timing.cache` (CompileResult.timing_cache) and, after an INT8
calibration, `calibration.cache` (CompileResult.calibration_cache: the hub
stores it and hands it to the next INT8 build of the same model, dataset and
TensorRT version, which then skips calibrating). The hub puts
the version's input-shape contract in the build config under "contract"
(deployhub/engines/actions.py): a network with dynamic axes needs it.

Buffers on the GPU (inference, calibration batches) are torch CUDA tensors;
tensorrt and torch are imported only inside the methods that use them.
"""

from pathlib import Path

from workers.backends import tensorrt_plan as plan
from workers.backends.base import (
    Backend,
    CompileResult,
    compat_key,
    cuda_version,
    gpu_compute_capability,
    tool_version,
    version_parts,
)
from workers.errors import JobError

AMPERE = (8, 0)
ENGINE_FILE = "engine.plan"
TIMING_CACHE_FILE = "timing.cache"
CALIBRATION_CACHE_FILE = "calibration.cache"
NO_CALIBRATION = (
    "shape_or_contract: TensorRT int8 calibration needs the version's calibration dataset: "
    "attach one (version page, Datasets), or export the model with Q/DQ nodes and set "
    'int8_mode "qdq"'
)


class TensorRTBackend(Backend):
    """NVIDIA TensorRT engines, built and run on the GPU they are for."""

    name = "tensorrt"
    runtime = "tensorrt"
    extra = "tensorrt"
    distributions = (
        "tensorrt",
        "tensorrt-cu13",
        "tensorrt-cu12",
        "tensorrt-cu13-bindings",
        "tensorrt-cu12-bindings",
    )
    needs_gpu = True
    builds_from_contract = True  # optimisation profiles come from the contract
    # The TensorRT ONNX parser is backward compatible to opset 9 (NVIDIA's opset guide).
    min_opset = 9
    max_opset = 22
    unsupported_ops = frozenset(
        {"Unique", "StringNormalizer", "TfIdfVectorizer", "RegexFullMatch", "StringSplit"}
    )
    auto_builds = {"fp16": {}, "int8": {"precision": "int8"}}
    # Its default precision is fp16 (11-bit mantissa; the selftest's outputs reach about 10).
    selftest_tolerance = 5e-2
    install_note = " (needs an NVIDIA GPU and driver)"

    @classmethod
    def host_problems(cls, fingerprint):
        """Return why the host's GPUs, driver or CUDA cannot run TensorRT, one sentence each."""
        return plan.gpu_problems(fingerprint)

    @classmethod
    def artifact_problem(cls, path):
        """A serialised plan: TensorRT's header, checked without TensorRT."""
        with open(path, "rb") as handle:
            return plan.plan_problem(handle.read(plan.PLAN_HEADER_BYTES))

    @classmethod
    def compat_fields(cls, fingerprint, build_config):
        """Return TensorRT's version, the GPU architecture, the driver and CUDA majors."""
        config = build_config or {}
        version = tool_version(fingerprint, "tensorrt")
        if config.get("version_compatible"):
            fields = {"tensorrt": version_parts(version, 1), "version_compatible": True}
        else:
            fields = {"tensorrt": version_parts(version, 3)}
        capability = gpu_compute_capability(fingerprint)
        fields |= _hardware_fields(config.get("hardware_compatibility"), capability)
        fields["driver_major"] = _major((fingerprint or {}).get("nvidia_driver"))
        fields["cuda_major"] = _major(
            cuda_version(fingerprint, "driver_api") or cuda_version(fingerprint, "runtime")
        )
        return fields

    @classmethod
    def canonical_config(cls, build_config):
        """Return the config with every default filled in; calibration settings only where used."""
        config = {**(build_config or {}), **plan.resolved(build_config)}
        if config["precision"] != "int8":
            del config["int8_mode"]
        if not plan.needs_calibration(config):
            del config["calibration_samples"]
        return config

    @classmethod
    def calibration_cache(cls, build_config, fingerprint, model_sha256, dataset_sha256):
        """INT8 scales depend on the model, the samples and the TensorRT release only, so
        the devices of one TensorRT version share a cache (tensorrt_plan.calibration_fields)."""
        version = tool_version(fingerprint, "tensorrt")
        if not version or not plan.needs_calibration(build_config or {}):
            return None
        samples = plan.resolved(build_config)["calibration_samples"]
        fields = plan.calibration_fields(version, model_sha256, dataset_sha256, samples)
        return compat_key(cls.name, fields), version

    @classmethod
    def needs_calibration(cls, build_config):
        """Return True for int8 by calibration; an explicit-QDQ int8 build reads none."""
        return plan.needs_calibration(build_config or {})

    @classmethod
    def check_config(cls, build_config):
        """Refuse unknown keys, precisions, levels and compatibility settings (tensorrt_plan)."""
        plan.check_config(build_config)

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
        """Parse the ONNX model, build and serialise an engine into workdir/engine.plan.

        model_io (the version's signature and contract) gives calibration the contract
        when the build config carries none.
        """
        self.check_config(build_config)
        if plan.needs_calibration(build_config) and calibration is None:
            raise JobError(NO_CALIBRATION)
        trt = _import_tensorrt()
        build = _Build(trt, Path(source), Path(workdir), build_config, progress)
        build.parse()
        build.configure(timing_cache)
        if plan.needs_calibration(build_config):
            build.calibrate(Path(calibration), model_io)
        build.build()
        return build.result()

    def load(self, artifact, build_config):
        """Deserialise an engine (verified beforehand); return the handle infer runs."""
        trt = _import_tensorrt()
        logger = _capturing_logger(trt)
        runtime = _started(trt, trt.Runtime, logger)
        if plan.resolved(build_config)["version_compatible"]:
            runtime.engine_host_code_allowed = True  # the engine carries its lean runtime
        engine = runtime.deserialize_cuda_engine(Path(artifact).read_bytes())
        if engine is None:
            raise plan.build_error(logger.errors, doing="deserialise the engine")
        return _Loaded(trt, logger, runtime, engine)

    def infer(self, handle, feeds):
        """Run the engine once on {input name: array}; return the outputs as numpy arrays."""
        return handle.run(feeds)


class _Build:
    """One engine build: the TensorRT objects it holds, its log and progress."""

    def __init__(self, trt, source, workdir, build_config, progress):
        self.trt, self.source, self.workdir = trt, source, workdir
        self.build_config = build_config or {}
        self.report = progress or _ignore_progress
        self.logger = _capturing_logger(trt)
        self.notes = [plan.describe_settings(self.build_config, trt.__version__)]
        self.builder = _started(trt, trt.Builder, self.logger)
        self.network = self.builder.create_network(0)  # TensorRT 10: always explicit batch
        self.config = self.builder.create_builder_config()
        self.calibrator = None
        self.plan_bytes = None

    def parse(self):
        """Parse the ONNX model into the network; raise the parser's errors, with their nodes."""
        self.report(0.05, f"parsing {self.source.name} with TensorRT's ONNX parser")
        self.parser = self.trt.OnnxParser(self.network, self.logger)
        if not self.parser.parse_from_file(str(self.source)):
            count = self.parser.num_errors
            raise plan.parser_error([_parser_error(self.parser.get_error(i)) for i in range(count)])
        self.notes.append(
            f"network: {self.network.num_inputs} inputs, {self.network.num_layers} layers, "
            f"{self.network.num_outputs} outputs"
        )

    def configure(self, timing_cache):
        """Set flags, workspace, level, compatibility, profiles and the timing cache."""
        trt, config, settings = self.trt, self.config, plan.resolved(self.build_config)
        config.set_memory_pool_limit(
            trt.MemoryPoolType.WORKSPACE, plan.workspace_bytes(self.build_config)
        )
        config.builder_optimization_level = settings["optimization_level"]
        for flag in plan.builder_flags(self.build_config):
            config.set_flag(_member(trt.BuilderFlag, flag))
        for flag in plan.cleared_flags(self.build_config):
            config.clear_flag(_member(trt.BuilderFlag, flag))
        level = plan.hardware_level(self.build_config)
        if level:
            config.hardware_compatibility_level = _member(trt.HardwareCompatibilityLevel, level)
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # layer types for the report
        self._add_profiles()
        self._use_timing_cache(timing_cache)

    def calibrate(self, dataset, model_io=None):
        """Attach an entropy calibrator over the dataset; its cache goes to calibration.cache.

        The batches are made by workers/measure/feeds.py (plan.calibration_feeds) for every
        network input. A calibration.cache already in workdir (an earlier build's, for
        the same model, dataset and TensorRT version) is read instead of calibrating again.
        """
        import numpy as np

        inputs = self.network_inputs()
        for index, spec in enumerate(inputs):
            spec["dtype"] = np.dtype(self.trt.nptype(self.network.get_input(index).dtype)).name
        contract = self.build_config.get("contract") or (model_io or {}).get("contract")
        settings = plan.resolved(self.build_config)
        batch, batches, shapes = plan.calibration_feeds(
            dataset, plan.network_model_io(inputs, contract), settings["calibration_samples"]
        )
        dynamic = {spec["name"] for spec in inputs if any(dim < 0 for dim in spec["shape"])}
        if dynamic:
            self._set_calibration_profile({name: shapes[name] for name in dynamic})
        cache = self.workdir / CALIBRATION_CACHE_FILE
        self.calibrator = _entropy_calibrator(self.trt, batches, batch, cache)
        self.config.int8_calibrator = self.calibrator
        self.notes.append(
            f"int8 calibration: {batch * len(batches)} samples in {len(batches)} batches of "
            f"{batch} (IInt8EntropyCalibrator2), cache {cache.name}"
        )

    def build(self):
        """Build and serialise the engine; raise the classified error when TensorRT cannot."""
        self.report(0.2, "building the engine (TensorRT times its kernels on this GPU)")
        self.plan_bytes = self.builder.build_serialized_network(self.network, self.config)
        if self.plan_bytes is None:
            raise plan.build_error(self.logger.errors)
        self.report(0.9, "engine built")

    def result(self):
        """Write the engine and timing cache; inspect the layers; return the CompileResult."""
        engine = self.workdir / ENGINE_FILE
        engine.write_bytes(self.plan_bytes)
        self.notes.append(f"artifact {engine.name}: {engine.stat().st_size} bytes")
        timing = self.workdir / TIMING_CACHE_FILE
        timing.write_bytes(self.config.get_timing_cache().serialize())
        self.notes.append(f"timing cache out: {timing.stat().st_size} bytes")
        calibration = self.workdir / CALIBRATION_CACHE_FILE
        if calibration.exists():
            self.notes.append(f"calibration cache: {calibration.stat().st_size} bytes")
        else:
            calibration = None
        report = self._graph_report()
        self.report(1.0, "built")
        return CompileResult(
            artifact=engine,
            timing_cache=timing,
            calibration_cache=calibration,
            log="".join(f"{line}\n" for line in self.notes + self.logger.lines),
            tool_versions={"tensorrt": self.trt.__version__},
            graph_report=report,
        )

    def network_inputs(self):
        """Return the network's inputs as [{"name", "shape"}], -1 for a dynamic dim."""
        inputs = (self.network.get_input(i) for i in range(self.network.num_inputs))
        return [{"name": tensor.name, "shape": list(tensor.shape)} for tensor in inputs]

    def _add_profiles(self):
        """Add the optimisation profile the contract gives a network with dynamic axes."""
        profiles = plan.profiles_from_contract(
            self.build_config.get("contract"), self.network_inputs()
        )
        for shapes in profiles:
            profile = self.builder.create_optimization_profile()
            for name, (low, opt, high) in shapes.items():
                profile.set_shape(name, low, opt, high)
            if self.config.add_optimization_profile(profile) < 0:
                raise plan.build_error(self.logger.errors, doing="add the optimisation profile")
        self.notes += plan.describe_profiles(profiles) or ["no optimisation profile: static shapes"]

    def _set_calibration_profile(self, shapes):
        """Calibrate at one shape per dynamic input: TensorRT calibrates dynamic networks at a
        profile's opt."""
        profile = self.builder.create_optimization_profile()
        for name, shape in shapes.items():
            profile.set_shape(name, shape, shape, shape)
        self.config.set_calibration_profile(profile)

    def _use_timing_cache(self, path):
        """Start from an earlier build's timing cache; a cache from elsewhere is set aside."""
        data = Path(path).read_bytes() if path else b""
        cache = self.config.create_timing_cache(data)
        if self.config.set_timing_cache(cache, ignore_mismatch=False):
            self.notes.append(f"timing cache in: {len(data)} bytes" if data else "timing cache new")
            return
        self.notes.append("timing cache in: refused (another GPU or TensorRT); starting a new one")
        self.config.set_timing_cache(self.config.create_timing_cache(b""), ignore_mismatch=False)

    def _graph_report(self):
        """Return {"before": ONNX nodes, "after": engine layers or None, "fused": lines}."""
        import onnx

        from workers.backends.graph_report import histogram

        before = histogram(onnx.load(str(self.source), load_external_data=False))
        after = self._inspect_layers()
        fused = []
        if after is not None:
            fused.append(f"ONNX nodes {before['nodes']} → TensorRT layers {after['layers']}")
        return {"before": before, "after": after, "fused": fused}

    def _inspect_layers(self):
        """Return the engine's layers and their types from the engine inspector, or None."""
        try:
            runtime = self.trt.Runtime(self.logger)
            if plan.resolved(self.build_config)["version_compatible"]:
                runtime.engine_host_code_allowed = True
            engine = runtime.deserialize_cuda_engine(self.plan_bytes)
            inspector = engine.create_engine_inspector()
            info = inspector.get_engine_information(self.trt.LayerInformationFormat.JSON)
            return plan.layer_summary(info)
        except Exception as error:  # an older TensorRT or a lean engine: no per-layer report
            self.notes.append(f"per-layer information unavailable: {error}")
            return None


class _Loaded:
    """A deserialised engine, its execution context, and the names and types of its tensors."""

    def __init__(self, trt, logger, runtime, engine):
        self.trt, self.logger, self.runtime, self.engine = trt, logger, runtime, engine
        self.context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        is_input = {name: engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT for name in names}
        self.inputs = [name for name in names if is_input[name]]
        self.outputs = [name for name in names if not is_input[name]]
        self.dtypes = {name: engine.get_tensor_dtype(name).name for name in names}

    def run(self, feeds):
        """Copy the feeds to the GPU, execute on torch's current stream, copy the outputs back."""
        import torch

        device = torch.device("cuda")
        buffers = {}  # kept referenced until the run ends
        for name in self.inputs:
            tensor = torch.as_tensor(feeds[name]).to(device=device, dtype=self._torch(torch, name))
            if not self.context.set_input_shape(name, tuple(tensor.shape)):
                raise JobError(
                    f"shape_or_contract: input {name!r} of shape {tuple(tensor.shape)} is outside "
                    f"the engine's profile (min, opt, max {self._profile(name)})"
                )
            buffers[name] = tensor.contiguous()
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            if any(dim < 0 for dim in shape):
                raise JobError(f"output {name!r} has a data-dependent shape {shape}: not supported")
            buffers[name] = torch.empty(shape, dtype=self._torch(torch, name), device=device)
        for name, tensor in buffers.items():
            self.context.set_tensor_address(name, tensor.data_ptr())
        stream = torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise plan.build_error(self.logger.errors, doing="run the engine")
        stream.synchronize()
        return [_to_numpy(buffers[name]) for name in self.outputs]

    def _profile(self, name):
        """Return the min, opt and max shapes the engine accepts for an input."""
        return [tuple(shape) for shape in self.engine.get_tensor_profile_shape(name, 0)]

    def _torch(self, torch, name):
        """Return the torch dtype of an engine tensor."""
        return getattr(torch, plan.TORCH_DTYPES[self.dtypes[name]])


def _import_tensorrt():
    """Return the tensorrt module; raise MissingRuntime, or JobError for another major version."""
    from workers.backends.known import require

    require(TensorRTBackend.name)  # MissingRuntime naming deployhub[tensorrt]
    import tensorrt as trt

    plan.check_tensorrt_version(trt.__version__)
    return trt


def _capturing_logger(trt):
    """Return a trt.ILogger that keeps TensorRT's warnings and errors for the log and errors."""
    kept = {trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR}
    warning = trt.ILogger.Severity.WARNING

    class CapturingLogger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.lines, self.errors = [], []

        def log(self, severity, message):
            if severity in kept:
                self.errors.append(message)
            if severity in kept or severity == warning:
                self.lines.append(f"TensorRT {severity.name}: {message}")

    return CapturingLogger()


def _started(trt, factory, logger):
    """Return factory(logger); raise runtime_missing when TensorRT cannot reach a GPU."""
    try:
        made = factory(logger)
    except (TypeError, RuntimeError) as error:  # pybind11: "factory function returned nullptr"
        made, cause = None, str(error)
    else:
        cause = None
    if made is None:
        messages = logger.errors or [cause or "TensorRT could not start"]
        category, _ = plan.classify_build_error(messages)
        category = category if category != "internal" else "runtime_missing"
        raise plan.TensorRTBuildError(
            category, None, f"TensorRT could not start on this machine: {' | '.join(messages)}"
        )
    return made


def _member(enum, name):
    """Return an enum member by name; raise JobError when this TensorRT lacks it."""
    try:
        return getattr(enum, name)
    except AttributeError:
        raise JobError(
            f"this worker's TensorRT has no {enum.__name__}.{name}; upgrade TensorRT 10"
        ) from None


def _parser_error(error):
    """Return a trt parser error as the plain dict tensorrt_plan formats."""
    return {
        "node": error.node(),
        "node_name": _optional(error, "node_name"),
        "operator": _optional(error, "node_operator"),
        "code": str(error.code()),
        "desc": error.desc(),
    }


def _optional(error, method):
    """Return a parser error field TensorRT 10 added, None on a release without it."""
    read = getattr(error, method, None)
    return read() if read else None


def _entropy_calibrator(trt, batches, batch_size, cache):
    """Return an IInt8EntropyCalibrator2 feeding batches through torch CUDA tensors."""
    import torch

    if not torch.cuda.is_available():
        raise JobError(
            "runtime_missing: int8 calibration copies batches to the GPU with torch, "
            "and this torch has no CUDA"
        )

    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self):
            trt.IInt8EntropyCalibrator2.__init__(self)
            self.pending, self.current = iter(batches), []

        def get_batch_size(self):
            return batch_size

        def get_batch(self, names):
            batch = next(self.pending, None)
            if batch is None:
                return None  # no more batches: calibration is done
            self.current = [torch.from_numpy(batch[name]).cuda() for name in names]
            torch.cuda.synchronize()
            return [tensor.data_ptr() for tensor in self.current]

        def read_calibration_cache(self):
            return cache.read_bytes() if cache.exists() else None

        def write_calibration_cache(self, data):
            cache.write_bytes(bytes(data))

    return EntropyCalibrator()


def _to_numpy(tensor):
    """Return a CUDA tensor as a numpy array (bfloat16 as float32: numpy has no bfloat16)."""
    import torch

    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.cpu().numpy()


def _ignore_progress(fraction, message):
    """Accept a progress report and do nothing with it."""


def _hardware_fields(level, capability):
    """Return the GPU field of the key: the compute capability, or the architecture family.

    An "ampere_plus" engine runs on sm_80 and newer; an older GPU gets a family
    no such engine has, so its key never matches one.
    """
    if level != "ampere_plus":
        return {"compute_capability": capability}
    parsed = _capability(capability)
    if parsed is None:
        return {"arch_family": None}
    return {"arch_family": "ampere+" if parsed >= AMPERE else "pre-ampere"}


def _capability(text):
    """Return a compute capability "8.6" as (8, 6), None when unknown or malformed."""
    try:
        major, minor = str(text).split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def _major(version):
    """Return a version's major number ("550.54.15" -> 550), None when unknown."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None
