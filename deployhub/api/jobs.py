"""API v1: Jobs for people and pipelines: submit, list, cancel, read the log.

`POST jobs` queues each kind of job a page queues, through the same domain functions
and the same checks (the pages' forms where they have one): a compile (or the stored
engine it would build), a benchmark or a batch sweep, an evaluation, a parity check,
an export of a .pt2 or a conversion to another opset. Its body says which by "kind".
"""

import base64
import binascii
from typing import Annotated, Any, Literal

from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import HttpResponse
from django.urls import reverse
from ninja import Query, Router, Status
from ninja.pagination import paginate
from pydantic import Field

from deployhub.api.auth import BIGINT, BadInput, Conflict
from deployhub.api.forms import check_form
from deployhub.api.pipelines import JobOut, job_json
from deployhub.api.results import BenchmarkParams
from deployhub.api.v1 import ERRORS, PIPELINES, Error, Listed, Page, Schema, Strict, answers
from deployhub.benchmarks.actions import BenchmarkRefused, submit_benchmark
from deployhub.benchmarks.forms import BenchmarkForm
from deployhub.conversions.actions import (
    ConversionRefused,
    conversion_class,
    submit_convert,
    submit_export,
)
from deployhub.engines.access import get_engine_for_user
from deployhub.engines.actions import BuildRefused, request_compile
from deployhub.engines.forms import EvaluateForm
from deployhub.evaluation.actions import EvaluationRefused, request_evaluation
from deployhub.jobs.access import get_job_for_user
from deployhub.jobs.actions import JobConflict, cancel_job
from deployhub.jobs.models import Job, JobKind, JobState
from deployhub.parity.actions import submit_parity
from deployhub.registry.access import get_version_for_user
from deployhub.registry.datasets import DatasetError
from deployhub.registry.inspect import InvalidModel
from deployhub.registry.models import VersionFormat
from deployhub.teams.access import require_role, teams_of
from deployhub.teams.models import Role
from workers.backends.known import DEFAULT_BACKEND
from workers.checks.parity import PackError

router = Router(tags=["jobs"])

Id = Annotated[int, Field(ge=1, le=BIGINT)]
Slug = Annotated[str, Field(min_length=1, max_length=50)]
StateName = Literal[tuple(value for value, _ in JobState.choices())]
KindName = Literal[tuple(value for value, _ in JobKind.choices())]


class CompileIn(Strict):
    """Compile a version for a device class; the engine store answers at once when it holds
    the same build for the class's toolchain."""

    kind: Literal["compile"]
    model_version: Id
    device_class: Slug
    backend: str = Field(DEFAULT_BACKEND, max_length=50)
    build_config: dict[str, Any] = {}


class BenchmarkIn(Strict):
    """Benchmark a version on one of its team's classes, or an engine on its own class."""

    kind: Literal["benchmark"]
    model_version: Id | None = None
    engine: Id | None = None
    device_class: Slug | None = None
    params: BenchmarkParams = Field(default_factory=BenchmarkParams)


class SweepIn(BenchmarkIn):
    """A benchmark with the batch sweep on: batch 1, 2, 4 ... up to the contract's largest."""

    kind: Literal["batch-sweep"]


class EvaluateIn(Strict):
    """Evaluate an engine against its FP32 source: on a dataset of its model, a golden set
    of its version, or both."""

    kind: Literal["evaluate"]
    engine: Id
    dataset: Id | None = None
    golden_set: Id | None = None
    max_samples: int = Field(1000, ge=1, le=100_000)


class PackIn(Strict):
    """A parity pack (.zip) carried in the JSON body."""

    filename: str = Field(min_length=1, max_length=200)
    content_base64: str = Field(min_length=1)


class ParityIn(Strict):
    """Check a version's preprocessing spec against a parity pack on a device class."""

    kind: Literal["parity"]
    model_version: Id
    device_class: Slug | None = None
    tolerance: float | None = Field(None, gt=0, le=1e300)
    pack: PackIn


class ExportIn(Strict):
    """Export a .pt2 version to ONNX, or convert an ONNX version to another opset: either
    way a job that stores a child version."""

    kind: Literal["export"]
    model_version: Id
    device_class: Slug | None = None
    opset: int | None = Field(None, ge=1, le=1000)


JobIn = Annotated[
    CompileIn | BenchmarkIn | SweepIn | EvaluateIn | ParityIn | ExportIn,
    Field(discriminator="kind"),
]


class SubmittedOut(Schema):
    job: JobOut | None
    reused: bool
    engine: int | None
    parity_run: int | None


class JobFilters(Schema):
    state: StateName | None = None
    kind: KindName | None = None
    device_class: str | None = Field(None, max_length=50)
    model_version: Id | None = None


@router.post(
    "jobs",
    response={200: SubmittedOut, **answers(SubmittedOut, status=202)},
    auth=PIPELINES,
    url_name="api_jobs",
)
def jobs_submit(request, response: HttpResponse, payload: JobIn):
    """Queue a job of any kind a page queues (an engineer of the team of what it runs on);
    202 with the job, whose URL is also the Location header. A compile the engine store
    holds already is answered 200 with that engine, and queues nothing."""
    engine, job, parity_run = SUBMIT[payload.kind](request, payload)
    if job is None:
        return Status(200, {"job": None, "reused": True, "engine": engine.pk, "parity_run": None})
    response["Location"] = request.build_absolute_uri(reverse("api_job", args=[job.pk]))
    body = {"job": job_json(request, job), "reused": False, "engine": job.engine_id}
    return Status(202, {**body, "parity_run": parity_run})


def _team_class(team, slug, required=True):
    """Return the team's device class with this slug; None when none is named and none is
    required; raise BadInput for one the team does not have."""
    if not slug:
        if required:
            raise BadInput("Say 'device_class': the slug of one of the team's device classes.")
        return None
    device_class = team.device_classes.filter(slug=slug).first()
    if device_class is None:
        known = ", ".join(team.device_classes.values_list("slug", flat=True)) or "none"
        raise BadInput(f"'device_class': {team} has no device class {slug!r}; it has: {known}.")
    return device_class


def _version(request, pk):
    """The caller's team's version, which an engineer of its team may build on."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    return version


def _compile(request, payload):
    version = _version(request, payload.model_version)
    device_class = _team_class(version.team, payload.device_class)
    try:
        engine, job = request_compile(
            version, device_class, payload.backend, payload.build_config, request.user
        )
    except BuildRefused as exc:
        raise BadInput(str(exc)) from exc
    return engine, job, None


def _benchmark(request, payload, sweep=False):
    """Queue a benchmark through the page's form: a version's on a class, or an engine's."""
    if (payload.model_version is None) == (payload.engine is None):
        raise BadInput("Say either 'model_version' or 'engine' (an engine runs on its own class).")
    engine = get_engine_for_user(request, payload.engine) if payload.engine else None
    version = engine.model_version if engine else None
    version = version or get_version_for_user(request, payload.model_version)
    require_role(request.user, version.team, Role.ENGINEER)
    if engine and payload.device_class not in (None, engine.device_class.slug):
        raise BadInput(f"'device_class': the engine runs on {engine.device_class.slug} only.")
    data = payload.params.model_dump(exclude_none=True) | ({"batch_sweep": True} if sweep else {})
    fixed = engine.device_class if engine else None
    if not engine:
        data["device_class"] = _team_class(version.team, payload.device_class).pk
    form = BenchmarkForm(data, team=version.team, version=version, device_class=fixed)
    check_form(form, "Benchmark not queued", prefix="params.")
    try:
        return None, submit_benchmark(form, request.user, version, engine=engine), None
    except BenchmarkRefused as exc:
        raise BadInput(str(exc)) from exc


def _evaluate(request, payload):
    engine = get_engine_for_user(request, payload.engine)
    require_role(request.user, engine.team, Role.ENGINEER)
    fields = ("dataset", "golden_set", "max_samples")
    form = EvaluateForm({name: getattr(payload, name) for name in fields}, engine=engine)
    check_form(form, "Evaluation not queued")
    data = form.cleaned_data
    try:
        job = request_evaluation(
            engine,
            request.user,
            dataset=data["dataset"],
            golden_set=data["golden_set"],
            max_samples=data["max_samples"],
        )
    except EvaluationRefused as exc:
        raise BadInput(str(exc)) from exc
    return None, job, None


def _parity(request, payload):
    version = _version(request, payload.model_version)
    device_class = _team_class(version.team, payload.device_class, required=False)
    try:
        content = base64.b64decode(payload.pack.content_base64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadInput("'pack.content_base64' is not base64.") from exc
    pack = SimpleUploadedFile(payload.pack.filename, content)
    try:
        run = submit_parity(
            version, pack, request.user, device_class=device_class, tolerance=payload.tolerance
        )
    except (PackError, InvalidModel, DatasetError) as exc:
        raise BadInput(f"'pack': {exc}") from exc
    return None, run.job, run.pk


def _export(request, payload):
    """A .pt2 is exported to ONNX; an ONNX version is converted to the opset asked for."""
    version = _version(request, payload.model_version)
    device_class = _team_class(version.team, payload.device_class, required=False)
    if version.format == VersionFormat.PT2:
        if payload.opset is not None:
            raise BadInput("'opset': a .pt2 is exported at the hub's opset; convert its child.")
        device_class = conversion_class(version, device_class)
        if device_class is None:
            raise BadInput("No device class to export on: register one, then export.")
        return None, submit_export(version, device_class, request.user), None
    try:
        return None, submit_convert(version, device_class, request.user, payload.opset), None
    except ConversionRefused as exc:
        raise BadInput(str(exc)) from exc


SUBMIT = {
    "compile": _compile,
    "benchmark": _benchmark,
    "batch-sweep": lambda request, payload: _benchmark(request, payload, sweep=True),
    "evaluate": _evaluate,
    "parity": _parity,
    "export": _export,
}


@router.get("jobs", response=answers(list[JobOut]), auth=PIPELINES, url_name="api_jobs_list")
@paginate(Page)
def jobs_list(request, filters: Query[JobFilters]):
    """The jobs of the caller's teams, newest first, filtered by ?state=, ?kind=,
    ?device_class= (a slug) and ?model_version= (an id)."""
    jobs = Job.objects.filter(team__in=teams_of(request.user))
    if filters.state:
        jobs = jobs.filter(state=filters.state)
    if filters.kind:
        jobs = jobs.filter(kind=filters.kind)
    if filters.device_class:
        jobs = jobs.filter(device_class__slug=filters.device_class)
    if filters.model_version:
        jobs = jobs.filter(model_version_id=filters.model_version)
    jobs = jobs.select_related("device_class", "device").order_by("-created_at", "-id")
    return Listed(jobs, lambda job: job_json(request, job))


@router.post(
    "jobs/{int:pk}/cancel", response=answers(JobOut, also=(409,)), url_name="api_job_cancel"
)
def job_cancel(request, pk: int):
    """Cancel a queued job now, or ask the device running it to stop (an engineer of its
    team, as on the job's page); 409 when it has finished already."""
    job = get_job_for_user(request, pk)
    require_role(request.user, job.team, Role.ENGINEER)
    try:
        cancel_job(job.pk, request.user)
    except JobConflict as exc:
        raise Conflict(str(exc), {"job": job.pk, "state": job.state}) from exc
    return job_json(request, get_job_for_user(request, pk))


LOG_ANSWER = {
    "responses": {
        200: {
            "description": "The job's whole log.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    }
}


@router.get(
    "jobs/{int:pk}/log",
    response={code: Error for code in ERRORS},  # its 200 is text: LOG_ANSWER
    auth=PIPELINES,
    url_name="api_job_log",
    openapi_extra=LOG_ANSWER,
)
def job_log(request, pk: int):
    """The job's whole log, as plain text (GET jobs/<id> has its last 50 lines)."""
    job = get_job_for_user(request, pk)
    return HttpResponse(job.log, content_type="text/plain; charset=utf-8")
