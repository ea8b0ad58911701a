"""MLPerf's server scenario: queries arrive as a Poisson process, one is served at a time.

A query's latency is its completion time minus its scheduled arrival, so time
spent queued behind earlier queries counts, as it does for a user. Above the
rate the model can serve, the queue and p99 grow for as long as the run lasts.
"""

import time

import numpy as np

from workers.errors import Cancelled
from workers.measure.latency import latency_summary

# Sleep until this close to an arrival, then spin: a sleep overshoots by tens of µs,
# which would count as latency.
SPIN_NS = 200_000
# The run stops issuing queries once it is this many times past its schedule's length
# (plus OVERRUN_GRACE_S): far above capacity the queue would otherwise take minutes.
OVERRUN_FACTOR, OVERRUN_GRACE_S = 2.0, 1.0
# Progress is reported every this many queries; should_stop is checked before each query
# and, during a long wait for the next arrival, at least every MAX_SLEEP_NS.
REPORT_EVERY = 16
MAX_SLEEP_NS = 100_000_000
MIN_QUERIES = 10
# Budget search: short runs of about TRIAL_S (at least TRIAL_QUERIES queries), rates
# doubled or halved until one passes and one fails, then bisected to PRECISION.
TRIAL_S, TRIAL_QUERIES, PRECISION = 0.5, 50, 0.05
LOWEST_QPS = 0.1


def poisson_arrivals_ns(qps, seconds=None, queries=None, seed=0, max_queries=None):
    """Return (sorted arrival offsets in ns, the schedule's span in s) of a Poisson load at qps.

    `queries` arrivals, or qps * seconds of them (at least MIN_QUERIES, at most
    max_queries). Given how many arrive within a span, a Poisson process's arrival
    times are independent and uniform over it: drawn so, the offered rate is exactly
    qps, where summed exponential gaps would be off by about 1/sqrt(count), by the
    same factor at every rate for one seed.
    """
    if queries is None:
        queries = max(MIN_QUERIES, round(qps * seconds))
        queries = min(queries, max_queries or queries)
    span = queries / qps
    rng = np.random.default_rng(seed)
    offsets = np.sort(rng.uniform(0, span * 1e9, queries)).astype(np.int64)
    return offsets.tolist(), span


def serve(call, arrivals_ns, span_s, should_stop, report, clock=time.perf_counter_ns):
    """Serve one query per arrival, in order; return (latencies in ns, wall time in s)."""
    latencies = [0] * len(arrivals_ns)
    deadline = (span_s * OVERRUN_FACTOR + OVERRUN_GRACE_S) * 1e9
    start = clock()
    done = 0
    for index, offset in enumerate(arrivals_ns):
        if should_stop():
            raise Cancelled("the benchmark was stopped")
        if clock() - start > deadline:
            break
        if index % REPORT_EVERY == 0:
            report(index / len(arrivals_ns))
        scheduled = start + offset
        _wait_until(scheduled, clock, should_stop)
        call()
        latencies[index] = clock() - scheduled
        done = index + 1
    return latencies[:done], (clock() - start) / 1e9


def server_run(call, qps, seconds, should_stop, report, seed=0, queries=None, max_queries=None):
    """Serve a Poisson load at qps; return what the protocol reports of one rate.

    achieved_qps is the queries served over the schedule's span, or over the time
    they took when that was longer (the server fell behind).
    """
    arrivals, span = poisson_arrivals_ns(qps, seconds, queries, seed, max_queries)
    latencies, wall = serve(call, arrivals, span, should_stop, report)
    achieved = len(latencies) / max(wall, span)
    return {"qps": qps, "achieved_qps": achieved, "latency_ms": latency_summary(latencies)}


def search_max_qps(try_rate, budget_ms, start_qps, seconds, clock=time.monotonic):
    """Return (highest rate tried whose p99 stayed within budget_ms or None, rates tried).

    try_rate(qps) serves a short run and returns server_run's dict. Rates double (or
    halve) from start_qps until one passes and one fails, then are bisected, until
    they are within PRECISION of each other or `seconds` are spent.
    """
    deadline = clock() + seconds
    tried, passed, failed = [], None, None
    qps = start_qps
    while clock() < deadline and (passed is None or failed is None):
        if _within_budget(try_rate(qps), budget_ms, tried):
            passed, qps = qps, qps * 2
        else:
            failed, qps = qps, qps / 2
        if qps < LOWEST_QPS or (passed is not None and qps > start_qps * 2**6):
            break
    while clock() < deadline and passed and failed and failed / passed > 1 + PRECISION:
        middle = (passed + failed) / 2
        if _within_budget(try_rate(middle), budget_ms, tried):
            passed = middle
        else:
            failed = middle
    return passed, tried


def best_in_budget(searched, main_qps, main_p99_ms, budget_ms):
    """Return the highest rate known to keep p99 within budget: the search's or the main run's.

    The main run is longer than a search trial, so it is the better evidence: a
    trial at a lower rate that a noisy moment pushed over budget must not report
    less than a rate the main run served within it.
    """
    if main_p99_ms <= budget_ms and (searched is None or main_qps > searched):
        return main_qps
    return searched


def trial_seconds(qps, left_s):
    """Return how long a search trial at qps runs: TRIAL_S, longer for TRIAL_QUERIES."""
    return max(0.05, min(max(TRIAL_S, TRIAL_QUERIES / qps), left_s))


def _within_budget(run, budget_ms, tried):
    """Record a trial as the protocol lists it; return whether its p99 met the budget."""
    p99 = run["latency_ms"]["p99"]
    tried.append({"qps": run["qps"], "p99_ms": p99, "achieved_qps": run["achieved_qps"]})
    return p99 <= budget_ms


def _wait_until(moment_ns, clock, should_stop):
    """Return at moment_ns (or at once when it has passed): sleep most of the way, then spin."""
    while (left := moment_ns - clock()) > SPIN_NS:
        if should_stop():
            raise Cancelled("the benchmark was stopped")
        time.sleep(min(left - SPIN_NS, MAX_SLEEP_NS) / 1e9)
    while clock() < moment_ns:
        pass
