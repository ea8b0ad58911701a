"""Measure a model's latency, throughput and memory, and say whether the figures can be trusted.

Every benchmark warms up, then measures one query at a time, back to back
(MLPerf's single-stream scenario): that run gives latency_ms, cv, stability and
throughput_ips. The server and offline scenarios, a batch-size sweep and, on a
GPU, compute time without host copies are measured after it on the same
session. The result has the shape of "Benchmark result" in docs/protocol.md.
"""

import math
import os
import re
import threading
import time
from dataclasses import dataclass, replace
from functools import cache, partial
from pathlib import Path

import psutil

from workers import fingerprint as fingerprints
from workers.errors import Cancelled, JobError
from workers.measure import feeds as model_feeds
from workers.measure import gpu_timing, server_scenario
from workers.measure.latency import (
    DEFAULT_CV_THRESHOLD,
    DEFAULT_DRIFT_THRESHOLD,
    DEFAULT_FLOOR_MS,
    coefficient_of_variation,
    compact_samples,
    latency_summary,
    stability,
)

BYTES_PER_MB = 2**20
RSS_SAMPLE_SECONDS = 0.005
PROC_CLEAR_REFS = Path("/proc/self/clear_refs")
PROC_STATUS = Path("/proc/self/status")
# Progress is reported (and should_stop checked) between chunks of runs: about this many
# chunks per phase, none longer than MAX_CHUNK_NS, so a cancel is seen within ~0.1 s.
PROGRESS_STEPS = 50
MAX_CHUNK_NS = 100_000_000
# A duration-bound measurement runs at least this many times, whatever its duration.
MIN_ITERATIONS = 10
# Each size of a batch sweep warms up for this share of sweep_duration_s (and 3 runs).
SWEEP_WARMUP_SHARE, SWEEP_WARMUP_RUNS = 0.2, 3
# Without target_qps the server scenario offers half the single-stream capacity.
DEFAULT_LOAD = 0.5
SCENARIOS = ("single-stream", "server", "offline")
MAX_SWEEP_SIZES = 16


@dataclass(frozen=True)
class Settings:
    """The conditions a benchmark runs under, read from the job's params (None: not given).

    batch_size None: the model's default batch (workers/measure/feeds.py: 1 when allowed).
    """

    batch_size: int | None = None
    warmup_s: float = 1.0
    duration_s: float = 3.0
    warmup_iterations: int | None = None
    iterations: int | None = None
    max_iterations: int = 100_000
    intra_op_threads: int = 0
    seed: int = 0
    provider: str = "CPUExecutionProvider"
    scenario: str = "single-stream"
    target_qps: float | None = None
    budget_ms: float | None = None
    search_s: float = 10.0
    samples: int | None = None
    batch_sizes: tuple | None = None
    sweep_duration_s: float = 1.0
    cv_threshold: float = DEFAULT_CV_THRESHOLD
    drift_threshold: float = DEFAULT_DRIFT_THRESHOLD
    stability_floor_ms: float = DEFAULT_FLOOR_MS
    cuda_graphs: bool = False


# How each numeric param is read: (type, smallest value, whether the smallest is allowed).
NUMBERS = {
    "batch_size": (int, 1, True),
    "warmup_s": (float, 0, True),
    "duration_s": (float, 0, False),
    "warmup_iterations": (int, 0, True),
    "iterations": (int, 1, True),
    "max_iterations": (int, 1, True),
    "intra_op_threads": (int, 0, True),
    "seed": (int, 0, True),
    "target_qps": (float, 0, False),
    "budget_ms": (float, 0, False),
    "search_s": (float, 0, False),
    "samples": (int, 1, True),
    "sweep_duration_s": (float, 0, False),
    "cv_threshold": (float, 0, False),
    "drift_threshold": (float, 0, False),
    "stability_floor_ms": (float, 0, True),
}
# Params that mean something in one scenario only: given with another, the job fails.
SCENARIO_PARAMS = {"target_qps": "server", "budget_ms": "server", "samples": "offline"}


@dataclass(frozen=True)
class Goal:
    """When a timed phase ends: after `iterations` runs, or after `seconds` (bounded runs)."""

    iterations: int | None = None
    seconds: float = 0.0
    min_iterations: int = 0
    max_iterations: int = 100_000

    def next_chunk(self, done, elapsed_ns):
        """Return how many runs the next chunk has; 0 when the phase is over."""
        left = self._left(done, elapsed_ns)
        if left <= 0 or done == 0:  # the first run alone: it tells how long one takes
            return max(0, min(left, 1))
        per_run = elapsed_ns / done
        if self.iterations is not None:
            size = min(max(1, self.iterations // PROGRESS_STEPS), int(MAX_CHUNK_NS / per_run))
        else:
            remaining = self.seconds * 1e9 - elapsed_ns
            size = int(min(MAX_CHUNK_NS, self.seconds * 1e9 / PROGRESS_STEPS, remaining) / per_run)
        return max(1, min(left, size))

    def _left(self, done, elapsed_ns):
        """Return how many more runs the phase may take."""
        if self.iterations is not None:
            return self.iterations - done
        if elapsed_ns < self.seconds * 1e9:
            return self.max_iterations - done
        return min(self.max_iterations, self.min_iterations) - done

    def fraction(self, done, elapsed_ns):
        """Return how far through the phase it is, 0..1."""
        if self.iterations is not None:
            return done / self.iterations if self.iterations else 1.0
        return min(1.0, elapsed_ns / (self.seconds * 1e9)) if self.seconds else 1.0


class Progress:
    """Map each phase's own 0..1 progress onto its share of the whole benchmark."""

    def __init__(self, report, weights):
        total = sum(weights.values()) or 1.0
        self.report, self.spans, start = report, {}, 0.0
        for phase, weight in weights.items():
            self.spans[phase] = (start / total, (start + weight) / total)
            start += weight

    def phase(self, phase, message, part=0, parts=1):
        """Report the start of (a part of) a phase; return its fraction -> report callback."""
        self.at(phase, part / parts, message)
        return lambda fraction: self.at(phase, (part + min(1.0, fraction)) / parts, message)

    def at(self, phase, fraction, message):
        """Report being `fraction` (0..1) through a phase."""
        start, end = self.spans[phase]
        self.report(start + min(1.0, fraction) * (end - start), message)


@dataclass
class Bench:
    """One benchmark under way: what it runs, under which settings, and whom it tells."""

    session: object
    settings: Settings
    progress: Progress
    should_stop: object
    model_io: object
    feeds: dict

    def call(self, feeds=None):
        """Return a zero-argument call running the session once on feeds (default: the batch)."""
        return partial(self.session.run, None, self.feeds if feeds is None else feeds)

    def timed(self, call, goal, phase, message, part=0, parts=1):
        """Time call() until the goal in a phase; return (samples ns, wall s)."""
        report = self.progress.phase(phase, message, part, parts)
        return measure(call, goal, report, self.should_stop)


def benchmark_onnxruntime(
    model_path, params, progress=None, should_stop=None, preoptimized=False, model_io=None
):
    """Benchmark an ONNX model with ONNX Runtime and return the result dict.

    progress(fraction, message) is called at phase changes and between chunks of
    runs; should_stop() is checked between chunks and makes the benchmark raise
    Cancelled when it returns True. A preoptimized model (an onnxruntime engine)
    is loaded with graph optimisations off: it had them. model_io (the job's)
    says what to feed; without it, the session's inputs do.
    """
    return benchmark_session(
        lambda settings: create_session(model_path, settings, preoptimized),
        params,
        progress,
        should_stop,
        make_graph_session=lambda settings: create_session(
            model_path, settings, preoptimized, cuda_graphs=True
        ),
        model_io=model_io,
    )


def benchmark_session(
    make_session, params, progress=None, should_stop=None, make_graph_session=None, model_io=None
):
    """Benchmark whatever make_session(settings) loads: anything with ONNX Runtime's
    run(None, feeds), get_inputs() and get_providers() (another backend's engine too).

    make_graph_session(settings), for an ONNX Runtime model, loads it again with
    CUDA graphs on (the cuda_graphs param). Feeds are made by workers/measure/feeds.py from
    model_io, or from the session's inputs without it.
    """
    settings = read_settings(params)
    plan = Progress(progress or _ignore_progress, phase_weights(settings))
    plan.phase("load", "loading model")
    gpu = gpu_timing.GpuMonitor()
    try:
        with PeakRss() as rss:
            session = make_session(settings)
            provider = session.get_providers()[0]
            bench = _prepare(session, settings, plan, should_stop or _never, model_io)
            on_gpu = gpu.begin(session, provider)
            _check_gpu_options(settings, on_gpu, session, make_graph_session)
            measured = _run_scenarios(bench, on_gpu, make_graph_session)
            measured["gpu"] = (
                gpu.result(measured["latency"], measured["compute"], settings.cuda_graphs)
                if on_gpu
                else None
            )
    finally:
        gpu.close()
    plan.report(1.0, "done")
    return _result(bench, provider, measured, rss)


def read_settings(params):
    """Return the benchmark Settings from a job's params, checking their types and ranges."""
    params = {name: value for name, value in (params or {}).items() if value is not None}
    values = {name: _number(name, params[name]) for name in NUMBERS if name in params}
    for name in ("provider", "scenario"):
        if name in params:
            values[name] = str(params[name])
    if "batch_sizes" in params:
        values["batch_sizes"] = _batch_sizes(params["batch_sizes"])
    if "cuda_graphs" in params:
        values["cuda_graphs"] = _flag("cuda_graphs", params["cuda_graphs"])
    settings = Settings(**values)
    _check_scenario(settings, params)
    return settings


def phase_weights(settings):
    """Return each phase's expected share of the benchmark (in about-seconds)."""
    measuring = settings.duration_s
    warmup = settings.warmup_s if settings.warmup_iterations is None else 0.1 * measuring
    on_gpu = settings.provider in gpu_timing.GPU_PROVIDERS  # compute is timed on ORT's only
    weights = {"load": 0.0, "warm-up": warmup, "measuring": measuring}
    weights["gpu"] = warmup + measuring if on_gpu else 0.0
    if settings.batch_sizes:
        weights["sweep"] = len(settings.batch_sizes) * settings.sweep_duration_s * 1.2
    if settings.scenario == "server":
        weights["server"] = measuring
        weights["search"] = settings.search_s if settings.budget_ms else 0.0
    if settings.scenario == "offline":
        weights["offline"] = measuring
    return weights


def measure(call, goal, report, should_stop):
    """Run call() in chunks until the goal; return (each run's duration in ns, wall time in s)."""
    clock = time.perf_counter_ns
    samples, started = [], clock()
    while count := goal.next_chunk(len(samples), clock() - started):
        if should_stop():
            raise Cancelled("the benchmark was stopped")
        samples += timed_runs(call, count)
        report(goal.fraction(len(samples), clock() - started))
    return samples, (clock() - started) / 1e9


def random_inputs(model_io_or_metas, batch_size=None, seed=0):
    """Return random feeds for a model_io or a session's inputs (session.get_inputs())."""
    return model_feeds.synthetic_feeds(model_io_or_metas, batch_size, seed)


def host_info(session, settings):
    """Return the CPU model, logical CPU count and intra-op threads the run used."""
    cpu_model, logical_cpus, physical_cores = _cpu_facts()
    return {
        "cpu_model": cpu_model,
        "logical_cpus": logical_cpus,
        "intra_op_threads": _threads_used(session, settings, physical_cores),
    }


class PeakRss:
    """Measure this process's peak resident memory over a with-block.

    On Linux the kernel keeps the peak itself (VmHWM), which can be reset at
    the start: exact, and free. Elsewhere a background thread samples RSS every
    few milliseconds. The thread costs ~3% of a 1 ms run on a 2-core machine,
    where it competes with ONNX Runtime's threads, hence the kernel first.
    """

    def __init__(self, interval=RSS_SAMPLE_SECONDS):
        self.process = psutil.Process()
        self.interval = interval
        self.baseline = self.peak = 0
        self._sampler = None

    def __enter__(self):
        self.baseline = self.peak = self.process.memory_info().rss
        if not _reset_high_water_mark():
            self._sampler = RssSampler(self.process, self.interval)
            self._sampler.start()
        return self

    def __exit__(self, *exc_info):
        final = self.process.memory_info().rss
        sampled = self._sampler.stop() if self._sampler else _high_water_mark()
        self.peak = max(self.peak, final, sampled or 0)


class RssSampler:
    """Track a process's peak resident memory from a background thread."""

    def __init__(self, process, interval=RSS_SAMPLE_SECONDS):
        self.process = process
        self.interval = interval
        self.peak = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)

    def start(self):
        """Start sampling."""
        self._take()
        self._thread.start()

    def stop(self):
        """Stop sampling and return the peak RSS in bytes, the final value included."""
        self._stopped.set()
        self._thread.join()
        self._take()
        return self.peak

    def _sample(self):
        """Take a sample every interval until stopped."""
        while not self._stopped.wait(self.interval):
            self._take()

    def _take(self):
        """Sample the current RSS into the peak."""
        self.peak = max(self.peak, self.process.memory_info().rss)


def _prepare(session, settings, plan, should_stop, model_io=None):
    """Return the Bench for a loaded session, refusing batch sizes it cannot take up front.

    Without a batch_size param the model's default batch is fed (1 when allowed).
    """
    specs = model_feeds.input_specs(model_io or list(session.get_inputs()))
    for size in settings.batch_sizes or ():
        model_feeds.check_batch(
            specs, size, asked="batch_sizes asks for batch {batch}", to="sweep batch sizes"
        )
    if settings.batch_size is None:
        settings = replace(settings, batch_size=model_feeds.default_batch(specs))
    feeds = model_feeds.synthetic_feeds(specs, settings.batch_size, settings.seed)
    return Bench(session, settings, plan, should_stop, specs, feeds)


def _run_scenarios(bench, on_gpu, make_graph_session):
    """Warm up, measure single-stream, then what the settings add; return the figures by part."""
    settings = bench.settings
    warmup, warmup_s = bench.timed(bench.call(), _warmup_goal(settings), "warm-up", "warm-up")
    samples, duration_s = bench.timed(
        bench.call(), _measure_goal(settings), "measuring", "measuring"
    )
    latency = latency_summary(samples)
    measured = {"warmup": (len(warmup), warmup_s), "samples": samples, "latency": latency}
    measured["duration_s"] = duration_s
    measured["compute"] = _compute_ms(bench, make_graph_session) if on_gpu else None
    measured["batch_sweep"] = _batch_sweep(bench) if settings.batch_sizes else None
    measured["server"] = _server(bench, latency) if settings.scenario == "server" else None
    measured["offline"] = _offline(bench) if settings.scenario == "offline" else None
    return measured


def _warmup_goal(settings):
    """Return the warm-up's goal: warmup_iterations when given, else warmup_s."""
    if settings.warmup_iterations is not None:
        return Goal(iterations=settings.warmup_iterations)
    return Goal(seconds=settings.warmup_s, min_iterations=1 if settings.warmup_s else 0)


def _measure_goal(settings, seconds=None):
    """Return a measurement's goal: iterations when given, else the duration (bounded runs)."""
    if settings.iterations is not None and seconds is None:
        return Goal(iterations=settings.iterations)
    return Goal(
        seconds=settings.duration_s if seconds is None else seconds,
        min_iterations=min(MIN_ITERATIONS, settings.max_iterations),
        max_iterations=settings.max_iterations,
    )


def _compute_ms(bench, make_graph_session):
    """Time the session on inputs bound once on the GPU; return its latency summary or None.

    Only an ONNX Runtime session has IO binding; another backend's engine copies
    its inputs inside infer(), so its compute time cannot be told apart here.
    """
    if not hasattr(bench.session, "io_binding"):
        return None
    outputs = bench.session.run(None, bench.feeds)
    session = make_graph_session(bench.settings) if bench.settings.cuda_graphs else bench.session
    call = gpu_timing.device_call(session, bench.feeds, outputs)
    what = "CUDA graph replays" if bench.settings.cuda_graphs else "compute (IO binding)"
    bench.timed(call, _warmup_goal(bench.settings), "gpu", f"warm-up, {what}", 0, 4)
    samples, _ = bench.timed(call, _measure_goal(bench.settings), "gpu", what, 1, 4)
    return latency_summary(samples)


def _batch_sweep(bench):
    """Measure single-stream at each of the sweep's batch sizes; return a row per size."""
    settings, sizes = bench.settings, bench.settings.batch_sizes
    rows = []
    for part, size in enumerate(sizes):
        call = bench.call(model_feeds.synthetic_feeds(bench.model_io, size, settings.seed))
        warmup = Goal(
            seconds=settings.sweep_duration_s * SWEEP_WARMUP_SHARE,
            min_iterations=SWEEP_WARMUP_RUNS,
            max_iterations=settings.max_iterations,
        )
        bench.timed(call, warmup, "sweep", f"batch {size}, warm-up", 2 * part, 2 * len(sizes))
        goal = _measure_goal(settings, seconds=settings.sweep_duration_s)
        samples, _ = bench.timed(call, goal, "sweep", f"batch {size}", 2 * part + 1, 2 * len(sizes))
        latency = latency_summary(samples)
        rows.append(
            {
                "batch_size": size,
                "latency_ms": latency,
                "throughput_ips": size * 1000 / latency["mean"],
                "cv": coefficient_of_variation(latency),
            }
        )
    return rows


def _server(bench, single_stream):
    """Serve a Poisson load at target_qps and, given budget_ms, search the highest rate in it."""
    settings = bench.settings
    capacity = 1000 / single_stream["mean"]  # queries per second, served one at a time
    target = settings.target_qps or round(capacity * DEFAULT_LOAD, 3)
    report = bench.progress.phase("server", f"server at {target:.4g} qps")
    run = server_scenario.server_run(
        bench.call(),
        target,
        None if settings.iterations else settings.duration_s,
        bench.should_stop,
        report,
        seed=settings.seed,
        queries=settings.iterations,
        max_queries=settings.max_iterations,
    )
    best, tried = None, []
    if settings.budget_ms:
        best, tried = _search(bench, capacity * DEFAULT_LOAD)
        best = server_scenario.best_in_budget(
            best, target, run["latency_ms"]["p99"], settings.budget_ms
        )
    return {
        "target_qps": target,
        "achieved_qps": run["achieved_qps"],
        "latency_ms": run["latency_ms"],
        "budget_ms": settings.budget_ms,
        "max_qps_in_budget": best,
        "tried": tried,
    }


def _search(bench, start_qps):
    """Return (highest rate whose p99 met budget_ms, rates tried), within search_s."""
    settings, call = bench.settings, bench.call()
    started = time.monotonic()
    budget = f"{settings.budget_ms:g} ms"

    def try_rate(qps):
        spent = time.monotonic() - started
        seconds = server_scenario.trial_seconds(qps, settings.search_s - spent)
        message = f"server at {qps:.4g} qps (p99 within {budget}?)"
        return server_scenario.server_run(
            call,
            round(qps, 3),
            seconds,
            bench.should_stop,
            lambda fraction: bench.progress.at(
                "search", (spent + fraction * seconds) / settings.search_s, message
            ),
            seed=settings.seed,
            max_queries=settings.max_iterations,
        )

    return server_scenario.search_max_qps(
        try_rate, settings.budget_ms, start_qps, settings.search_s
    )


def _offline(bench):
    """Run every sample in batches, back to back; return the samples, wall time and throughput."""
    settings = bench.settings
    if settings.samples is not None:
        goal = Goal(iterations=math.ceil(settings.samples / settings.batch_size))
    else:
        goal = _measure_goal(settings, seconds=settings.duration_s)
    runs, wall_s = bench.timed(bench.call(), goal, "offline", "offline")
    samples = len(runs) * settings.batch_size
    return {"samples": samples, "wall_s": wall_s, "throughput_ips": samples / wall_s}


def _check_gpu_options(settings, on_gpu, session, make_graph_session):
    """Refuse cuda_graphs where they cannot run: off the GPU, or for another backend's engine."""
    if settings.cuda_graphs and not (
        on_gpu and hasattr(session, "io_binding") and make_graph_session
    ):
        raise JobError(
            "cuda_graphs needs an ONNX Runtime model or engine on CUDAExecutionProvider or "
            f"TensorrtExecutionProvider; this benchmark runs on {session.get_providers()[0]}"
        )


def create_session(model_path, settings, preoptimized=False, cuda_graphs=False):
    """Create an ONNX Runtime session with the requested threads and provider."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    if preoptimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    providers = [gpu_timing.provider_entry(settings.provider, cuda_graphs)]
    return ort.InferenceSession(str(model_path), options, providers=providers)


def timed_runs(call, count):
    """Time `count` runs back to back; this loop is what the benchmark measures."""
    clock = time.perf_counter_ns
    samples = [0] * count
    for index in range(count):
        started = clock()
        call()
        samples[index] = clock() - started
    return samples


def _result(bench, provider, measured, rss):
    """Return the benchmark result in the protocol's field order."""
    settings, samples, latency = bench.settings, measured["samples"], measured["latency"]
    verdict = stability(
        samples,
        settings.cv_threshold,
        settings.drift_threshold,
        latency,
        floor_ms=settings.stability_floor_ms,
    )
    warmup_iterations, warmup_s = measured["warmup"]
    return {
        "backend": _backend_name(bench.session),
        "provider": provider,
        "batch_size": settings.batch_size,
        "intra_op_threads": settings.intra_op_threads,
        "scenario": settings.scenario,
        "warmup_iterations": warmup_iterations,
        "warmup_s": warmup_s,
        "iterations": len(samples),
        "duration_s": measured["duration_s"],
        "latency_ms": latency,
        "latency_samples": compact_samples(samples),
        "cv": verdict["cv"],
        "stability": verdict,
        "throughput_ips": settings.batch_size * 1000 / latency["mean"],
        "server": measured["server"],
        "offline": measured["offline"],
        "batch_sweep": measured["batch_sweep"],
        "peak_rss_mb": rss.peak / BYTES_PER_MB,
        "rss_growth_mb": (rss.peak - rss.baseline) / BYTES_PER_MB,
        "host": host_info(bench.session, settings),
        "gpu": measured["gpu"],
    }


def _backend_name(session):
    """Return the backend that ran: another backend's engine names itself, else onnxruntime."""
    backend = getattr(session, "backend", None)
    return getattr(backend, "name", None) or "onnxruntime"


@cache
def _cpu_facts():
    """Return this host's CPU model, logical CPU count and physical core count (read once)."""
    logical = os.cpu_count()
    return fingerprints._cpu()["model"], logical, psutil.cpu_count(logical=False) or logical


def _threads_used(session, settings, physical_cores):
    """Return the intra-op threads: the param, else ONNX Runtime's default (one per core)."""
    if settings.intra_op_threads:
        return settings.intra_op_threads
    if hasattr(session, "get_session_options"):  # an ONNX Runtime session
        return physical_cores
    return None  # another backend's engine picks its own


def _number(name, value):
    """Return a numeric param converted and range-checked, or raise JobError naming it."""
    return read_number(name, value, NUMBERS[name])


def read_number(name, value, rule):
    """Return value read by rule (type, smallest value, whether the smallest is allowed),
    or raise JobError naming the param and what it must be."""
    kind, minimum, inclusive = rule
    try:
        if isinstance(value, bool) or float(value) != float(kind(float(value))):
            raise ValueError(value)
        number = kind(float(value))
    except (TypeError, ValueError, OverflowError):
        what = "a whole number" if kind is int else "a number"
        raise JobError(f"benchmark param {name} must be {what}, got {value!r}") from None
    if number < minimum or (number == minimum and not inclusive):
        bound = f"at least {minimum}" if inclusive else f"above {minimum}"
        raise JobError(f"benchmark param {name} must be {bound}, got {value}")
    return number


def _batch_sizes(value):
    """Return the sweep's batch sizes as a tuple, or raise JobError saying what is wrong."""
    if not isinstance(value, list | tuple) or not value or len(value) > MAX_SWEEP_SIZES:
        raise JobError(
            f"benchmark param batch_sizes must be a list of 1 to {MAX_SWEEP_SIZES} batch sizes, "
            f"got {value!r}"
        )
    sizes = tuple(_number("batch_size", size) for size in value)
    if len(set(sizes)) != len(sizes):
        raise JobError(f"benchmark param batch_sizes lists a size twice: {list(sizes)}")
    return sizes


def _flag(name, value):
    """Return a boolean param, or raise JobError."""
    if not isinstance(value, bool):
        raise JobError(f"benchmark param {name} must be true or false, got {value!r}")
    return value


def _check_scenario(settings, params):
    """Refuse an unknown scenario, and a scenario's params given to another."""
    if settings.scenario not in SCENARIOS:
        raise JobError(
            f"benchmark param scenario must be one of {', '.join(SCENARIOS)}, "
            f"got {settings.scenario!r}"
        )
    for name, scenario in SCENARIO_PARAMS.items():
        if name in params and settings.scenario != scenario:
            raise JobError(
                f"benchmark param {name} applies to the {scenario} scenario only; "
                f"this benchmark's scenario is {settings.scenario}"
            )


def _reset_high_water_mark():
    """Reset the kernel's peak-RSS counter of this process; return False if we cannot."""
    try:
        PROC_CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return _high_water_mark() is not None


def _high_water_mark():
    """Return the kernel's peak RSS of this process in bytes, or None if unknown."""
    try:
        status = PROC_STATUS.read_text()
    except OSError:
        return None
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def _ignore_progress(fraction, message):
    """Accept a progress report and do nothing with it."""


def _never():
    """Return False: nothing asks the benchmark to stop."""
    return False
