"""Summarize latency samples and judge whether a run was steady enough to trust.

A benchmark is worth keeping when its latencies neither scatter (coefficient of
variation) nor drift (the median of one part of the run differs from another's:
a GPU heating up and throttling, a noisy neighbour, a CPU changing frequency).

The scatter verdict leaves the slowest 1% of runs aside ("cv_core"): on a
sub-millisecond model one preemption by the OS (a few ms) makes std larger than
the mean, though every other run took the same time. Those runs are not hidden:
p99 and max report them, and the raw CV (std / mean of every run) is reported too.

Both thresholds are relative to the run's latency, but never to less than
`floor_ms` (1 ms by default): below it, the scheduler and the timer move a run
by tens of microseconds, which is 20% of a 0.05 ms model and decides nothing
against a frame budget. A sub-millisecond run is unstable when its spread or
drift passes the threshold times the floor (0.1 ms by default).

The samples themselves travel too, compactly (`compact_samples`): at most
SAMPLES_KEPT of them, evenly spaced in measured order, as base64 of little-endian
float32 milliseconds, so the hub can draw a run's distribution (docs/protocol.md).
"""

import base64

import numpy as np

DEFAULT_CV_THRESHOLD = 0.10
DEFAULT_DRIFT_THRESHOLD = 0.10
DEFAULT_FLOOR_MS = 1.0
# The run is cut into this many consecutive windows to see drift, each of at least
# MIN_WINDOW_SAMPLES samples: fewer windows when the run is short.
WINDOWS = 5
MIN_WINDOW_SAMPLES = 2
# At most this many per-run samples travel with a result (16 KiB of float32, ~22 KB as base64).
SAMPLES_KEPT = 4096
SAMPLES_FORMAT = "f32le-base64"


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


def coefficient_of_variation(latency):
    """Return std / mean of a latency summary (0.0 for a zero mean)."""
    return latency["std"] / latency["mean"] if latency["mean"] else 0.0


def core_spread(samples_ns, latency):
    """Return (std, mean) in ms of the runs at or below p99 (the slowest 1% aside)."""
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    core = ms[ms <= latency["p99"]]
    return (float(core.std()), float(core.mean())) if len(core) else (0.0, 0.0)


def window_medians_ms(samples_ns):
    """Return the median in ms of each consecutive window of the samples, in run order."""
    count = min(WINDOWS, len(samples_ns) // MIN_WINDOW_SAMPLES)
    if count < 2:
        return [float(np.median(samples_ns) / 1e6)] if len(samples_ns) else []
    windows = np.array_split(np.asarray(samples_ns, dtype=np.float64), count)
    return [float(np.median(window) / 1e6) for window in windows]


def stability(
    samples_ns,
    cv_threshold=DEFAULT_CV_THRESHOLD,
    drift_threshold=DEFAULT_DRIFT_THRESHOLD,
    latency=None,
    floor_ms=DEFAULT_FLOOR_MS,
):
    """Return the stability verdict of a run: stable, why not, its CV, drift and window medians.

    drift = (highest window median - lowest window median) / the run's median.
    latency is the samples' latency_summary, when the caller has it already.
    """
    latency = latency or latency_summary(samples_ns)
    std, mean = core_spread(samples_ns, latency)
    cv, cv_core = coefficient_of_variation(latency), std / mean if mean else 0.0
    windows = window_medians_ms(samples_ns)
    spread = max(windows) - min(windows)
    drift = spread / latency["p50"] if latency["p50"] else 0.0
    reasons = []
    if std > cv_threshold * max(mean, floor_ms):
        reasons.append(_scatter_reason(cv_core, std, mean, cv_threshold, floor_ms))
    if spread > drift_threshold * max(latency["p50"], floor_ms):
        reasons.append(_drift_reason(windows, drift))
    return {
        "stable": not reasons,
        "reasons": reasons,
        "cv": cv,
        "cv_core": cv_core,
        "drift": drift,
        "windows_p50_ms": windows,
    }


def _scatter_reason(cv_core, std, mean, threshold, floor_ms):
    """Say how much the runs scattered, against the threshold that applied."""
    if mean >= floor_ms:
        return f"CV {cv_core:.1%} is above {threshold:.0%} (the slowest 1% of runs aside)"
    return (
        f"runs scatter by {std:.3f} ms (std; CV {cv_core:.0%}), above {threshold:.0%} of "
        f"{floor_ms:g} ms, the floor for sub-millisecond runs (the slowest 1% aside)"
    )


def _drift_reason(windows, drift):
    """Say how the median moved between the run's windows, and what usually causes it."""
    first, last = windows[0], windows[-1]
    how = (
        f"between the first and last windows ({first:.3g} → {last:.3g} ms)"
        if abs(last - first) >= (max(windows) - min(windows)) / 2
        else f"between windows ({min(windows):.3g} to {max(windows):.3g} ms)"
    )
    return f"the median drifted {drift:.0%} {how}: thermal throttling or a noisy neighbour?"


def compact_samples(samples_ns, kept=SAMPLES_KEPT):
    """Return the protocol's latency_samples block: the runs in ms as base64 float32 (LE).

    More than `kept` runs are thinned to `kept`, evenly spaced in measured order (first
    and last included), so drift stays visible; `measured` says how many there were.
    """
    ns = np.asarray(samples_ns, dtype=np.float64)
    if len(ns) > kept:
        ns = ns[np.linspace(0, len(ns) - 1, kept).round().astype(np.int64)]
    ms = (ns / 1e6).astype("<f4")
    return {
        "format": SAMPLES_FORMAT,
        "measured": len(samples_ns),
        "count": len(ms),
        "data": base64.b64encode(ms.tobytes()).decode("ascii"),
    }


def expand_samples(block):
    """Return the milliseconds a latency_samples block carries, as a float64 array."""
    return np.frombuffer(base64.b64decode(block["data"]), dtype="<f4").astype(np.float64)
