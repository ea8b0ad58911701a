"""A compile job: build an engine with a backend in a child process, load it once, upload it."""

import shutil

from workers import kinds
from workers.backends import known
from workers.backends.base import compat_key, digest
from workers.backends.isolate import CompileFailure, compile_result_from_json, run_isolated
from workers.backends.tensorrt import CALIBRATION_CACHE_FILE
from workers.errors import JobError
from workers.jobs.loading import onnx_model_path
from workers.kinds import (
    CALIBRATION_CACHE_ARTIFACT,
    CALIBRATION_CACHE_INPUT,
    CALIBRATION_INPUT,
    ENGINE_ARTIFACT,
    MODEL_INPUT,
    TIMING_CACHE_ARTIFACT,
    TIMING_CACHE_INPUT,
)

KIND = kinds.COMPILE
# A compile and the first load of what it built each run in a child process, under this limit.
DEFAULT_COMPILE_TIMEOUT = 1800
COMPILE_FUNCTION = "workers.backends.isolate.compile_backend"
SMOKE_TEST_FUNCTION = "workers.backends.isolate.smoke_test"


def run(job_run, inputs):
    """Compile the model with the job's backend, upload the engine; return the compile result."""
    if MODEL_INPUT not in inputs:
        raise JobError("a compile job needs an input named 'model' (the ONNX model)")
    params = job_run.job.get("params") or {}
    backend = known.require(params.get("backend"))
    build_config = backend.canonical_config(_build_config(params))
    fingerprint = job_run.current_fingerprint()
    source = onnx_model_path(inputs[MODEL_INPUT], job_run.workdir / "model")
    built, seconds = _build(job_run, backend, build_config, source, inputs)
    _smoke_test(job_run, backend, build_config, source, built)
    fields = backend.compat_fields(fingerprint, build_config)
    return {
        "backend": backend.name,
        "build_config": build_config,
        "config_digest": digest(build_config),
        "compat_fields": fields,
        "compat_key": compat_key(backend.name, fields),
        "fingerprint": fingerprint,
        "tool_versions": built.tool_versions,
        "build_seconds": round(seconds, 3),
        "build_log": built.log,
        "graph_report": built.graph_report,
        **_upload_build(job_run, built),
    }


def _build(job_run, backend, build_config, source, inputs):
    """Compile the model input in a child process; return (CompileResult, seconds taken).

    The compile's own time is measured in the child, without the process start.
    """
    build_dir = job_run.workdir / "build"
    build_dir.mkdir()
    files = {name: inputs.get(name) for name in (TIMING_CACHE_INPUT, CALIBRATION_INPUT)}
    if files[CALIBRATION_INPUT]:
        job_run.log.add("the build gets the calibration input")
    if cached := inputs.get(CALIBRATION_CACHE_INPUT):
        shutil.copyfile(cached, build_dir / CALIBRATION_CACHE_FILE)
        job_run.log.add("the build starts from a stored calibration cache: no calibration pass")
    kwargs = {
        "backend": backend.name,
        "source": str(source),
        "build_config": build_config,
        "workdir": str(build_dir),
        "model_io": job_run.model_io(),
        **{name: str(path) for name, path in files.items() if path},
    }
    answer = _isolated(job_run, COMPILE_FUNCTION, kwargs, progress=job_run.report)
    built, seconds = compile_result_from_json(answer), answer["seconds"]
    job_run.log.add(f"built {built.artifact.name} with {backend.name} in {seconds:.2f} s")
    return built, seconds


def _smoke_test(job_run, backend, build_config, source, built):
    """Load the built artifact and run it once on synthetic inputs (workers/measure/feeds.py) in a
    child process, or fail the job."""
    job_run.report(0.95, "first load and inference of the built engine")
    try:
        kwargs = {
            "backend": backend.name,
            "artifact": str(built.artifact),
            "build_config": build_config,
            "source": str(source),
            "model_io": job_run.model_io(),
        }
        ran = _isolated(job_run, SMOKE_TEST_FUNCTION, kwargs)
    except CompileFailure as failure:
        message = f"the engine built, but its first load or inference failed: {failure.message}"
        raise CompileFailure(
            failure.category, message, node=failure.node, log=failure.log
        ) from failure
    job_run.log.add(
        f"first load {ran['load_seconds']:.2f} s, one inference {ran['infer_seconds']:.3f} s "
        f"on {ran.get('fed', 'zeros')} {ran['inputs']}: outputs {ran['outputs']}"
    )


def _isolated(job_run, function, kwargs, progress=None):
    """Run a function in a child process under the compile job's time limit; return its result."""
    params = job_run.job.get("params") or {}
    return run_isolated(
        function,
        kwargs,
        timeout=params.get("timeout_seconds") or DEFAULT_COMPILE_TIMEOUT,
        progress=progress,
        should_stop=job_run.should_stop,
    )


def check(job_run):
    """Refuse, before downloading, a backend this worker cannot run or a config it cannot build."""
    params = job_run.job.get("params") or {}
    known.require(params.get("backend")).check_config(_build_config(params))
    timeout = params.get("timeout_seconds")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise JobError("a compile job's timeout_seconds must be a positive number of seconds")


def _build_config(params):
    """Return a compile job's build config, checking it is an object."""
    build_config = params.get("build_config") or {}
    if not isinstance(build_config, dict):
        raise JobError("a compile job's build_config must be a JSON object")
    return build_config


def _upload_build(job_run, built):
    """Upload the engine and its caches (if any); return their result fields."""
    cache, calibration = built.timing_cache, built.calibration_cache
    return {
        "artifact": ENGINE_ARTIFACT,
        "artifact_sha256": job_run.upload(ENGINE_ARTIFACT, built.artifact),
        "timing_cache_sha256": job_run.upload(TIMING_CACHE_ARTIFACT, cache) if cache else None,
        "calibration_cache_sha256": (
            job_run.upload(CALIBRATION_CACHE_ARTIFACT, calibration) if calibration else None
        ),
    }
