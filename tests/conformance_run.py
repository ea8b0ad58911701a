"""Drive the conformance corpus through the hub: upload, datasets, preflight, auto mode, outcome.

Shared by tests/test_conformance.py (a live server and real workers, short
benchmarks) and scripts/conformance.py (`make conformance`, the embedded
product, longer benchmarks). Every model's auto run is started before any is
waited on, so the workers never idle. `Row` is what a run comes to for one
model: its outcome in the words the corpus uses ("recommended", "refused at
preflight: ...") or, when it reached neither, what went wrong, with the failed
builds named with their job and error.
"""

import io
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.core.files import File
from django.db.models import Max

from deployhub.engines import auto
from deployhub.engines.models import AutoRun, AutoRunState
from deployhub.engines.preflight import preflight_grid
from deployhub.jobs.actions import submit_job
from deployhub.jobs.models import Job, JobKind, JobState
from deployhub.registry.datasets import DatasetError
from deployhub.registry.inspect import InvalidModel
from deployhub.registry.models import Model
from deployhub.registry.tasks import declare_task
from deployhub.registry.uploads import create_dataset, create_version
from tests.conformance_models import RECOMMENDED, REFUSED, datasets, torch_missing

# Give up when no job has moved for this long while some wait (a broker that lost messages).
STALL_S = 240


@dataclass
class Row:
    """What the corpus run made of one model."""

    model: object  # the CorpusModel
    outcome: str = ""
    version: object = None
    run: object = None
    source_job: object = None  # the benchmark of the source file with ONNX Runtime defaults
    failures: list = field(default_factory=list)  # "backend precision (job #id): error"
    skipped: str = ""  # why the model was not run here (torch absent)

    @property
    def recommended(self):
        return self.run.recommended if self.run else None


# Short runs for auto mode in tests, which check that builds are correct, not how fast they
# are (`make conformance` and `make bench` measure with the default runs).
QUICK_BENCHMARKS = {
    "REALTIME_BENCHMARK": {
        "scenario": "single-stream",
        "batch_size": 1,
        "warmup_s": 0.05,
        "duration_s": 0.25,
    },
    "BATCH_BENCHMARK": {"scenario": "offline", "warmup_s": 0.05, "duration_s": 0.25},
    "COMPARE_BENCHMARK": {"rounds": 2, "duration_s": 0.2, "warmup_s": 0.05},
}


def start_model(model, folder, team, user, device_class, source_benchmark=False):
    """Upload a corpus model, attach its datasets, preflight it and start auto mode.

    With source_benchmark, also benchmark the source file with ONNX Runtime defaults,
    measured as auto mode measures its builds on the class.
    """
    row = Row(model)
    if model.needs_torch and (why := torch_missing()):
        row.skipped = row.outcome = f"skipped: {why}"
        return row
    path = model.write(Path(folder))
    try:
        row.version = _upload(model, path, team, user)
        if misread := _declare_task(model, row.version, user):
            row.outcome = misread
            return row
        _attach_datasets(model, path, row.version, user)
    except (InvalidModel, DatasetError) as exc:
        row.outcome = f"refused at upload: {exc}"
        return row
    refusals = _preflight_refusals(row.version, device_class)
    try:
        row.run = auto.start(row.version, device_class, user)
    except auto.AutoRefused as exc:
        row.outcome = f"auto mode refused: {exc}"
    if refusals is not None and not (row.run and row.run.convert_job):  # converted: built
        row.outcome = REFUSED + refusals
    if source_benchmark and row.outcome == "":
        row.source_job = submit_job(
            team=team,
            kind=JobKind.BENCHMARK,
            device_class=device_class,
            user=user,
            model_version=row.version,
            params=auto.benchmark_params(row.version, device_class),
        )
    return row


def _upload(model, path, team, user):
    entry = Model.objects.create(team=team, name=model.name, created_by=user)
    with open(path, "rb") as handle:
        return create_version(entry, File(handle, name=path.name), user, contract=model.contract)


def _declare_task(model, version, user):
    """Say how the version's proposed task differs from the model's; '' when it is the one.

    Then declare the params its team would add to the proposal (a recogniser's charset).
    """
    proposed = version.task or {}
    if proposed.get("task") != model.task:
        return (
            f"proposed as {proposed.get('task')!r}, not {model.task!r}: {proposed.get('why', '')}"
        )
    if model.task_params:
        params = {**proposed.get("params", {}), **model.task_params}
        declare_task(version, user, model.task, params)
    return ""


def _attach_datasets(model, path, version, user):
    calibration, validation = datasets(model, path, version.task)
    for kind, data in (("calibration", calibration), ("validation", validation)):
        upload = File(io.BytesIO(data), name=f"{kind}.npz")
        create_dataset(version, upload, user, kind=kind, name=kind)


def _preflight_refusals(version, device_class):
    """Return the reasons when preflight rules out every build of the grid, else None."""
    rows = preflight_grid(version, device_class)
    if any(not verdict.fails for _, _, verdict in rows):
        return None
    reasons = dict.fromkeys(reason for _, _, verdict in rows for reason in verdict.fails)
    return "; ".join(reasons)


def wait_for(rows, timeout, on_timeout=lambda: "", stall=STALL_S):
    """Wait until every started auto run and source benchmark has finished; return the seconds.

    Gives up after `timeout` seconds, or once no job has moved (started, heartbeaten,
    finished) for `stall` seconds while some wait: their messages are gone.
    """
    started = last_move = time.monotonic()
    seen = None
    while time.monotonic() - started < timeout:
        if all(_finished(row) for row in rows):
            return time.monotonic() - started
        if (now := _job_activity()) != seen:
            seen, last_move = now, time.monotonic()
        elif time.monotonic() - last_move > stall:
            break
        time.sleep(1)
    waiting = [row.model.name for row in rows if not _finished(row)]
    queued = Job.objects.filter(state=JobState.QUEUED).count()
    raise TimeoutError(
        f"after {time.monotonic() - started:.0f} s these models' auto runs had not finished: "
        f"{', '.join(waiting)} ({queued} jobs queued, none moved for "
        f"{time.monotonic() - last_move:.0f} s)\n" + on_timeout()
    )


def _job_activity():
    jobs = Job.objects.exclude(state=JobState.QUEUED)
    return jobs.count(), jobs.aggregate(latest=Max("lease_expires_at"))["latest"]


def _finished(row):
    if row.run is not None and AutoRun.objects.get(pk=row.run.pk).state == AutoRunState.RUNNING:
        return False
    return row.source_job is None or Job.objects.get(pk=row.source_job.pk).is_final


def conclude(row):
    """Fill in the row's outcome and failures from its finished auto run."""
    if row.run is None:
        return row
    row.run = AutoRun.objects.get(pk=row.run.pk)
    if row.source_job is not None:
        row.source_job = Job.objects.get(pk=row.source_job.pk)
    row.failures = [_failure(build) for build in row.run.builds.all() if build.error]
    if row.outcome:  # refused at preflight: no build may have been queued
        queued = [str(b) for b in row.run.builds.all() if not b.skipped]
        if queued:
            row.outcome += f" (yet auto mode queued {', '.join(queued)})"
        return row
    best = row.recommended
    if best is not None and best.within_tolerance:
        row.outcome = RECOMMENDED
    else:
        row.outcome = f"no recommendation: {row.run.summary}"
    return row


def _failure(build):
    job = build.failed_job
    where = f" (job #{job.pk}, {job.kind})" if job else ""
    return f"{build}{where}: {build.error}"


def speedup(row):
    """Return how many times faster (p50 per image) the recommended build ran than the source
    file with ONNX Runtime defaults, both measured alike on the class."""
    best, source = row.recommended, row.source_job
    if best is None or source is None or source.state != JobState.SUCCEEDED:
        return None
    source_run = getattr(source, "benchmark", None)
    if source_run is None or not best.benchmark:
        return None
    return _p50_per_image(source_run) / _p50_per_image(best.benchmark)


def _p50_per_image(benchmark):
    return benchmark.latency_p50_ms / benchmark.batch_size


def summarise(row):
    """Return the row as plain data (the database is not reachable where it is read)."""
    best = row.recommended
    return {
        "name": row.model.name,
        "features": row.model.features,
        "task": (row.version.task or {}).get("task") if row.version else row.model.task,
        "expect": row.model.expect,
        "outcome": row.outcome,
        "skipped": row.skipped,
        "build": str(best) if best else "",
        "speedup": speedup(row),
        **accuracy_of(row),
        "failures": row.failures,
        "run": row.run.pk if row.run else None,
        "summary": row.run.summary if row.run else "",
    }


def reached(result):
    """Return whether a summarised result came to the outcome its model names."""
    outcome, expect = result["outcome"], result["expect"]
    if expect == RECOMMENDED:
        return outcome == RECOMMENDED
    return outcome.startswith(REFUSED) and expect.removeprefix(REFUSED) in outcome


def accuracy_of(row):
    """Return the recommended build's evaluation in its task's terms.

    headline: the figure it is judged on ("mAP@0.5:0.95", "detection F1 vs FP32") and its
    value; drop: the labelled headline's points lost against the source (None without
    labels); agreement: the task's agreement headline; breach: how it falls outside the
    class's tolerance ('' within).
    """
    best = row.recommended
    accuracy = best.accuracy if best else None
    if accuracy is None:
        return dict.fromkeys(("headline", "headline_value", "drop", "agreement", "breach"))
    return {
        "headline": accuracy.headline,
        "headline_value": accuracy.headline_value,
        "drop": accuracy.metric_drop_points,
        "agreement": accuracy.agreement_value,
        "breach": accuracy.tolerance_breach(row.run.device_class),
    }
