"""Whether a benchmark's figures can be trusted: scatter (CV) and drift between windows."""

import numpy as np
import pytest

from tests.benchmark_models import SleepyTestSession
from workers.measure.benchmark import benchmark_session
from workers.measure.latency import stability, window_medians_ms

MS = 1_000_000
QUICK = {"warmup_iterations": 0, "iterations": 40}


def steady_ns(count=100, ms=1.0, jitter=0.01, seed=0):
    """Return latencies around `ms` with a small relative jitter, in ns."""
    rng = np.random.default_rng(seed)
    return (ms * MS * (1 + jitter * rng.standard_normal(count))).astype(np.int64).tolist()


def test_it_calls_a_steady_run_stable():
    verdict = stability(steady_ns())

    assert verdict["stable"] is True
    assert verdict["reasons"] == []
    assert verdict["cv"] < 0.02 and verdict["drift"] < 0.02
    assert verdict["windows_p50_ms"] == pytest.approx([1.0] * 5, rel=0.02)


def test_it_calls_a_scattered_run_unstable_saying_its_cv():
    samples = [1 * MS, 3 * MS] * 50  # alternating: every window has the same median

    verdict = stability(samples)

    assert verdict["stable"] is False
    assert verdict["cv"] == pytest.approx(0.5)
    assert verdict["reasons"] == ["CV 50.0% is above 10% (the slowest 1% of runs aside)"]


def test_one_preemption_in_a_quick_run_is_reported_but_does_not_make_it_unstable():
    samples = steady_ns(count=1000, ms=0.05) + [8 * MS]  # the OS took the core once: 8 ms

    verdict = stability(samples)

    assert verdict["cv"] > 1.0  # std / mean of every run: the preemption dominates it
    assert verdict["cv_core"] < 0.02
    assert verdict["stable"] is True


def test_a_sub_millisecond_run_is_judged_against_the_floor_not_its_own_tiny_mean():
    jittery = steady_ns(count=1000, ms=0.05, jitter=0.2)  # ±0.01 ms: timer and scheduler

    verdict = stability(jittery)

    assert verdict["cv_core"] > 0.15  # 20% of a 0.05 ms run...
    assert verdict["stable"] is True  # ...is 0.01 ms, far below 10% of the 1 ms floor


def test_a_sub_millisecond_run_that_really_scatters_is_unstable_and_says_so():
    scattered = [int(0.1 * MS), int(0.5 * MS)] * 500  # 0.2 ms std on a 0.3 ms mean

    verdict = stability(scattered)

    assert verdict["stable"] is False
    assert verdict["reasons"][0].startswith("runs scatter by 0.200 ms (std; CV 67%), above 10%")
    assert stability(scattered, floor_ms=5.0)["stable"] is True


def test_a_tail_of_more_than_one_percent_still_counts():
    samples = steady_ns(count=1000, ms=0.05) + [8 * MS] * 30  # 3% of runs preempted

    verdict = stability(samples)

    assert verdict["stable"] is False and verdict["cv_core"] > 0.10


def test_it_calls_a_drifting_run_unstable_saying_how_the_median_moved():
    samples = [1 * MS] * 50 + [int(1.3 * MS)] * 50

    verdict = stability(samples, cv_threshold=0.5)

    assert verdict["stable"] is False
    assert verdict["drift"] == pytest.approx(0.3 / 1.15)
    [reason] = verdict["reasons"]
    assert reason.startswith("the median drifted 26% ")
    assert "between the first and last windows (1 → 1.3 ms)" in reason
    assert reason.endswith("thermal throttling or a noisy neighbour?")


def test_it_applies_the_thresholds_it_is_given():
    samples = [1 * MS, 3 * MS] * 50

    assert stability(samples, cv_threshold=0.6)["stable"] is True
    assert stability(steady_ns(), drift_threshold=0.001)["stable"] is False


def test_it_cuts_the_run_into_five_windows_in_order():
    samples = [ms * MS for ms in (1, 1, 2, 2, 3, 3, 4, 4, 5, 5)]

    assert window_medians_ms(samples) == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_it_uses_fewer_windows_for_a_short_run():
    assert window_medians_ms([1 * MS, 1 * MS, 2 * MS, 2 * MS]) == [1.0, 2.0]
    assert window_medians_ms([1 * MS, 3 * MS]) == [2.0]
    assert stability([1 * MS, 1 * MS, 1 * MS])["drift"] == 0.0


def test_it_marks_a_jittery_test_double_unstable_through_the_harness():
    jittery = SleepyTestSession(lambda call: 0.001 if call % 2 else 0.006)

    result = benchmark_session(lambda settings: jittery, QUICK)

    assert result["stability"]["stable"] is False
    assert result["cv"] > 0.3
    assert any(reason.startswith("CV ") for reason in result["stability"]["reasons"])


def test_it_marks_a_throttling_test_double_unstable_for_drift():
    throttling = SleepyTestSession(lambda call: 0.002 if call < 20 else 0.006)

    result = benchmark_session(lambda settings: throttling, {**QUICK, "cv_threshold": 5})

    stability = result["stability"]
    assert stability["stable"] is False
    assert stability["windows_p50_ms"][0] < 4 < stability["windows_p50_ms"][-1]
    assert any("drifted" in reason for reason in stability["reasons"])
