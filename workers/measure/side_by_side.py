"""Time several engines of one model side by side, in one process, round after round.

Builds benchmarked one after another each meet the machine in another state
(another process busy, the clock lower, the caches cold), so two builds a few
percent apart are ranked by that noise. Here every engine is loaded at once and
fed the same inputs; each round runs every engine for a short slice, in an order
that rotates from round to round, so drift and bursts of load elsewhere touch
them all alike. An engine's figure is its best round's median: a round's
median ignores a single slow run, and the best round the rounds in which
another process took a core. The result has the shape of "Side-by-side result"
in docs/protocol.md.
"""

import os
import statistics
from dataclasses import dataclass, replace

from workers.errors import Cancelled, JobError
from workers.measure import feeds as model_feeds
from workers.measure.benchmark import Goal, measure, read_number, timed_runs

# What each param is and how it is read: (type, smallest value, whether it is allowed).
RULES = {
    "batch_size": (int, 1, True),
    "rounds": (int, 2, True),
    "duration_s": (float, 0, False),
    "warmup_s": (float, 0, True),
    "seed": (int, 0, True),
}
# A slice runs an engine at least this many times, however slow it is.
MIN_RUNS_PER_SLICE = 3
# Two engines whose figures differ by less than this share are as fast as each other here.
TIE_MARGIN = 0.02


@dataclass(frozen=True)
class Settings:
    """How a side-by-side benchmark runs: duration_s is each engine's measured time in all.

    batch_size None: the model's default batch (workers/measure/feeds.py: 1 when allowed).
    """

    batch_size: int | None = None
    rounds: int = 10
    duration_s: float = 2.0
    warmup_s: float = 0.5
    seed: int = 0


def read_settings(params):
    """Return the Settings from a job's params, checking their types and ranges."""
    values = {
        name: read_number(name, params[name], rule)
        for name, rule in RULES.items()
        if params.get(name) is not None
    }
    return Settings(**values)


def compare(loaders, params, progress=None, should_stop=None, model_io=None):
    """Load every engine, time them side by side, and return the figures, fastest first.

    loaders maps a name (an engine id) to a zero-argument callable returning
    something with run(None, feeds) and get_inputs(), as benchmark_session takes.
    Every engine is fed the same random batch, made from model_io (the job's), or
    for the first engine's inputs without it.
    """
    if len(loaders) < 2:
        raise JobError(f"a side-by-side benchmark needs two engines or more, got {len(loaders)}")
    settings = read_settings(params or {})
    report = progress or (lambda fraction, message: None)
    stop = should_stop or (lambda: False)
    sessions = {}
    for index, (name, load) in enumerate(loaders.items()):
        report(0.05 * index / len(loaders), f"loading engine {name}")
        sessions[name] = load()
    specs = model_feeds.input_specs(model_io or list(next(iter(sessions.values())).get_inputs()))
    if settings.batch_size is None:
        settings = replace(settings, batch_size=model_feeds.default_batch(specs))
    feeds = model_feeds.synthetic_feeds(specs, settings.batch_size, settings.seed)
    calls = {name: _call(session, feeds) for name, session in sessions.items()}
    counts, medians = time_in_rounds(calls, settings, report, stop)
    report(1.0, "done")
    return _result(settings, counts, medians)


def time_in_rounds(calls, settings, report=None, should_stop=None):
    """Warm up each zero-argument call, then run each for its slice in every round, the
    order rotating; return ({name: runs per slice}, {name: [each round's median in ms]})."""
    report = report or (lambda fraction, message: None)
    should_stop = should_stop or (lambda: False)
    slice_s = settings.duration_s / settings.rounds
    counts = {}
    for index, (name, call) in enumerate(calls.items()):
        report(0.05 + 0.1 * index / len(calls), f"warming up engine {name}")
        counts[name] = _runs_per_slice(call, settings.warmup_s, slice_s, should_stop)
    return counts, _rounds(calls, counts, settings.rounds, report, should_stop)


def _call(session, feeds):
    return lambda: session.run(None, feeds)


def _runs_per_slice(call, warmup_s, slice_s, should_stop):
    """Warm a call up; return how many of its runs take about slice_s."""
    goal = Goal(seconds=warmup_s, min_iterations=MIN_RUNS_PER_SLICE)
    samples, _ = measure(call, goal, lambda fraction: None, should_stop)
    per_run_s = statistics.median(samples) / 1e9
    return max(MIN_RUNS_PER_SLICE, round(slice_s / per_run_s))


def _rounds(calls, counts, rounds, report, should_stop):
    """Run every call for its slice in each round, the order rotating; return round medians."""
    names = list(calls)
    medians = {name: [] for name in names}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            if should_stop():
                raise Cancelled("the side-by-side benchmark was stopped")
            medians[name].append(statistics.median(timed_runs(calls[name], counts[name])) / 1e6)
        report(0.15 + 0.85 * (round_ + 1) / rounds, f"round {round_ + 1} of {rounds}")
    return medians


def _result(settings, counts, medians):
    engines = sorted(
        (
            {
                "engine": name,
                "best_round_ms": min(values),
                "median_round_ms": statistics.median(values),
                "worst_round_ms": max(values),
                "runs_per_round": counts[name],
            }
            for name, values in medians.items()
        ),
        key=lambda figures: figures["best_round_ms"],
    )
    fastest, runner_up = engines[0], engines[1]
    return {
        "batch_size": settings.batch_size,
        "rounds": settings.rounds,
        "engines": engines,
        "fastest": fastest["engine"],
        "lead": runner_up["best_round_ms"] / fastest["best_round_ms"],
        "tied": runner_up["best_round_ms"] <= fastest["best_round_ms"] * (1 + TIE_MARGIN),
        "load_average": os.getloadavg()[0],
    }
