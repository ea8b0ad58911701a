"""API v1 for people and pipelines: queue benchmarks, read results, export a model's results.

Every call that reads results takes the same filters (ResultFilters), named after the
fields of the rows it answers: ?device_class=<slug>&backend=&precision=&vmin=&vmax=.
"""

import json
from typing import Any

from django.http import HttpResponse, JsonResponse
from ninja import Field, Query, Router, Status
from ninja.pagination import paginate
from pydantic import ConfigDict

from deployhub.api.auth import BIGINT, BadInput, json_body
from deployhub.api.v1 import ERRORS, PIPELINES, Error, Page, Schema, Strict, answers, file_answer
from deployhub.benchmarks.actions import BenchmarkRefused, submit_benchmark
from deployhub.benchmarks.exports import EXPORTS, benchmark_json, model_csv, model_results_body
from deployhub.benchmarks.forms import BenchmarkForm
from deployhub.benchmarks.models import BenchmarkRun
from deployhub.benchmarks.reports import model_report as build_report
from deployhub.benchmarks.views import attachment
from deployhub.engines.access import get_engine_for_user
from deployhub.registry.access import get_model_for_user, get_version_for_user
from deployhub.teams.access import require_role
from deployhub.teams.models import Role

router = Router(tags=["results"])


class ResultFilters(Schema):
    """Which rows to keep, by the fields every result row carries; each of device_class,
    backend and precision may be given more than once (any of them matches)."""

    device_class: list[str] = Field(default_factory=list, description="A device class's slug.")
    backend: list[str] = Field(default_factory=list, description="onnxruntime, openvino, ...")
    precision: list[str] = Field(default_factory=list, description="fp32, fp16, bf16, int8")
    vmin: int | None = Field(None, ge=0, le=BIGINT, description="The oldest version number.")
    vmax: int | None = Field(None, ge=0, le=BIGINT, description="The newest version number.")

    @property
    def any(self):
        """Whether any filter is given (none: every row)."""
        versions = (self.vmin, self.vmax)
        return bool(self.device_class or self.backend or self.precision) or versions != (None,) * 2

    def keeps(self, row):
        """Whether a result row (a benchmark's, an accuracy run's, a sweep step's) passes."""
        version = row["version"]
        return (
            (not self.device_class or row["device_class"] in self.device_class)
            and (not self.backend or row["backend"] in self.backend)
            and (not self.precision or row["precision"] in self.precision)
            and (self.vmin is None or version >= self.vmin)
            and (self.vmax is None or version <= self.vmax)
        )

    def kept(self, rows):
        return [row for row in rows if self.keeps(row)] if self.any else list(rows)


class BenchmarkParams(Strict):
    """The benchmark form's fields, each optional: the form checks each value and answers a
    400 naming the fields it refuses (here, and in POST jobs's params)."""

    scenario: str | None = Field(
        None, max_length=20, description="single-stream (default), server, offline"
    )
    duration_s: float | None = None
    warmup_s: float | None = None
    iterations: int | None = None
    warmup_iterations: int | None = None
    batch_size: int | None = None
    batch_sweep: bool | None = None
    sweep_duration_s: float | None = None
    target_qps: float | None = None
    samples: int | None = None
    cuda_graphs: bool | None = None
    intra_op_threads: int | None = None
    cv_threshold: float | None = None
    drift_threshold: float | None = None
    stability_floor_ms: float | None = None


class BenchmarkIn(BenchmarkParams):
    """What to measure (every key optional but a version's device_class)."""

    device_class: str | int | None = Field(
        None, description="Versions only: a device class of the team, by slug or id."
    )


BENCHMARK_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": BenchmarkIn.model_json_schema()}},
    }
}


class QueuedBenchmark(Schema):
    id: int
    state: str
    params: dict[str, Any]
    url: str


class QueuedBenchmarkOut(Schema):
    job: QueuedBenchmark


class BenchmarkGateOut(Schema):
    verdict: str
    label: str
    reason: str


class BenchmarkOut(Schema):
    """A benchmark run: the flat columns of benchmarks.csv (those below and the rest of
    them), the nested blocks the worker sent, its gate and its job's page."""

    model_config = ConfigDict(extra="allow")

    id: int
    job: int
    version: int
    version_id: int
    device_class: str
    serving_pattern: str
    device: str | None
    engine: int | None
    backend: str
    precision: str
    scenario: str
    batch_size: int
    sustained_throughput_ips: float | None
    fps_at_p99: float | None
    gate: BenchmarkGateOut
    stable: bool | None
    latency_ms: dict[str, float | None]
    stability: dict[str, Any]
    server: dict[str, Any] | None
    batch_sweep: list[dict[str, Any]]
    host: dict[str, Any]
    gpu: dict[str, Any] | None
    url: str
    created_at: str


class AccuracyOut(Schema):
    """An accuracy run: the columns of accuracy.csv (those below and the rest of them)."""

    model_config = ConfigDict(extra="allow")

    id: int
    job: int
    version: int
    version_id: int
    device_class: str
    engine: int
    backend: str
    precision: str
    dataset: str | None
    samples: int
    task: str
    within_tolerance: bool | None
    created_at: str


class ResultsModel(Schema):
    id: int
    name: str
    team: str


class ResultsVersion(Schema):
    id: int
    number: int
    sha256: str
    format: str


class ModelResultsOut(Schema):
    model: ResultsModel
    versions: list[ResultsVersion]
    benchmarks: list[BenchmarkOut]
    accuracy: list[AccuracyOut]


def _form(request, version, device_class=None):
    """Check the body's params with the page's form; raise BadInput (400) naming each problem.

    The role comes first: a viewer is refused (403) whatever the body says."""
    require_role(request.user, version.team, Role.ENGINEER)
    body = json_body(request)
    if device_class is None and isinstance(body.get("device_class"), str):
        chosen = version.team.device_classes.filter(slug=body["device_class"]).first()
        body["device_class"] = chosen.pk if chosen else body["device_class"]
    form = BenchmarkForm(body, team=version.team, version=version, device_class=device_class)
    unknown = sorted(set(body) - set(form.fields))
    if unknown:
        raise BadInput(f"Unknown parameter {unknown[0]!r}; known: {', '.join(form.fields)}.")
    if not form.is_valid():
        problems = "; ".join(f"{name}: {' '.join(errors)}" for name, errors in form.errors.items())
        raise BadInput(f"Benchmark not queued: {problems}")
    return form


def _submitted(request, form, version, engine=None):
    try:
        job = submit_benchmark(form, request.user, version, engine=engine)
    except BenchmarkRefused as exc:
        raise BadInput(str(exc)) from exc
    body = {
        "id": job.pk,
        "state": job.state,
        "params": job.params,
        "url": request.build_absolute_uri(job.get_absolute_url()),
    }
    return Status(202, {"job": body})


@router.get(
    "versions/{int:pk}/benchmarks",
    response=answers(list[BenchmarkOut]),
    auth=PIPELINES,
    url_name="api_version_benchmarks",
)
@paginate(Page)
def version_benchmarks(request, pk: int, filters: Query[ResultFilters]):
    """The version's benchmark runs, newest first, each with its gate, as filtered."""
    version = get_version_for_user(request, pk)
    return filters.kept(benchmark_json(run) for run in BenchmarkRun.objects.for_version(version))


@router.post(
    "versions/{int:pk}/benchmarks",
    response=answers(QueuedBenchmarkOut, status=202),
    auth=PIPELINES,
    url_name="api_version_benchmarks",
    openapi_extra=BENCHMARK_BODY,
)
def version_benchmark(request, pk: int):
    """Queue a benchmark of the version's model on one of its team's device classes (an
    engineer); 202 with the job."""
    version = get_version_for_user(request, pk)
    return _submitted(request, _form(request, version), version)


@router.get(
    "engines/{int:pk}/benchmarks",
    response=answers(list[BenchmarkOut]),
    auth=PIPELINES,
    url_name="api_engine_benchmarks",
)
@paginate(Page)
def engine_benchmarks(request, pk: int, filters: Query[ResultFilters]):
    """The engine's benchmark runs, newest first, each with its gate, as filtered."""
    engine = get_engine_for_user(request, pk)
    runs = engine.benchmarks.select_related("model_version", "device", "device_class", "engine")
    return filters.kept(benchmark_json(run) for run in runs.order_by("-created_at", "-pk"))


@router.post(
    "engines/{int:pk}/benchmarks",
    response=answers(QueuedBenchmarkOut, status=202),
    auth=PIPELINES,
    url_name="api_engine_benchmarks",
    openapi_extra=BENCHMARK_BODY,
)
def engine_benchmark(request, pk: int):
    """Queue a benchmark of the engine on its own device class (an engineer); 202 with the
    job. The body is a version's without device_class."""
    engine = get_engine_for_user(request, pk)
    version = engine.model_version
    form = _form(request, version, device_class=engine.device_class)
    return _submitted(request, form, version, engine=engine)


@router.get(
    "models/{int:pk}/results",
    response=answers(ModelResultsOut),
    auth=PIPELINES,
    url_name="api_model_results",
)
def model_results_json(request, pk: int, filters: Query[ResultFilters]):
    """Every version's benchmark and accuracy runs of the model (results.json), as filtered."""
    body = model_results_body(get_model_for_user(request, pk))
    if not filters.any:  # the stored body as it is: no run is read again
        return HttpResponse(body, content_type="application/json")
    results = json.loads(body)
    for kind in ("benchmarks", "accuracy"):
        results[kind] = filters.kept(results[kind])
    return JsonResponse(results)


# A download's 200 is described by its openapi_extra (text/csv, text/html), its errors here.
NOT_JSON = {code: Error for code in ERRORS}
CSV_ANSWER = file_answer(
    "text/csv", "The export as CSV, one row per run (per sweep step for batch-sweep)"
)


@router.get(
    "models/{int:pk}/results/{kind}.csv",
    response=NOT_JSON,
    auth=PIPELINES,
    url_name="api_model_results_csv",
    openapi_extra=CSV_ANSWER,
)
def model_results_csv(request, pk: int, kind: str, filters: Query[ResultFilters]):
    """The model's benchmarks.csv, batch-sweep.csv or accuracy.csv, as filtered."""
    model = get_model_for_user(request, pk)
    if kind not in EXPORTS:
        return Status(404, {"error": f"No export {kind}.csv; there are {', '.join(EXPORTS)}."})
    text = model_csv(model, kind, keep=filters.keeps if filters.any else None)
    return attachment(text, "text/csv; charset=utf-8", model, f"{kind}.csv")


REPORT_ANSWER = file_answer("text/html", "A self-contained HTML report (plotly.js inlined)")


@router.get(
    "models/{int:pk}/report",
    response=NOT_JSON,
    auth=PIPELINES,
    url_name="api_model_report",
    openapi_extra=REPORT_ANSWER,
)
def model_report(request, pk: int):
    """The model's results as one self-contained HTML file with its figures, for a review."""
    model = get_model_for_user(request, pk)
    return attachment(build_report(model, request.user), "text/html", model, "report.html")
