"""API v1 for pipelines: start auto mode, follow its run and its jobs, list device classes.

People's API tokens and the team rules of the rest of /api/v1/: another team's
objects are 404, a viewer reads but does not start auto mode. GET jobs/<id> is
for people; the device protocol under jobs/<id>/ (claim, heartbeat, ...) is not.
"""

from typing import Any

from django.http import HttpResponse
from django.urls import reverse
from ninja import Query, Router, Status
from ninja.pagination import paginate

from deployhub.api.auth import BadInput
from deployhub.api.v1 import PIPELINES, Listed, Page, Schema, Strict, answers
from deployhub.benchmarks.exports import ACCURACY_COPIED, task_figures
from deployhub.devices.models import DeviceClass
from deployhub.engines import auto
from deployhub.engines.access import get_auto_run_for_user
from deployhub.jobs.access import get_job_for_user
from deployhub.jobs.models import JobKind
from deployhub.registry.access import get_version_for_user
from deployhub.teams.access import require_role, teams_of
from deployhub.teams.models import Role
from workers.tasks import TASKS

LOG_TAIL_LINES = 50

router = Router(tags=["pipelines"])


class AutoIn(Strict):
    device_class: str


class AutoStarted(Schema):
    id: int
    state: str
    url: str
    page: str


class AutoStartedOut(Schema):
    auto_run: AutoStarted


class AutoRunOut(Schema):
    id: int
    url: str
    page: str
    model_version: int
    converted_from: int | None
    convert_job: int | None
    device_class: str
    dataset: dict[str, Any] | None
    state: str
    outcome: str
    outcome_label: str
    summary: str
    builds: list[dict[str, Any]]
    recommended: dict[str, Any] | None
    compare_job: int | None
    created_by: str | None
    created_at: str | None
    finished_at: str | None


class JobOut(Schema):
    id: int
    kind: str
    state: str
    progress: float
    message: str
    attempt: int
    failure_category: str | None
    error: str
    log_tail: str
    page: str
    params: dict[str, Any]
    device_class: str
    device: str | None
    model_version: int | None
    model_version_url: str | None
    engine: int | None
    engine_url: str | None
    created_at: str | None
    sent_at: str | None
    started_at: str | None
    finished_at: str | None


class DeviceClassOut(Schema):
    id: int
    slug: str
    name: str
    team: str
    serving_pattern: str
    budget: dict[str, Any]
    memory_limit_mb: int | None
    accuracy_tolerance_points: float
    task_tolerances: dict[str, Any]
    backends: list[str]
    online_devices: list[str]


def _absolute(request, name, pk):
    return request.build_absolute_uri(reverse(name, args=[pk]))


def _time(value):
    return value.isoformat() if value else None


@router.post(
    "versions/{int:pk}/auto",
    response=answers(AutoStartedOut, status=202),
    auth=PIPELINES,
    url_name="api_version_auto",
)
def version_auto(request, response: HttpResponse, pk: int, payload: AutoIn):
    """Start auto mode on the version on one of its team's device classes (an engineer);
    202 with the run, whose URL is also the Location header."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    device_class = _device_class_of(version, payload.device_class)
    try:
        run = auto.start(version, device_class, request.user)
    except auto.AutoRefused as exc:
        raise BadInput(str(exc)) from exc
    url = _absolute(request, "api_auto_run", run.pk)
    response["Location"] = url
    body = {"id": run.pk, "state": run.state, "url": url, "page": run.get_absolute_url()}
    return Status(202, {"auto_run": body})


def _device_class_of(version, slug):
    """Return the version's team's class named by slug; raise BadInput otherwise."""
    if not slug:
        raise BadInput('Say which device class to run on: {"device_class": "<slug>"}.')
    device_class = version.team.device_classes.filter(slug=slug).first()
    if device_class is None:
        known = ", ".join(version.team.device_classes.values_list("slug", flat=True)) or "none"
        raise BadInput(f"{version.team} has no device class {slug!r}; it has: {known}.")
    return device_class


class AutoRunListed(Schema):
    id: int
    url: str
    page: str
    device_class: str
    state: str
    outcome: str
    outcome_label: str
    created_at: str | None
    finished_at: str | None


class AutoRunFilters(Schema):
    device_class: str | None = None


@router.get(
    "versions/{int:pk}/auto-runs",
    response=answers(list[AutoRunListed]),
    auth=PIPELINES,
    url_name="api_version_auto_runs",
)
@paginate(Page)
def version_auto_runs(request, pk: int, filters: Query[AutoRunFilters]):
    """The version's auto runs, newest first; ?device_class=<slug> keeps one class's. A gate
    waits for a run already started instead of starting another."""
    version = get_version_for_user(request, pk)
    runs = version.auto_runs.select_related("device_class").order_by("-created_at", "-id")
    if filters.device_class:
        runs = runs.filter(device_class__slug=filters.device_class)
    return Listed(runs, lambda run: auto_run_listed(request, run))


def auto_run_listed(request, run):
    return {
        "id": run.pk,
        "url": _absolute(request, "api_auto_run", run.pk),
        "page": run.get_absolute_url(),
        "device_class": run.device_class.slug,
        "state": run.state,
        "outcome": run.outcome,
        "outcome_label": run.outcome_label,
        "created_at": _time(run.created_at),
        "finished_at": _time(run.finished_at),
    }


@router.get(
    "auto-runs/{int:pk}", response=answers(AutoRunOut), auth=PIPELINES, url_name="api_auto_run"
)
def auto_run_detail(request, pk: int):
    """The run's state, every build with its jobs and figures, and the recommended build."""
    return auto_run_json(request, get_auto_run_for_user(request, pk))


def auto_run_json(request, run):
    builds = run.builds.select_related(
        "engine", "compile_job", "benchmark_job__benchmark", "evaluate_job__accuracy"
    )
    return {
        "id": run.pk,
        "url": _absolute(request, "api_auto_run", run.pk),
        "page": run.get_absolute_url(),
        "model_version": run.model_version_id,
        "converted_from": run.converted_from_id,
        "convert_job": run.convert_job_id,
        "device_class": run.device_class.slug,
        "dataset": {"id": run.dataset_id, "name": run.dataset.name} if run.dataset else None,
        "state": run.state,
        "outcome": run.outcome,
        "outcome_label": run.outcome_label,
        "summary": run.summary,
        "builds": [build_json(build) for build in builds],
        "recommended": _recommended(run),
        "compare_job": run.compare_job_id,
        "created_by": run.created_by.username if run.created_by else None,
        "created_at": _time(run.created_at),
        "finished_at": _time(run.finished_at),
    }


def build_state(build):
    """Return where a build stands: skipped, failed, done (measured) or running."""
    if build.skipped:
        return "skipped"
    if build.error:
        return "failed"
    return "done" if build.finished else "running"


def build_json(build):
    failed = build.failed_job
    return {
        "id": build.pk,
        "backend": build.backend,
        "precision": build.precision,
        "build_config": build.build_config,
        "state": build_state(build),
        "skipped": build.skipped or None,
        "failure": {
            "job": failed.pk if failed else None,
            "category": (failed.failure_category or None) if failed else None,
            "label": build.failure_label,
            "message": build.error,
        }
        if build.error
        else None,
        "jobs": {
            JobKind.COMPILE: build.compile_job_id,
            JobKind.BENCHMARK: build.benchmark_job_id,
            JobKind.EVALUATE: build.evaluate_job_id,
        },
        "engine": build.engine_id,
        "quantised_nothing": build.engine.quantised_nothing if build.engine else None,
        "benchmark": _benchmark_json(build.benchmark),
        "accuracy": _accuracy_json(build.accuracy, build.golden),
        "side_by_side_ms": build.side_by_side_ms,
        "meets_budget": build.meets_budget,
        "within_tolerance": build.within_tolerance,
        "pareto": build.pareto,
    }


def _benchmark_json(run):
    if run is None:
        return None
    gate = run.gate()
    return {
        "id": run.pk,
        "scenario": run.scenario,
        "batch_size": run.batch_size,
        "p50_ms": run.latency_p50_ms,
        "p99_ms": run.latency_p99_ms,
        "throughput_ips": run.gate_throughput_ips,
        "stable": run.stable,
        "gate": {"verdict": gate.verdict, "reason": gate.reason},
    }


def _accuracy_json(run, golden):
    if run is None:
        return None
    return {
        "id": run.pk,
        **{field: getattr(run, field) for field in ACCURACY_COPIED},
        **task_figures(run),
        "top1_drop_points": run.metric_drop_points if run.metric == "top1" else None,
        "within_tolerance": run.within_tolerance,
        "golden_passed": golden.passed if golden else None,
    }


def _recommended(run):
    """Return the recommended build's engine and why it won, or None."""
    best = run.recommended
    if best is None:
        return None
    return {
        "build": best.pk,
        "engine": best.engine_id,
        "backend": best.backend,
        "precision": best.precision,
        "reason": recommendation_reason(best),
    }


def recommendation_reason(build):
    """Say why auto mode named this build, gate and side-by-side run included."""
    speed = "timed side by side" if build.side_by_side_ms is not None else "measured"
    gate = {
        True: "meets the class's gate",
        False: "misses the class's gate, as every build within tolerance does",
    }.get(build.meets_budget, "was not judged by the class's gate (unstable or unjudgeable run)")
    return f"The fastest build {speed} within the accuracy tolerance; it {gate}."


@router.get("jobs/{int:pk}", response=answers(JobOut), auth=PIPELINES, url_name="api_job")
def job_detail(request, pk: int):
    """A job's kind, state, progress, failure, log tail, timestamps and what it ran on."""
    return job_json(request, get_job_for_user(request, pk))


def job_json(request, job):
    version, engine = job.model_version_id, job.engine_id
    return {
        "id": job.pk,
        "kind": job.kind,
        "state": job.state,
        "progress": job.progress,
        "message": job.message,
        "attempt": job.attempt,
        "failure_category": job.failure_category or None,
        "error": job.error,
        "log_tail": "".join(job.log.splitlines(keepends=True)[-LOG_TAIL_LINES:]),
        "page": request.build_absolute_uri(job.get_absolute_url()),
        "params": job.params,
        "device_class": job.device_class.slug,
        "device": job.device.name if job.device else None,
        "model_version": version,
        "model_version_url": _absolute(request, "api_version", version) if version else None,
        "engine": engine,
        "engine_url": _absolute(request, "api_engine", engine) if engine else None,
        "created_at": _time(job.created_at),
        "sent_at": _time(job.sent_at),
        "started_at": _time(job.started_at),
        "finished_at": _time(job.finished_at),
    }


@router.get(
    "device-classes",
    response=answers(list[DeviceClassOut]),
    auth=PIPELINES,
    url_name="api_device_classes",
)
@paginate(Page)
def device_classes(request):
    """The device classes of the caller's teams: serving pattern, budget, backends, devices."""
    classes = DeviceClass.objects.filter(team__in=teams_of(request.user)).select_related("team")
    return Listed(classes.order_by("team__slug", "slug"), device_class_json)


def device_class_json(device_class):
    return {
        "id": device_class.pk,
        "slug": device_class.slug,
        "name": device_class.name,
        "team": device_class.team.slug,
        "serving_pattern": device_class.serving_pattern,
        "budget": {
            "frame_budget_ms": device_class.frame_budget_ms,
            "fps": device_class.budget_fps,
            "throughput_target_ips": device_class.throughput_target_ips,
            "batch_latency_ceiling_ms": device_class.batch_latency_ceiling_ms,
            "gate": device_class.gate_rule,
        },
        "memory_limit_mb": device_class.memory_limit_mb,
        "accuracy_tolerance_points": device_class.accuracy_tolerance,
        "task_tolerances": {task: device_class.tolerance_for(task)._asdict() for task in TASKS},
        "backends": device_class.backends,
        "online_devices": [device.name for device in device_class.online_devices()],
    }
