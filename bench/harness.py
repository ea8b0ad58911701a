"""Bench rows of the benchmark harness against a bare timed session.run loop.

Same session, same feeds, same number of runs. The session runs on one intra-op thread:
ONNX Runtime's threads wait on each other when another process takes a core, which
would time the machine's other work, not the harness. The two sides alternate over
ROUNDS short rounds (bare then harness, harness then bare, ...: a drift in the machine's
speed weighs on both alike), and each figure compares the medians of the rounds, so a
burst of other work spoils a few rounds, not the figure.

A round's time includes everything the harness adds (settings, inputs, memory and GPU
probes, statistics), counted as this process's CPU time: with one thread, that is the
round's wall time less the time other processes took the core, which a busy machine
hands out unevenly. Its median latency (wall clock, per run) shows what its timing loop
adds to each run. RUNS runs of the demo model take about 0.45 s: the harness's fixed
costs (about 3 ms) weigh more here than in a default benchmark (several seconds).
"""

import os
import statistics
import time
from functools import partial
from pathlib import Path

from bench.rows import row

MODEL = (
    Path(__file__).resolve().parent.parent / "deployhub" / "demo" / "assets" / "digits_cnn_v2.onnx"
)
RUNS, ROUNDS = 10000, 16
TARGET = 1.02


def bare_loop(run, count):
    """Return the duration in seconds of each of count runs: the bare loop."""
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return samples


def sides(session):
    """Return the two sides; each runs RUNS times, returning (CPU s, median s per run)."""
    from workers.measure.benchmark import benchmark_session, random_inputs

    run = partial(session.run, None, random_inputs(session.get_inputs(), 1))
    params = {"warmup_iterations": 0, "iterations": RUNS}

    def harness():
        started = time.process_time()
        result = benchmark_session(lambda settings: session, params)
        return time.process_time() - started, result["latency_ms"]["p50"] / 1000

    def bare():
        started = time.process_time()
        samples = bare_loop(run, RUNS)
        return time.process_time() - started, statistics.median(samples)

    bare_loop(run, 500)  # warms the session up
    return harness, bare


def bench_harness_overhead():
    """Rows: the harness's wall time and median latency per run against the bare loop's."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(MODEL), options, providers=["CPUExecutionProvider"])
    harness, bare = sides(session)
    measured = {harness: [], bare: []}
    for round_ in range(ROUNDS):
        for side in (harness, bare) if round_ % 2 else (bare, harness):
            measured[side].append(side())
    times = {side: statistics.median(t for t, _ in runs) for side, runs in measured.items()}
    medians = {side: statistics.median(m for _, m in runs) for side, runs in measured.items()}
    what = (
        f"demo model, 1 thread, {RUNS} runs × {ROUNDS} rounds in turn, medians of the rounds; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    return [
        row(
            f"harness vs bare session.run loop: time, in CPU seconds ({what})",
            times[harness] / times[bare],
            "×",
            TARGET,
        ),
        row(
            f"harness vs bare session.run loop: median latency per run "
            f"({medians[harness] * 1e6:.0f} vs {medians[bare] * 1e6:.0f} µs)",
            medians[harness] / medians[bare],
            "×",
            TARGET,
        ),
    ]
