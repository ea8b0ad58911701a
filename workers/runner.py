"""Run one attempt of a hub job: claim, heartbeat, download, work, complete.

The broker message is only a hint; the hub's answers decide. A 409 at claim
means the message was stale or redelivered, and a 409 later means the hub gave
the job to another attempt: either way this worker drops it quietly.
"""

import hashlib
import logging
import shutil
import threading
import time
import traceback
import zipfile
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from workers import fingerprint as fingerprints
from workers import golden, kinds, side_by_side, signing
from workers.backends import known
from workers.backends.base import compat_key, digest
from workers.backends.isolate import CompileFailure, compile_result_from_json, run_isolated
from workers.backends.onnxruntime import engine_model_path, provider_of
from workers.benchmark import (
    benchmark_onnxruntime,
    benchmark_session,
    create_session,
    read_settings,
)
from workers.client import RETRY_STATUSES, Conflict, HubError, HubUnreachable
from workers.convert import conversion_line, convert_onnx
from workers.errors import ERROR_MAX_CHARS, Cancelled, JobError, one_line
from workers.evaluate import evaluate
from workers.export import export_pt2_to_onnx
from workers.parity import check_parity
from workers.scratch import scratch_dir

__all__ = ["Cancelled", "run_job"]

logger = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 30
# Progress reaches the hub at most this often (seconds), so a user watches it move.
PROGRESS_INTERVAL = 0.5
DROPPED = "dropped"
# The name an export job's ONNX file is uploaded under (docs/protocol.md).
EXPORT_ARTIFACT = "onnx"
# The names of a compile job's artifacts, and of the input that carries an engine.
ENGINE_ARTIFACT = "engine"
TIMING_CACHE_ARTIFACT = "timing_cache"
CALIBRATION_CACHE_ARTIFACT = "calibration_cache"
ENGINE_INPUT = "engine"
# The inputs a compile job may carry besides its model, passed on to the backend.
TIMING_CACHE_INPUT = "timing_cache"
CALIBRATION_INPUT = "calibration"
# The input a parity job carries: the zip of images and tensors.npz (docs/protocol.md).
PARITY_INPUT = "pack"
# An evaluate job's golden pairs (workers/golden.py), beside or instead of its dataset.
GOLDEN_INPUT = "golden"
# An earlier INT8 build's calibration cache: it goes into the build folder, where TensorRT's
# calibrator reads it instead of calibrating again.
CALIBRATION_CACHE_INPUT = "calibration_cache"
CALIBRATION_CACHE_FILE = "calibration.cache"
# A compile and the first load of what it built each run in a child process, under this limit.
DEFAULT_COMPILE_TIMEOUT = 1800
COMPILE_FUNCTION = "workers.backends.isolate.compile_backend"
SMOKE_TEST_FUNCTION = "workers.backends.isolate.smoke_test"
CHUNK_BYTES = 1024 * 1024
# Downloads, uploads and the completion wait this long for a hub that answers 503 or not at
# all (its database restarting): giving up would throw the work away and run the job again.
HUB_PATIENCE_SECONDS = 120
HUB_RETRY_PAUSE_SECONDS = 2


def run_job(client, job_id, attempt, workdir_root=None, fingerprint=None, signing_public_key=None):
    """Run one attempt of a job; return its final state, or "dropped".

    fingerprint is the one the worker last reported to the hub (collected when
    None); signing_public_key is the hub's, from `GET device`, to verify engines.
    """
    try:
        job = {**client.claim(job_id, attempt), "id": job_id, "attempt": attempt}
    except HubError as error:
        if not _is_lost(error):
            raise
        logger.info("job %s attempt %s not claimed, message dropped: %s", job_id, attempt, error)
        return DROPPED
    return JobRun(client, job, fingerprint, signing_public_key).run(workdir_root)


def run_claimed_job(client, job, workdir_root=None, fingerprint=None, signing_public_key=None):
    """Run a job the hub has already claimed for this device (HTTPS mode: POST device/work
    answers with it); return its final state."""
    return JobRun(client, job, fingerprint, signing_public_key).run(workdir_root)


class JobLog:
    """Timestamped log lines of a job, remembering which ones the hub has."""

    def __init__(self, job_id):
        self.job_id = job_id
        self._lines = []
        self._sent = 0
        self._lock = threading.Lock()

    def add(self, message):
        """Add a line, stamped with the current UTC time."""
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        logger.info("job %s: %s", self.job_id, message)
        with self._lock:
            self._lines.append(f"{stamp} {message}\n")

    def unsent(self):
        """Return (text of the lines the hub does not have yet, mark for mark_sent)."""
        with self._lock:
            return "".join(self._lines[self._sent :]), len(self._lines)

    def mark_sent(self, mark):
        """Record that the hub received the lines up to mark."""
        with self._lock:
            self._sent = max(self._sent, mark)


class JobProgress:
    """The latest progress of a job, written by the work and read by the heartbeat."""

    def __init__(self, log):
        self.log = log
        self.fraction = 0.0
        self.message = "starting"

    def update(self, fraction, message):
        """Record progress; log the message when it changes (a new phase)."""
        if message != self.message:
            self.log.add(message)
        self.fraction, self.message = round(fraction, 4), message


class JobHeartbeat:
    """Heartbeat a running job from a thread, watching for cancel and loss, until the hub has
    its completion: a completion retried without them would outlive the lease (issue 27)."""

    def __init__(self, client, job, progress, log):
        self.client = client
        self.job_id, self.attempt = job["id"], job["attempt"]
        self.interval = (job.get("lease_seconds") or DEFAULT_LEASE_SECONDS) / 3
        self.progress, self.log = progress, log
        self.cancel = threading.Event()
        self.lost = False
        self.work_done = False
        self._beating = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"job-{self.job_id}-heartbeat", daemon=True
        )

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stopped.set()
        self._thread.join()

    def _loop(self):
        """Beat every interval, sooner when progress moved, until stopped or lost."""
        last_beat, last_sent = time.monotonic(), None
        while not self._stopped.wait(min(self.interval, PROGRESS_INTERVAL)) and not self.lost:
            state = (self.progress.fraction, self.progress.message)
            due = time.monotonic() - last_beat >= self.interval
            if due or state != last_sent:
                self.beat()
                last_beat, last_sent = time.monotonic(), state

    def beat(self):
        """Send one heartbeat; set cancel on cancel_requested, lost on a 409. Once the work is
        done, a beat only extends the lease: the completion carries the log."""
        with self._beating:
            if self.work_done:
                self._send()
                return
            text, mark = self.log.unsent()
            fields = {"progress": self.progress.fraction, "message": self.progress.message}
            answer = self._send(**fields, log=text or None)
            if answer is None:
                return
            self.log.mark_sent(mark)
            if answer.get("cancel_requested") and not self.cancel.is_set():
                self.log.add("cancel requested by the hub")
                self.cancel.set()

    def finish_work(self):
        """Beat on only to keep the lease while the completion is sent; a beat sending log
        lines finishes first, so that no line reaches the hub twice."""
        with self._beating:
            self.work_done = True

    def _send(self, **fields):
        """Send a heartbeat; return the hub's answer, or None when it failed."""
        try:
            return self.client.job_heartbeat(self.job_id, self.attempt, **fields)
        except Exception as error:
            self._failed(error)
            return None

    def _failed(self, error):
        """Stop the work when the hub gave the job away, or refuses this device's token (it was
        revoked, or enrolled again elsewhere: the job went back on the queue); otherwise retry
        next beat."""
        refused = isinstance(error, HubError) and error.status == 401
        if isinstance(error, HubError) and (_is_lost(error) or refused):
            logger.info("job %s attempt %s lost: %s", self.job_id, self.attempt, error)
            self.lost = True
            self.cancel.set()
        else:
            logger.warning("job %s heartbeat failed, will retry: %s", self.job_id, error)


class JobRun:
    """One claimed attempt of a job, from download to completion."""

    def __init__(self, client, job, fingerprint=None, signing_public_key=None):
        self.client = client
        self.job = job
        self.fingerprint = fingerprint
        self.signing_public_key = signing_public_key
        self.log = JobLog(job["id"])
        self.progress = JobProgress(self.log)
        self.heartbeat = JobHeartbeat(client, job, self.progress, self.log)
        self.workdir = None

    def run(self, workdir_root=None):
        """Do the work and report it, heartbeating until the hub has the completion; return
        the final state or "dropped"."""
        self.log.add(f"claimed job {self.job['id']} attempt {self.job['attempt']}")
        with self.heartbeat:
            outcome = self._work(workdir_root)
            if self.heartbeat.lost:
                return DROPPED
            self.heartbeat.finish_work()
            return self._complete(**outcome)

    def _work(self, workdir_root):
        """Run the job's kind; return the completion fields."""
        try:
            work = _work_for(self.job["kind"])
            _check_before_download(self)
            with scratch_dir(self.job["id"], workdir_root) as workdir:
                self.workdir = workdir
                inputs = self._download_inputs(workdir)
                return {"state": "succeeded", "result": work(self, inputs)}
        except Cancelled:
            self.log.add("stopped: the job moved on" if self.heartbeat.lost else "cancelled")
            return {"state": "cancelled"}
        except Exception as error:
            self.log.add(f"failed: {_one_line(error)}")
            return {
                "state": "failed",
                "error": _one_line(error),
                "failure_category": getattr(error, "category", None),
                "trace": _trace(error),
            }

    def _download_inputs(self, workdir):
        """Download every input of the job into workdir; return {name: path}."""
        paths = {}
        for name, info in (self.job.get("inputs") or {}).items():
            if not _is_plain_name(name):
                raise JobError(f"the hub named an input {name!r}; expected a plain name")
            self.log.add(f"downloading input {name} ({info['size']} bytes)")
            filename = info.get("filename")
            dest = workdir / name / (filename if _is_plain_name(filename) else name)
            dest.parent.mkdir(parents=True)
            download = self._download_engine if is_engine_input(name) else self._download_file
            paths[name] = download(name, info, dest)
            self.log.add(f"input {name} verified (sha256 {info['sha256'][:12]}...)")
        return paths

    def _download_file(self, name, info, dest):
        """Download a job input to dest, checking its size and sha256."""
        args = (self.job["id"], name, dest, info["sha256"], info["size"])
        return patiently(self.client.download_input, *args)

    def _download_engine(self, name, info, dest):
        """Download an engine and check size, sha256 and the hub's signature before any load."""
        if not self.signing_public_key:
            raise JobError(
                "the hub sent no signing_public_key in GET device, so this worker cannot "
                "verify engines and will not load one: upgrade the hub"
            )
        args = (info["id"], dest, info["sha256"], info["size"], name)
        path = patiently(self.client.download_engine, *args)
        try:
            signing.verify(info["sha256"], info.get("signature") or "", self.signing_public_key)
        except signing.TamperedEngine:
            path.unlink(missing_ok=True)
            raise
        self.log.add(f"engine {info['id']} signature verified")
        return path

    def upload(self, name, path):
        """Upload a file the job produced as artifact `name`; return its sha256."""
        if self.should_stop():
            raise Cancelled(f"stopped before uploading {name}")
        sha256 = _file_sha256(path)
        self.log.add(f"uploading artifact {name} ({Path(path).stat().st_size} bytes)")
        stored = patiently(
            self.client.upload_artifact, self.job["id"], self.job["attempt"], name, path
        )
        if stored.get("sha256", sha256) != sha256:
            raise JobError(f"the hub stored artifact {name} with another sha256 than the worker's")
        self.log.add(f"artifact {name} uploaded (sha256 {sha256[:12]}...)")
        return sha256

    def _complete(self, state, result=None, error=None, trace=None, failure_category=None):
        """Report the final state with the remaining log lines; return the state."""
        text, mark = self.log.unsent()
        log = text + (trace or "")
        try:
            patiently(
                self.client.complete,
                self.job["id"],
                self.job["attempt"],
                state,
                result=result,
                error=error,
                log=log,
                failure_category=failure_category,
            )
        except HubError as refused:
            if not _is_lost(refused):
                raise
            logger.info("job %s completion refused, dropping: %s", self.job["id"], refused)
            return DROPPED
        self.log.mark_sent(mark)
        logger.info("job %s attempt %s %s", self.job["id"], self.job["attempt"], state)
        return state

    def report(self, fraction, message):
        """Record progress for the next heartbeat."""
        self.progress.update(fraction, message)

    def should_stop(self):
        """Return True once the hub asked to cancel or gave the job away."""
        return self.heartbeat.cancel.is_set()

    def current_fingerprint(self):
        """Return the fingerprint the worker reports to the hub (override applied)."""
        return self.fingerprint or fingerprints.collect()

    def model_io(self):
        """Return what the job's model version takes and gives (its signature and input-shape
        contract, docs/protocol.md), or None: feeds then follow the loaded model's inputs."""
        return self.job.get("model_io") or None


def _harness_runs(engine):
    """True when the harness runs this engine in its own ONNX Runtime session (an ONNX file)."""
    backend = known.BACKENDS.get(engine.get("backend"))
    return backend is not None and backend.harness_runs_engine


def run_benchmark(job_run, inputs):
    """Benchmark the job's model or engine input; return the protocol's benchmark result."""
    engine = job_run.job["inputs"].get(ENGINE_INPUT)
    if engine is not None and not _harness_runs(engine):
        result = _benchmark_loaded_engine(job_run, inputs, engine)
    else:
        model, params, preoptimized = _benchmark_subject(job_run, inputs)
        result = benchmark_onnxruntime(
            model,
            params,
            progress=job_run.report,
            should_stop=job_run.should_stop,
            preoptimized=preoptimized,
            model_io=job_run.model_io(),
        )
    _log_benchmark(job_run.log, result)
    result["fingerprint"] = job_run.current_fingerprint()
    return result


class LoadedEngine:
    """Another backend's engine, run by the benchmark harness like an ONNX Runtime session."""

    def __init__(self, backend, handle, input_metas):
        self.backend, self.handle, self.input_metas = backend, handle, input_metas
        # Tells the harness to read the GPU's state (NVML) and device memory around the run.
        self.on_cuda = backend.needs_gpu or getattr(handle, "device", None) == "cuda"

    def run(self, _output_names, feeds):
        return self.backend.infer(self.handle, feeds)

    def get_inputs(self):
        return self.input_metas

    def get_providers(self):
        return [self.backend.name]


def load_engine(job_run, inputs, engine, path=None):
    """Load an engine (the input `engine`, or path) with its backend; input names and
    shapes come from the source model."""
    import onnxruntime

    if "model" not in inputs:
        raise JobError(f"a {engine['backend']} engine job needs the source model as input 'model'")
    if inputs["model"].suffix == ".pt2":  # a torch.export program (AOTInductor's source)
        from workers.backends.torch_aoti import input_metas_from_pt2

        metas = input_metas_from_pt2(inputs["model"])
    else:
        source = onnx_model_path(inputs["model"], job_run.workdir / "source")
        session = onnxruntime.InferenceSession(str(source), providers=["CPUExecutionProvider"])
        metas = session.get_inputs()
    backend = known.require(engine["backend"])()
    handle = backend.load(path or inputs[ENGINE_INPUT], engine.get("build_config") or {})
    job_run.log.add(f"{backend.name} engine loaded ({getattr(handle, 'source', 'engine')})")
    return LoadedEngine(backend, handle, metas)


def _benchmark_loaded_engine(job_run, inputs, engine):
    params = job_run.job.get("params") or {}
    return benchmark_session(
        lambda settings: load_engine(job_run, inputs, engine),
        params,
        progress=job_run.report,
        should_stop=job_run.should_stop,
        model_io=job_run.model_io(),
    )


def check_benchmark(job_run):
    """Refuse, before downloading, an engine this worker cannot run."""
    for name, engine in (job_run.job.get("inputs") or {}).items():
        if is_engine_input(name):
            known.require(engine.get("backend"))


def is_engine_input(name):
    """Return True for an input that carries an engine: `engine`, or `engine-<id>` of a compare
    job (docs/protocol.md)."""
    return name == ENGINE_INPUT or name.startswith(f"{ENGINE_INPUT}-")


def run_compare(job_run, inputs):
    """Time the job's engines side by side in this process; return the protocol's result."""
    params = job_run.job.get("params") or {}
    described = job_run.job["inputs"]
    loaders = {}
    for engine_id in params.get("engines") or ():
        name = f"{ENGINE_INPUT}-{engine_id}"
        if name not in inputs:
            raise JobError(f"the compare job lists engine {engine_id} but has no input {name}")
        loaders[str(engine_id)] = partial(
            _compared_engine, job_run, inputs, described[name], inputs[name], params
        )
    result = side_by_side.compare(
        loaders,
        params,
        progress=job_run.report,
        should_stop=job_run.should_stop,
        model_io=job_run.model_io(),
    )
    for figures in result["engines"]:
        job_run.log.add(
            f"engine {figures['engine']}: best round median {figures['best_round_ms']:.4f} ms, "
            f"median of rounds {figures['median_round_ms']:.4f} ms"
        )
    verdict = "tied with" if result["tied"] else f"{result['lead']:.3f}x faster than"
    job_run.log.add(f"fastest: engine {result['fastest']}, {verdict} the next")
    result["fingerprint"] = job_run.current_fingerprint()
    return result


def _compared_engine(job_run, inputs, engine, path, params):
    """Load one engine of a compare job as the benchmark harness runs it."""
    if not _harness_runs(engine):
        return load_engine(job_run, inputs, engine, path)
    provider = provider_of(engine.get("build_config"))
    settings = read_settings({"provider": provider, "seed": params.get("seed")})
    return create_session(engine_model_path(path), settings, preoptimized=True)


def evaluation_summary(result):
    """Say what an evaluation found in one line: the task's agreement with the source, then
    its labelled headline when the dataset had labels."""
    key = result["agreement_metric"]
    agreement = result["agreement"].get(key)
    shown = "not measured" if agreement is None else f"{agreement:.4f}"
    line = f"evaluated {result['samples']} samples as {result['task']}: {key} {shown}"
    metric = result.get("metric")
    engine, reference = (result.get("engine") or {}), (result.get("reference") or {})
    if metric and engine.get(metric) is not None:
        line += f", {metric} {engine[metric]:.4f} (FP32 source {reference[metric]:.4f})"
    return (
        f"{line}, max abs error {result['max_abs_error']:.3g}, "
        f"cosine min {result['cosine_min']:.5f}"
    )


def run_evaluate(job_run, inputs):
    """Compare the job's engine with its FP32 source on a dataset, on golden pairs, or both."""
    engine = job_run.job["inputs"].get(ENGINE_INPUT)
    if engine is None or "model" not in inputs or not {"dataset", GOLDEN_INPUT} & inputs.keys():
        raise JobError(
            "an evaluate job needs the inputs 'engine' and 'model', and 'dataset', 'golden' or both"
        )
    run_engine = _evaluated_engine(job_run, inputs, engine)
    source = inputs["model"]
    if source.suffix != ".pt2":
        source = onnx_model_path(source, job_run.workdir / "reference")
    params = job_run.job.get("params") or {}
    watch = {
        "progress": job_run.report,
        "should_stop": job_run.should_stop,
        "model_io": job_run.model_io(),
    }
    result = {}
    if "dataset" in inputs:
        result = evaluate(run_engine, source, inputs["dataset"], params, **watch)
        job_run.log.add(evaluation_summary(result))
    if GOLDEN_INPUT in inputs:
        golden_params = params.get("golden") or {}
        result["golden"] = golden.evaluate_golden(
            run_engine, source, inputs[GOLDEN_INPUT], golden_params, **watch
        )
        job_run.log.add(golden.summary(result["golden"]))
    return {
        **result,
        "backend": engine.get("backend"),
        "fingerprint": job_run.current_fingerprint(),
    }


def _evaluated_engine(job_run, inputs, engine):
    """Return run(feeds) -> outputs of the job's engine, loaded by its backend."""
    if not _harness_runs(engine):
        loaded = load_engine(job_run, inputs, engine)
        return lambda feeds: loaded.run(None, feeds)
    import onnxruntime

    path = engine_model_path(inputs[ENGINE_INPUT])
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    providers = [provider_of(engine.get("build_config"))]
    session = onnxruntime.InferenceSession(str(path), options, providers=providers)
    return lambda feeds: session.run(None, feeds)


def _benchmark_subject(job_run, inputs):
    """Return (ONNX file, params, whether it is an optimised engine) for a benchmark."""
    params = job_run.job.get("params") or {}
    if ENGINE_INPUT in inputs:
        engine = job_run.job["inputs"][ENGINE_INPUT]
        params = _engine_benchmark_params(params, engine)
        return engine_model_path(inputs[ENGINE_INPUT]), params, True
    if "model" in inputs:
        return onnx_model_path(inputs["model"], job_run.workdir / "model"), params, False
    raise JobError("a benchmark job needs an input named 'model' or 'engine'")


def _engine_benchmark_params(params, engine):
    """Return the benchmark params for an onnxruntime engine: its provider, no other."""
    provider = provider_of(engine.get("build_config"))
    asked = params.get("provider", provider)
    if asked != provider:
        raise JobError(f"the engine was built for {provider}; benchmark it there, not on {asked}")
    return {**params, "provider": provider}


def _log_benchmark(log, result):
    """Log a benchmark's headline figures, and why they may not be trusted."""
    latency = result["latency_ms"]
    log.add(
        f"benchmark done: p50 {latency['p50']:.3f} ms, p99 {latency['p99']:.3f} ms, "
        f"{result['throughput_ips']:.1f} inferences/s over {result['iterations']} runs"
    )
    for reason in result["stability"]["reasons"]:
        log.add(f"unstable: {reason}")
    server = result.get("server")
    if server and server["max_qps_in_budget"] is not None:
        best, budget = server["max_qps_in_budget"], server["budget_ms"]
        log.add(f"server: p99 within {budget:g} ms up to {best:.1f} queries/s")


def run_compile(job_run, inputs):
    """Compile the model with the job's backend, upload the engine; return the compile result."""
    if "model" not in inputs:
        raise JobError("a compile job needs an input named 'model' (the ONNX model)")
    params = job_run.job.get("params") or {}
    backend = known.require(params.get("backend"))
    build_config = backend.canonical_config(_build_config(params))
    fingerprint = job_run.current_fingerprint()
    source = onnx_model_path(inputs["model"], job_run.workdir / "model")
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
    """Load the built artifact and run it once on synthetic inputs (workers/feeds.py) in a
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


def check_compile(job_run):
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


def onnx_model_path(path, folder):
    """Return the ONNX file to load: the input itself, or the one inside an uploaded zip.

    An ONNX model with external data arrives as the zip it was uploaded in. The hub
    validated that zip member by member, and the download matched its sha256.
    """
    if path.suffix != ".zip":
        return path
    with zipfile.ZipFile(path) as archive:
        archive.extractall(folder)
    models = sorted(folder.rglob("*.onnx"))
    if len(models) != 1:
        raise JobError(f"the model zip should hold one .onnx file, it holds {len(models)}")
    return models[0]


def run_export(job_run, inputs):
    """Export the job's .pt2 input to ONNX (or convert an ONNX input's opset), upload it.

    Return the protocol's export result.
    """
    if "model" not in inputs:
        raise JobError("an export job needs an input named 'model' (the .pt2 program)")
    params = job_run.job.get("params") or {}
    onnx_path = job_run.workdir / "export" / f"{inputs['model'].stem}.onnx"
    onnx_path.parent.mkdir()
    if "convert_to_opset" in params:  # an ONNX version converted to another opset
        result = convert_onnx(inputs["model"], onnx_path, params, progress=job_run.report)
        job_run.log.add(conversion_line(result))
        sha256 = job_run.upload(EXPORT_ARTIFACT, onnx_path)
        return {**result, "artifact": EXPORT_ARTIFACT, "artifact_sha256": sha256}
    result = export_pt2_to_onnx(inputs["model"], onnx_path, params, progress=job_run.report)
    job_run.log.add(
        f"exported to ONNX opset {result['opset']} ({result['onnx_bytes']} bytes); "
        f"largest difference from PyTorch over {result['samples']} samples: "
        f"{result['max_abs_diff']:.3g} absolute, {result['max_rel_diff']:.3g} relative"
    )
    sha256 = job_run.upload(EXPORT_ARTIFACT, onnx_path)
    return {**result, "artifact": EXPORT_ARTIFACT, "artifact_sha256": sha256}


def run_parity(job_run, inputs):
    """Check the job's parity pack against its spec; return the protocol's parity result."""
    if PARITY_INPUT not in inputs:
        raise JobError(f"a parity job needs an input named {PARITY_INPUT!r} (the parity pack)")
    result = check_parity(
        inputs[PARITY_INPUT],
        job_run.job.get("params") or {},
        job_run.workdir / "parity",
        progress=job_run.report,
        should_stop=job_run.should_stop,
    )
    job_run.log.add(result["summary"])
    return result


def run_noop(job_run, inputs):
    """Do nothing: a noop job measures the hub-broker-worker pipeline itself."""
    return {}


# What this worker can run, by job kind: fn(job_run, inputs) -> result.
KINDS = {
    kinds.BENCHMARK: run_benchmark,
    kinds.COMPARE: run_compare,
    kinds.COMPILE: run_compile,
    kinds.EVALUATE: run_evaluate,
    kinds.EXPORT: run_export,
    kinds.NOOP: run_noop,
    kinds.PARITY: run_parity,
}
# Checks a job passes before its inputs are downloaded, by kind: fn(job_run), raising JobError.
CHECKS = {
    kinds.BENCHMARK: check_benchmark,
    kinds.COMPARE: check_benchmark,
    kinds.COMPILE: check_compile,
    kinds.EVALUATE: check_benchmark,
}


def _work_for(kind):
    """Return the function running jobs of this kind, or raise naming the kind."""
    if kind not in KINDS:
        raise JobError(f"this worker cannot run jobs of kind {kind!r}")
    return KINDS[kind]


def _check_before_download(job_run):
    """Run the job kind's check, so a job that cannot run here fails before any download."""
    check = CHECKS.get(job_run.job["kind"])
    if check is not None:
        check(job_run)


def _is_lost(error):
    """Return True when the hub's answer means the job is no longer ours."""
    return isinstance(error, Conflict) or error.status == 403


def patiently(call, *args, **kwargs):
    """Call the hub, retrying for HUB_PATIENCE_SECONDS while it is unavailable (503, down) or
    throttles this address (429)."""
    deadline = time.monotonic() + HUB_PATIENCE_SECONDS
    while True:
        try:
            return call(*args, **kwargs)
        except HubError as error:
            unavailable = isinstance(error, HubUnreachable) or error.status in RETRY_STATUSES
            if not unavailable or time.monotonic() > deadline:
                raise
            logger.warning("the hub is unavailable, trying again: %s", error)
        time.sleep(HUB_RETRY_PAUSE_SECONDS)


def _file_sha256(path):
    """Return the sha256 hex digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_plain_name(name):
    """Return True for a file name without folders, safe to join to a path."""
    return bool(name) and Path(name).name == name and name not in (".", "..")


def _trace(error):
    """Return what the log gets for a failure: the child's log for a compile failure."""
    if isinstance(error, CompileFailure):
        return f"--- log of the child process ---\n{error.log}"
    return traceback.format_exc()


def _one_line(error):
    """Return an error as one line, its lines joined; name its type unless it is a JobError."""
    text = one_line(error)
    if not isinstance(error, JobError):
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text[:ERROR_MAX_CHARS]
