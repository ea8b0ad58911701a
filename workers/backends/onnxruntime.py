"""ONNX Runtime: an ONNX model optimised offline for one execution provider.

The artifact is `engine.onnx`, the model as ONNX Runtime saves it after its
graph optimisations (`SessionOptions.optimized_model_filepath`). A source with
external data gives `engine.zip` instead: `engine.onnx` and its weights in
`engine.onnx.data`, written by ONNX Runtime next to it, stored uncompressed.
Levels "extended" and "all" apply layout transformations chosen for the CPU's
instruction set, so such a model is keyed on the CPU's ISA level.
"""

import zipfile
from pathlib import Path

from workers.backends.base import (
    Backend,
    CompileResult,
    cpu_isa,
    gpu_compute_capability,
    tool_version,
)
from workers.errors import JobError

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
CONFIG_KEYS = ("provider", "optimization_level")
ENGINE_FILE = "engine.onnx"
EXTERNAL_DATA_FILE = "engine.onnx.data"
ENGINE_ARCHIVE = "engine.zip"


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime with a chosen execution provider and graph optimisation level."""

    name = "onnxruntime"
    runtime = "onnxruntime"
    extra = "worker"

    @classmethod
    def compat_fields(cls, fingerprint, build_config):
        """Return ORT's version, the provider, the level, and the CPU ISA or GPU it bakes in."""
        provider, level = provider_of(build_config), level_of(build_config)
        fields = {
            "onnxruntime": tool_version(fingerprint, "onnxruntime"),
            "provider": provider,
            "optimization_level": level,
        }
        if provider == DEFAULT_PROVIDER and level in ISA_DEPENDENT_LEVELS:
            fields["cpu_isa"] = cpu_isa(fingerprint)
        if provider in GPU_PROVIDERS:
            fields["compute_capability"] = gpu_compute_capability(fingerprint)
        return fields

    @classmethod
    def check_config(cls, build_config):
        """Refuse unknown keys and optimisation levels."""
        unknown = sorted(set(build_config or {}) - set(CONFIG_KEYS))
        if unknown:
            raise JobError(
                f"onnxruntime build config has unknown keys {unknown}; known: {list(CONFIG_KEYS)}"
            )
        if level_of(build_config) not in LEVELS:
            raise JobError(
                f"onnxruntime optimization_level {level_of(build_config)!r} is not one of "
                f"{list(LEVELS)}"
            )

    def compile(self, source, build_config, workdir, *, timing_cache=None, progress=None):
        """Save the model as ONNX Runtime optimises it for the configured provider."""
        import onnxruntime as ort

        self.check_config(build_config)
        provider, level = provider_of(build_config), level_of(build_config)
        _check_provider(ort, provider)
        report = progress or _ignore_progress
        report(0.1, f"optimising with onnxruntime {ort.__version__} ({provider}, level {level})")
        target = Path(workdir) / ENGINE_FILE
        external = has_external_data(source)
        options = _build_options(ort, level, target, external)
        ort.InferenceSession(str(source), options, providers=[provider])
        artifact = _archive(target, target.with_name(EXTERNAL_DATA_FILE)) if external else target
        report(1.0, "optimised")
        log = _build_log(ort.__version__, provider, level, source, target, artifact)
        versions = {"onnxruntime": ort.__version__}
        return CompileResult(artifact=artifact, log=log, tool_versions=versions)

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


def provider_of(build_config):
    """Return the execution provider a build config asks for."""
    return (build_config or {}).get("provider") or DEFAULT_PROVIDER


def level_of(build_config):
    """Return the graph optimisation level a build config asks for."""
    return (build_config or {}).get("optimization_level") or DEFAULT_LEVEL


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


def _check_provider(ort, provider):
    """Raise JobError when this ONNX Runtime lacks the provider."""
    available = ort.get_available_providers()
    if provider not in available:
        raise JobError(
            f"this worker's onnxruntime has no {provider}; it has {', '.join(available)}"
        )


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


def _build_log(version, provider, level, source, target, artifact):
    """Return the lines that say how the engine was built."""
    return (
        f"onnxruntime {version}, {provider}, graph optimisation level {level} "
        f"(GraphOptimizationLevel.{LEVELS[level]})\n"
        f"nodes: {_node_count(source)} in {source.name}, {_node_count(target)} after optimisation\n"
        f"artifact {artifact.name}: {artifact.stat().st_size} bytes\n"
    )


def _node_count(path):
    """Return the number of nodes in an ONNX model's main graph."""
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)


def _ignore_progress(fraction, message):
    """Accept a progress report and do nothing with it."""
