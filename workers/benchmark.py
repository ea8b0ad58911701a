"""Measure a model's latency, throughput and memory with ONNX Runtime.

The result has the shape of "Benchmark result" in docs/protocol.md.
"""

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from workers.errors import Cancelled, JobError

BYTES_PER_MB = 2**20
RSS_SAMPLE_SECONDS = 0.005
PROC_CLEAR_REFS = Path("/proc/self/clear_refs")
PROC_STATUS = Path("/proc/self/status")
# Progress is reported (and the loop leaves its tight inner part) this many times per phase.
PROGRESS_STEPS = 50
WARMUP_SHARE = 0.1
# ONNX Runtime's type strings, mapped to the numpy dtypes we feed.
DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


@dataclass(frozen=True)
class Settings:
    """The conditions a benchmark runs under, read from the job's params."""

    batch_size: int = 1
    warmup_iterations: int = 10
    iterations: int = 100
    intra_op_threads: int = 0
    seed: int = 0
    provider: str = "CPUExecutionProvider"


def benchmark_onnxruntime(model_path, params, progress=None, should_stop=None, preoptimized=False):
    """Benchmark an ONNX model with ONNX Runtime and return the result dict.

    progress(fraction, message) is called at phase changes and about every 2%
    of the iterations; should_stop() is checked between iterations and makes
    the benchmark raise Cancelled when it returns True. A preoptimized model
    (an onnxruntime engine) is loaded with graph optimisations off: it had them.
    """
    return benchmark_session(
        lambda settings: _create_session(model_path, settings, preoptimized),
        params,
        progress,
        should_stop,
    )


def benchmark_session(make_session, params, progress=None, should_stop=None):
    """Benchmark whatever make_session(settings) loads: anything with ONNX Runtime's
    run(None, feeds), get_inputs() and get_providers() (another backend's engine too)."""
    settings = read_settings(params)
    report = progress or _ignore_progress
    stop = should_stop or _never
    report(0.0, "loading model")
    with PeakRss() as rss:
        session = make_session(settings)
        feeds = random_inputs(session.get_inputs(), settings.batch_size, settings.seed)
        report(0.0, "warm-up")
        warmup = _phase(report, 0.0, WARMUP_SHARE, "warm-up")
        _run_phase(session, feeds, settings.warmup_iterations, warmup, stop)
        report(WARMUP_SHARE, "measuring")
        measure = _phase(report, WARMUP_SHARE, 1.0, "measuring")
        samples = _run_phase(session, feeds, settings.iterations, measure, stop)
    report(1.0, "done")
    return _result(settings, session.get_providers()[0], samples, rss)


def read_settings(params):
    """Return the benchmark Settings from a job's params, checking their ranges."""
    params = params or {}
    defaults = Settings()
    settings = Settings(
        batch_size=int(params.get("batch_size", defaults.batch_size)),
        warmup_iterations=int(params.get("warmup_iterations", defaults.warmup_iterations)),
        iterations=int(params.get("iterations", defaults.iterations)),
        intra_op_threads=int(params.get("intra_op_threads", defaults.intra_op_threads)),
        seed=int(params.get("seed", defaults.seed)),
        provider=str(params.get("provider", defaults.provider)),
    )
    _check_at_least(settings.batch_size, 1, "batch_size")
    _check_at_least(settings.iterations, 1, "iterations")
    _check_at_least(settings.warmup_iterations, 0, "warmup_iterations")
    _check_at_least(settings.intra_op_threads, 0, "intra_op_threads")
    return settings


def random_inputs(input_metas, batch_size, seed=0):
    """Return random feeds for a session's inputs (from session.get_inputs())."""
    rng = np.random.default_rng(seed)
    _check_batch_is_fed(input_metas, batch_size)
    return {
        meta.name: _random_array(rng, meta, input_shape(meta, batch_size)) for meta in input_metas
    }


def input_shape(meta, batch_size):
    """Return the concrete shape to feed an input; a symbolic batch dim becomes batch_size."""
    shape = []
    for position, dim in enumerate(meta.shape):
        if _is_fixed(dim):
            shape.append(dim)
        elif position == 0:
            shape.append(batch_size)
        else:
            raise JobError(
                f"input {meta.name!r} has a symbolic dimension {dim!r} at position {position}; "
                "only the batch dimension (position 0) may be symbolic: export the model "
                "with fixed height, width and sequence length"
            )
    return shape


def latency_summary(samples_ns):
    """Return min, p50, p90, p95, p99, max, mean and std in milliseconds.

    Percentiles interpolate linearly between samples (numpy's default method);
    std is the population standard deviation.
    """
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    p50, p90, p95, p99 = np.percentile(ms, [50, 90, 95, 99], method="linear")
    values = {
        "min": ms.min(),
        "p50": p50,
        "p90": p90,
        "p95": p95,
        "p99": p99,
        "max": ms.max(),
        "mean": ms.mean(),
        "std": ms.std(),
    }
    return {name: float(value) for name, value in values.items()}


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


def _create_session(model_path, settings, preoptimized=False):
    """Create an ONNX Runtime session with the requested threads and provider."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    if preoptimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(model_path), options, providers=[settings.provider])


def _run_phase(session, feeds, iterations, report, should_stop):
    """Run the session `iterations` times; return each run's duration in ns."""
    step = max(1, iterations // PROGRESS_STEPS)
    samples = []
    for start in range(0, iterations, step):
        samples += _timed_runs(session, feeds, min(step, iterations - start), should_stop)
        report(len(samples) / iterations)
    return samples


def _timed_runs(session, feeds, count, should_stop):
    """Time `count` runs back to back; this loop is what the benchmark measures."""
    run, clock = session.run, time.perf_counter_ns
    samples = [0] * count
    for index in range(count):
        if should_stop():
            raise Cancelled("the benchmark was stopped")
        started = clock()
        run(None, feeds)
        samples[index] = clock() - started
    return samples


def _phase(report, start, end, message):
    """Return a callback mapping a phase's 0..1 progress onto start..end overall."""
    return lambda fraction: report(start + fraction * (end - start), message)


def _result(settings, provider, samples, rss):
    """Return the benchmark result in the protocol's field order."""
    latency = latency_summary(samples)
    return {
        "backend": "onnxruntime",
        "provider": provider,
        "batch_size": settings.batch_size,
        "warmup_iterations": settings.warmup_iterations,
        "iterations": settings.iterations,
        "intra_op_threads": settings.intra_op_threads,
        "latency_ms": latency,
        "throughput_ips": settings.batch_size * 1000 / latency["mean"],
        "peak_rss_mb": rss.peak / BYTES_PER_MB,
        "rss_growth_mb": (rss.peak - rss.baseline) / BYTES_PER_MB,
    }


def _check_at_least(value, minimum, name):
    """Raise JobError naming the param when value is below minimum."""
    if value < minimum:
        raise JobError(f"benchmark param {name} must be at least {minimum}, got {value}")


def _check_batch_is_fed(input_metas, batch_size):
    """Raise when the batch dimension is fixed at another size than batch_size."""
    batch_dims = [meta.shape[0] for meta in input_metas if meta.shape]
    if not batch_dims or not all(_is_fixed(dim) for dim in batch_dims):
        return
    if batch_dims[0] != batch_size:
        raise JobError(
            f"batch_size is {batch_size} but the model's batch dimension is fixed at "
            f"{batch_dims[0]}; export it with a symbolic batch dimension to change it"
        )


def _is_fixed(dim):
    """Return True for a concrete (integer) dimension, False for a symbolic one."""
    return isinstance(dim, int) and dim >= 0


def _random_array(rng, meta, shape):
    """Return a random array of the input's dtype and the given shape."""
    dtype = DTYPES.get(meta.type)
    if dtype is None:
        supported = ", ".join(DTYPES)
        raise JobError(f"input {meta.name!r} has type {meta.type}; supported: {supported}")
    if dtype is np.bool_:
        return rng.random(shape) < 0.5
    if dtype is np.uint8:
        return rng.integers(0, 256, shape, dtype=np.uint8)
    if np.issubdtype(dtype, np.integer):
        # Small non-negative values stay valid as indices, ids and flags.
        return rng.integers(0, 2, shape, dtype=dtype)
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def _ignore_progress(fraction, message):
    """Accept a progress report and do nothing with it."""


def _never():
    """Return False: nothing asks the benchmark to stop."""
    return False
