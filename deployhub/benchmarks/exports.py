"""A model's results as rows and JSON: every version's benchmark and accuracy runs.

One definition per table (`EXPORTS`: its columns and its rows) serves both the
CSVs and the HTML report's data tables, so the two always name the same columns.
"""

import csv
import hashlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass

from django.core.cache import caches
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Count, Max, Q
from django.urls import get_script_prefix

from deployhub.benchmarks.models import BenchmarkRun, engine_precision
from deployhub.benchmarks.results import PERCENTILES
from deployhub.devices.models import DeviceClass
from deployhub.evaluation.models import AccuracyRun

# The run's own fields copied into a row as they are, in two runs of columns.
CONDITIONS = [
    "scenario",
    "batch_size",
    "warmup_s",
    "duration_s",
    "warmup_iterations",
    "iterations",
    "intra_op_threads",
    *(f"latency_{key}_ms" for key in PERCENTILES),
    "throughput_ips",
]
FIGURES = [
    "cv",
    "drift",
    "server_target_qps",
    "server_achieved_qps",
    "server_p99_ms",
    "max_qps_in_budget",
    "offline_samples",
    "offline_wall_s",
    "offline_throughput_ips",
    "peak_rss_mb",
    "rss_growth_mb",
    "peak_device_memory_mb",
    "host_cpu_model",
    "host_logical_cpus",
]
COPIED = ["backend", "provider", *CONDITIONS, "stable", *FIGURES]

BENCHMARK_COLUMNS = [
    "id",
    "job",
    "version",
    "version_id",
    "device_class",
    "serving_pattern",
    "device",
    "engine",
    "backend",
    "provider",
    "precision",
    *CONDITIONS,
    "sustained_throughput_ips",
    "fps_at_p99",
    "gate",
    "gate_reason",
    "stable",
    "stability_reasons",
    *FIGURES,
    "created_at",
]

ACCURACY_COLUMNS = [
    "id",
    "job",
    "version",
    "version_id",
    "device_class",
    "engine",
    "backend",
    "precision",
    "dataset",
    "samples",
    "task",
    "headline",
    "headline_value",
    "metric",
    "reference_metric",
    "engine_metric",
    "drop_points",
    "agreement_metric",
    "agreement",
    "reference_top1",
    "top1",
    "reference_top5",
    "top5",
    "top1_drop_points",
    "tolerance_points",
    "within_tolerance",
    "top1_agreement",
    "max_abs_error",
    "mean_abs_error",
    "cosine_min",
    "cosine_mean",
    "created_at",
]


def benchmark_row(run):
    """Return a benchmark run as one flat row (the CSV's columns)."""
    gate = run.gate()
    return {
        "id": run.pk,
        "job": run.job_id,
        "version": run.model_version.number,
        "version_id": run.model_version_id,
        "device_class": run.device_class.slug,
        "serving_pattern": run.device_class.serving_pattern,
        "device": run.device.name if run.device else None,
        "engine": run.engine_id,
        "precision": run.precision,
        **{field: getattr(run, field) for field in COPIED},
        "sustained_throughput_ips": run.gate_throughput_ips,
        "fps_at_p99": run.fps_at_p99,
        "gate": gate.verdict,
        "gate_reason": gate.reason,
        "stability_reasons": "; ".join(run.stability_reasons),
        "created_at": run.created_at.isoformat(),
    }


def benchmark_json(run):
    """Return a benchmark run as JSON: its flat row plus the nested blocks the worker sent."""
    gate = run.gate()
    return {
        **benchmark_row(run),
        "gate": {"verdict": gate.verdict, "label": gate.label, "reason": gate.reason},
        "stability": {**(run.stability or {}), "stable": run.stable, "cv": run.cv},
        "latency_ms": {key: getattr(run, f"latency_{key}_ms") for key in PERCENTILES},
        "server": run.server,
        "batch_sweep": run.batch_sweep,
        "host": run.host,
        "gpu": run.gpu,
        "url": run.job_url,
    }


ACCURACY_COPIED = [
    "samples",
    "reference_top1",
    "top1",
    "reference_top5",
    "top5",
    "top1_agreement",
    "max_abs_error",
    "mean_abs_error",
    "cosine_min",
    "cosine_mean",
]


def accuracy_row(run):
    """Return an accuracy run as one flat row (the CSV's columns)."""
    engine = run.engine
    return {
        "id": run.pk,
        "job": run.job_id,
        "version": engine.model_version.number,
        "version_id": engine.model_version_id,
        "device_class": engine.device_class.slug,
        "engine": engine.pk,
        "backend": engine.backend,
        "precision": engine_precision(engine),
        "dataset": run.dataset.name if run.dataset else None,
        **{field: getattr(run, field) for field in ACCURACY_COPIED},
        **task_figures(run),
        "top1_drop_points": run.metric_drop_points if run.metric == "top1" else None,
        "tolerance_points": engine.device_class.tolerance_for(run.task).drop,
        "within_tolerance": run.within_tolerance,
        "created_at": run.created_at.isoformat(),
    }


def task_figures(run):
    """Return what an accuracy run is judged on, by name: its task's headline and agreement."""
    return {
        "task": run.task,
        "headline": run.headline,
        "headline_value": run.headline_value,
        "metric": run.metric if run.labelled else None,
        "reference_metric": run.reference_value,
        "engine_metric": run.engine_value,
        "drop_points": run.metric_drop_points,
        "agreement_metric": run.agreement_metric or "top1_agreement",
        "agreement": run.agreement_value,
    }


# One row per (run, batch size) of a run's batch sweep: a long table a spreadsheet can
# pivot or chart (throughput against batch size) whatever sizes each run swept.
SWEEP_RUN_COLUMNS = [
    "run",
    "job",
    "version",
    "version_id",
    "device_class",
    "serving_pattern",
    "engine",
    "backend",
    "precision",
    "stable",
]
SWEEP_COLUMNS = [
    *SWEEP_RUN_COLUMNS,
    "batch_size",
    "throughput_ips",
    *(f"latency_{key}_ms" for key in PERCENTILES),
    "per_image_p50_ms",
    "per_image_p99_ms",
    "cv",
    "created_at",
]


def _per_image(latency, key, batch_size):
    value = latency.get(key)
    return value / batch_size if value is not None else None


def sweep_rows(run):
    """Return a run's batch sweep as flat rows, one per batch size (the CSV's columns)."""
    rows = []
    for point in sorted(run.batch_sweep or [], key=lambda point: point["batch_size"]):
        latency, batch = point.get("latency_ms") or {}, point["batch_size"]
        rows.append(
            {
                "run": run.pk,
                "job": run.job_id,
                "version": run.model_version.number,
                "version_id": run.model_version_id,
                "device_class": run.device_class.slug,
                "serving_pattern": run.device_class.serving_pattern,
                "engine": run.engine_id,
                "backend": run.backend,
                "precision": run.precision,
                "stable": run.stable,
                "batch_size": batch,
                "throughput_ips": point.get("throughput_ips"),
                **{f"latency_{key}_ms": latency.get(key) for key in PERCENTILES},
                "per_image_p50_ms": _per_image(latency, "p50", batch),
                "per_image_p99_ms": _per_image(latency, "p99", batch),
                "cv": point.get("cv"),
                "created_at": run.created_at.isoformat(),
            }
        )
    return rows


@dataclass(frozen=True)
class Export:
    """One exported table: the CSV `<kind>.csv` and the report's table of the same columns."""

    kind: str
    title: str
    columns: list
    reads: str  # "benchmarks" or "accuracy": which runs its rows come from
    to_rows: Callable  # run -> list of rows

    def rows(self, runs):
        return [row for run in runs for row in self.to_rows(run)]


EXPORTS = {
    export.kind: export
    for export in (
        Export(
            "benchmarks",
            "Benchmark runs",
            BENCHMARK_COLUMNS,
            "benchmarks",
            lambda run: [benchmark_row(run)],
        ),
        Export("batch-sweep", "Batch sweeps", SWEEP_COLUMNS, "benchmarks", sweep_rows),
        Export(
            "accuracy",
            "Accuracy runs",
            ACCURACY_COLUMNS,
            "accuracy",
            lambda run: [accuracy_row(run)],
        ),
    )
}


@dataclass(frozen=True)
class Table:
    """An export's rows, as the report draws them: a header and cells in column order."""

    export: Export
    rows: list

    @property
    def cells(self):
        return [[row.get(key) for key in self.export.columns] for row in self.rows]


def export_tables(runs, accuracy_runs):
    """Return every export's table of these runs, in the CSVs' columns (for the report)."""
    sources = {"benchmarks": runs, "accuracy": accuracy_runs}
    return [Table(export, export.rows(sources[export.reads])) for export in EXPORTS.values()]


def model_results(model):
    """Return every benchmark and accuracy run of the model's versions, as JSON."""
    return {
        "model": {"id": model.pk, "name": model.name, "team": model.team.slug},
        "versions": [
            {"id": v.pk, "number": v.number, "sha256": v.sha256, "format": v.format}
            for v in model.versions.order_by("number")
        ],
        "benchmarks": [benchmark_json(run) for run in BenchmarkRun.objects.for_model(model)],
        "accuracy": [accuracy_row(run) for run in AccuracyRun.objects.for_model(model)],
    }


def results_revision(model):
    """Return a key that changes whenever the model's results JSON would, from a few small
    queries (the JSON reads every run: 160 ms of CPU for 1,200 runs).

    Runs are never edited (not even in the admin), only added and deleted: their count,
    newest id and newest time stand for them. What a run shows of other rows is read here
    whole: the model's name and team, the versions, the device classes of its runs and
    engines (slugs and every budget a gate reads), the runs' devices, the engines, the
    datasets, and the URL prefix its job links start with.
    """
    runs = BenchmarkRun.objects.filter(model_version__model=model).order_by()
    accuracy = AccuracyRun.objects.filter(engine__model_version__model=model).order_by()
    totals = (Count("pk"), Max("pk"), Max("created_at"))
    class_fields = [field.attname for field in DeviceClass._meta.concrete_fields]
    classes = DeviceClass.objects.filter(
        Q(pk__in=runs.values("device_class_id"))
        | Q(pk__in=model.versions.values("engines__device_class_id"))
    )
    made_of = [
        model.pk,
        model.name,
        model.team.slug,
        get_script_prefix(),
        runs.aggregate(*totals),
        accuracy.aggregate(*totals),
        list(model.versions.order_by("pk").values_list("pk", "number", "sha256", "format")),
        list(classes.order_by("pk").values_list(*class_fields)),
        sorted(runs.values_list("device_id", "device__name").distinct(), key=str),
        list(
            model.versions.filter(engines__isnull=False)
            .order_by("engines__pk")
            .values_list("engines__pk", "engines__backend", "engines__build_config")
        ),
        sorted(accuracy.values_list("dataset_id", "dataset__name").distinct(), key=str),
    ]
    return hashlib.sha256(repr(made_of).encode()).hexdigest()


def model_results_body(model):
    """Return the model's results JSON (model_results) as bytes: from the results cache
    (settings.CACHES, per process, one body per model) while its revision holds, else built
    and kept.

    A body is kept only when the revision read after building it is the one read before:
    a change that commits meanwhile is in the body or not, and a change undone later
    could bring back the key of either. A body over RESULTS_CACHE_MAX_BYTES is built anew
    each time: a few of those would hold a process's memory.
    """
    cache, key = caches["results"], f"model-results:{model.pk}"
    revision = results_revision(model)
    kept_revision, body = cache.get(key, (None, None))
    if kept_revision != revision:
        body = json.dumps(model_results(model), cls=DjangoJSONEncoder).encode()
        if len(body) <= RESULTS_CACHE_MAX_BYTES and results_revision(model) == revision:
            cache.set(key, (revision, body))  # one body per model: the older goes
    return body


RESULTS_CACHE_MAX_BYTES = 16 * 1024 * 1024  # about 9,000 runs


def _cell(value):
    # A text cell starting with = + - @ is a formula to a spreadsheet: quote it.
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@"):
        return "'" + value
    return "" if value is None else value


def csv_text(rows, columns):
    """Return rows (dicts) as CSV text with a header of `columns`."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: _cell(row.get(key)) for key in columns})
    return out.getvalue()


def _runs_of(model, reads):
    if reads == "accuracy":
        return AccuracyRun.objects.for_model(model)
    return BenchmarkRun.objects.for_model(model)


def model_csv(model, kind, keep=None):
    """Return the model's `kind` export as CSV, only the rows `keep` keeps when given;
    KeyError for a kind EXPORTS does not know."""
    export = EXPORTS[kind]
    rows = export.rows(_runs_of(model, export.reads))
    return csv_text([row for row in rows if keep(row)] if keep else rows, export.columns)


def benchmarks_csv(model):
    """Return the model's benchmark runs as CSV."""
    return model_csv(model, "benchmarks")


def accuracy_csv(model):
    """Return the model's accuracy runs as CSV."""
    return model_csv(model, "accuracy")
