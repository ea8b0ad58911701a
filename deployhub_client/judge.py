"""What `deployhub gate` decides, as pure functions of the hub's JSON (no network, no hub).

A candidate and its baseline are each {"benchmark": ..., "accuracy": ...}: one benchmark
run and one accuracy run of the same device class, shaped as `GET models/<id>/results`
lists them. judge() compares them on three criteria (p99 latency, accuracy in points,
peak memory) and says for each: pass, fail, within noise (a latency regression the
measurement's own stability verdict cannot tell from noise) or unknown (a figure is
missing: the gate cannot decide). docs/gate.md explains the rules to users.
"""

from dataclasses import dataclass, field

# As the hub's BenchmarkRun.gate: an unstable measurement decides nothing unless the gap is
# this wide (twice the p99); noise of that size cannot turn the verdict.
WIDE_MARGIN = 2.0

# Labelled headline metrics where lower is better (workers/tasks: the character error rate);
# every other one (top-1, mAP, mIoU) is better higher.
LOWER_IS_BETTER = frozenset({"cer"})


class Status:
    """One criterion's verdict."""

    PASS = "pass"
    FAIL = "fail"
    NOISE = "within noise"
    UNKNOWN = "unknown"


class Outcome:
    """A device class's verdict, and the whole gate's."""

    PASSED = "passed"
    FAILED = "failed"
    UNDECIDED = "could not decide"


# The gate's exit status for each outcome (docs/gate.md).
EXIT_CODES = {Outcome.PASSED: 0, Outcome.FAILED: 1, Outcome.UNDECIDED: 2}


@dataclass(frozen=True)
class Limits:
    """How much worse than the baseline a candidate may be and still pass."""

    p99_regression: float = 0.05  # a fraction of the baseline's p99 (0.05: 5% slower)
    accuracy_drop: float = 0.5  # points of the labelled headline metric
    memory_growth: float = 0.10  # a fraction of the baseline's peak memory

    def described(self):
        return (
            f"p99 at most {self.p99_regression:.0%} slower, accuracy at most "
            f"{self.accuracy_drop:g} points lower, peak memory at most "
            f"{self.memory_growth:.0%} higher"
        )


@dataclass(frozen=True)
class Verdict:
    """One criterion judged: both figures, the change between them and why it passed or not."""

    criterion: str
    status: str
    candidate: str
    baseline: str
    change: str
    reason: str


@dataclass
class ClassReport:
    """What the gate found on one device class."""

    device_class: str
    outcome: str
    reason: str = ""
    candidate: str = ""  # which build was judged ("v3 onnxruntime fp32, engine #12")
    baseline: str = ""
    verdicts: list = field(default_factory=list)
    run: dict | None = None  # the candidate's auto run ({"id", "page"}), when one ran
    engine: int | None = None  # the candidate's recommended engine

    def as_json(self):
        return {
            "device_class": self.device_class,
            "outcome": self.outcome,
            "reason": self.reason,
            "candidate": self.candidate,
            "baseline": self.baseline,
            "engine": self.engine,
            "auto_run": self.run,
            "criteria": [verdict.__dict__ for verdict in self.verdicts],
        }


def undecided(device_class, reason, **known):
    """A class the gate cannot judge, and why."""
    return ClassReport(device_class, Outcome.UNDECIDED, reason, **known)


def judge(candidate, baseline, limits):
    """Compare a candidate with its baseline on every criterion; return their Verdicts."""
    return [
        judge_p99(candidate["benchmark"], baseline["benchmark"], limits.p99_regression),
        judge_accuracy(candidate.get("accuracy"), baseline.get("accuracy"), limits.accuracy_drop),
        judge_memory(candidate["benchmark"], baseline["benchmark"], limits.memory_growth),
    ]


def gate_p99_ms(benchmark):
    """The p99 a real-time gate judges: the Server run's when there is one (as the hub)."""
    if benchmark.get("scenario") == "server" and benchmark.get("server_p99_ms") is not None:
        return benchmark["server_p99_ms"]
    return benchmark.get("latency_p99_ms")


def unstable(benchmark):
    """Whether the worker (or the hub's gate) found the measurement too noisy to trust."""
    gate = benchmark.get("gate")
    verdict = gate.get("verdict") if isinstance(gate, dict) else gate
    return benchmark.get("stable") is False or verdict == "unstable"


def judge_p99(candidate, baseline, limit):
    """p99 latency: a regression over `limit` fails, unless a measurement is unstable and the
    gap is narrower than WIDE_MARGIN (then it is within noise, as the hub's own gate says)."""
    new, old = gate_p99_ms(candidate), gate_p99_ms(baseline)
    if new is None or old is None or old <= 0:
        return _unknown("p99 latency", "a benchmark has no p99 to compare")
    growth = new / old - 1
    figures = {
        "candidate": f"{new:.3f} ms",
        "baseline": f"{old:.3f} ms",
        "change": f"{growth:+.1%}",
    }
    if growth <= limit:
        return Verdict("p99 latency", Status.PASS, **figures, reason=f"within {limit:.0%}")
    noisy = [
        name for name, run in (("candidate", candidate), ("baseline", baseline)) if unstable(run)
    ]
    if noisy and new < WIDE_MARGIN * old:
        why = f"over {limit:.0%}, but the {' and '.join(noisy)} measurement is unstable"
        why += f" and the gap is under {WIDE_MARGIN:g}x: measure again to be sure"
        return Verdict("p99 latency", Status.NOISE, **figures, reason=why)
    return Verdict("p99 latency", Status.FAIL, **figures, reason=f"over the {limit:.0%} limit")


def judge_accuracy(candidate, baseline, limit):
    """Accuracy: the labelled headline metric (top-1, mAP, ...) on the same dataset may drop
    by at most `limit` points; without labels on both sides the gate cannot compare."""
    if candidate is None or baseline is None:
        which = "candidate" if candidate is None else "baseline"
        return _unknown("accuracy", f"the {which} build was not evaluated")
    metric = candidate.get("metric")
    new, old = candidate.get("engine_metric"), baseline.get("engine_metric")
    if metric is None or metric != baseline.get("metric") or new is None or old is None:
        return _unknown("accuracy", "no labelled metric measured on both builds (add labels)")
    if candidate.get("dataset") != baseline.get("dataset"):
        sets = f"{candidate.get('dataset')!r} and {baseline.get('dataset')!r}"
        return _unknown("accuracy", f"evaluated on different datasets ({sets})")
    drop = ((new - old) if metric in LOWER_IS_BETTER else (old - new)) * 100
    figures = {
        "candidate": f"{metric} {new:.4g}",
        "baseline": f"{metric} {old:.4g}",
        "change": f"{0.0 - drop:+.2f} points",  # never "-0.00"
    }
    if drop <= limit:
        return Verdict("accuracy", Status.PASS, **figures, reason=f"drop within {limit:g} points")
    return Verdict("accuracy", Status.FAIL, **figures, reason=f"drop over {limit:g} points")


def peak_memory_mb(benchmark):
    """Peak device memory on a GPU, else the process's peak resident memory (as the hub)."""
    return (
        benchmark.get("peak_device_memory_mb")
        if benchmark.get("gpu")
        else benchmark.get("peak_rss_mb")
    )


def judge_memory(candidate, baseline, limit):
    """Peak memory may grow by at most `limit` (a fraction) over the baseline's."""
    new, old = peak_memory_mb(candidate), peak_memory_mb(baseline)
    if new is None or old is None or old <= 0:
        return _unknown("peak memory", "a benchmark has no peak memory to compare")
    growth = new / old - 1
    figures = {
        "candidate": f"{new:.0f} MB",
        "baseline": f"{old:.0f} MB",
        "change": f"{growth:+.1%}",
    }
    if growth <= limit:
        return Verdict("peak memory", Status.PASS, **figures, reason=f"within {limit:.0%}")
    return Verdict("peak memory", Status.FAIL, **figures, reason=f"over the {limit:.0%} limit")


def _unknown(criterion, reason):
    return Verdict(criterion, Status.UNKNOWN, "-", "-", "-", reason)


def outcome_of(verdicts):
    """A class fails when a criterion fails; it is undecided when one is unknown."""
    statuses = {verdict.status for verdict in verdicts}
    if Status.FAIL in statuses:
        return Outcome.FAILED
    return Outcome.UNDECIDED if Status.UNKNOWN in statuses or not verdicts else Outcome.PASSED


def overall(reports):
    """The gate's outcome: failed when a class failed (the merge is blocked whatever the
    others say), else undecided when a class could not be judged, else passed."""
    outcomes = {report.outcome for report in reports}
    if Outcome.FAILED in outcomes:
        return Outcome.FAILED
    if Outcome.UNDECIDED in outcomes or not reports:
        return Outcome.UNDECIDED
    return Outcome.PASSED


# Choosing what to compare, from `GET models/<id>/results`.


def runs_of_engine(results, engine, device_class):
    """The engine's benchmark and accuracy runs on the class, newest first."""
    benchmarks = [
        run
        for run in results.get("benchmarks", [])
        if run.get("engine") == engine and run.get("device_class") == device_class
    ]
    accuracy = [run for run in results.get("accuracy", []) if run.get("engine") == engine]
    newest = lambda run: (run.get("created_at") or "", run.get("id") or 0)  # noqa: E731
    return sorted(benchmarks, key=newest, reverse=True), sorted(accuracy, key=newest, reverse=True)


def measured(results, engine, device_class, like=None):
    """The engine's latest benchmark and accuracy run on the class, preferring a benchmark of
    the scenario and batch size of `like` (the candidate's) and an evaluation on its dataset;
    None when the engine has no benchmark there."""
    benchmarks, accuracy = runs_of_engine(results, engine, device_class)
    if not benchmarks:
        return None
    like = like or {}
    same = [
        run
        for run in benchmarks
        if (run.get("scenario"), run.get("batch_size"))
        == (like.get("benchmark", {}).get("scenario"), like.get("benchmark", {}).get("batch_size"))
    ]
    dataset = (like.get("accuracy") or {}).get("dataset")
    on_dataset = [run for run in accuracy if run.get("dataset") == dataset]
    return {
        "benchmark": (same or benchmarks)[0],
        "accuracy": (on_dataset or accuracy or [None])[0],
    }


def by_id(runs, run_id):
    """The run with this id, or None."""
    return next((run for run in runs if run.get("id") == run_id), None)


def candidate_of(auto_run, results):
    """The auto run's recommended build as measured: {"benchmark", "accuracy"} read from the
    results by the build's run ids, or None when the run recommends nothing."""
    recommended = auto_run.get("recommended")
    if not recommended:
        return None
    build = next(b for b in auto_run["builds"] if b["id"] == recommended["build"])
    benchmark = by_id(results.get("benchmarks", []), (build.get("benchmark") or {}).get("id"))
    if benchmark is None:
        return None
    accuracy = by_id(results.get("accuracy", []), (build.get("accuracy") or {}).get("id"))
    return {"benchmark": benchmark, "accuracy": accuracy}


def best_of_version(results, version_id, device_class):
    """The engine of a version a baseline stands for on a class: the one with the lowest p99
    among those with a benchmark there and no evaluation out of tolerance; None if none."""
    candidates = []
    for run in results.get("benchmarks", []):
        if run.get("version_id") != version_id or run.get("device_class") != device_class:
            continue
        if run.get("engine") is None or gate_p99_ms(run) is None:
            continue
        _, accuracy = runs_of_engine(results, run["engine"], device_class)
        if accuracy and accuracy[0].get("within_tolerance") is False:
            continue
        candidates.append((gate_p99_ms(run), run["engine"]))
    return min(candidates)[1] if candidates else None


def failed_builds(auto_run):
    """The auto run's failed builds, one sentence each."""
    return [
        f"{b['backend']} {b['precision']}: {(b.get('failure') or {}).get('message') or 'failed'}"
        for b in auto_run.get("builds", [])
        if b.get("state") == "failed"
    ]


def build_label(run):
    """A benchmark run's build in words: "v3 onnxruntime fp32 (engine #12)"."""
    build = f"{run.get('backend')} {run.get('precision')}"
    return f"v{run.get('version')} {build} (engine #{run.get('engine')})"


# The Markdown summary a CI system posts on the merge request.

MARKS = {
    Status.PASS: "✅ pass",
    Status.FAIL: "❌ fail",
    Status.NOISE: "〰️ within noise",
    Status.UNKNOWN: "⚠️ unknown",
    Outcome.PASSED: "✅ passed",
    Outcome.FAILED: "❌ failed",
    Outcome.UNDECIDED: "⚠️ could not decide",
}


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(title, against, limits, reports):
    """The gate's verdict as Markdown: the outcome, the limits and a table per class."""
    verdict = overall(reports)
    lines = [
        f"### DeployHub gate: {_cell(title)} — {MARKS[verdict]}",
        "",
        f"Compared with **{_cell(against)}** on each class. Limits: {limits.described()}.",
        "",
        "| Class | Criterion | Candidate | Baseline | Change | Verdict |",
        "|---|---|---|---|---|---|",
    ]
    for report in reports:
        lines += _markdown_rows(report)
    lines.append("")
    for report in reports:
        detail = f"- **{_cell(report.device_class)}**: {MARKS[report.outcome]}"
        if report.candidate:
            detail += f"; candidate {_cell(report.candidate)} against {_cell(report.baseline)}"
        if report.reason:
            detail += f". {_cell(report.reason)}"
        if report.run:
            detail += f" (auto run #{report.run['id']}: {_cell(report.run.get('page', ''))})"
        lines.append(detail)
    return "\n".join(lines) + "\n"


def _markdown_rows(report):
    slug = _cell(report.device_class)
    if not report.verdicts:
        return [f"| {slug} | — | | | | {MARKS[report.outcome]}: {_cell(report.reason)} |"]
    return [
        f"| {slug} | {v.criterion} | {_cell(v.candidate)} | {_cell(v.baseline)} | "
        f"{_cell(v.change)} | {MARKS[v.status]}: {_cell(v.reason)} |"
        for v in report.verdicts
    ]
