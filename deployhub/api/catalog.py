"""API v1 for people and scripts: the model registry, with personal API tokens."""

from django.conf import settings
from django.http import JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_http_methods
from ninja import Router

from deployhub import json_input
from deployhub.api.auth import (
    BadInput,
    Conflict,
    field_length,
    for_pipelines,
    json_body,
    text,
    token_required,
)
from deployhub.conversions.actions import (
    ConversionRefused,
    conversion_class,
    submit_convert,
    submit_export,
)
from deployhub.registry.access import get_model_for_user, get_version_for_user
from deployhub.registry.golden import create_golden_set
from deployhub.registry.models import Dataset, Model, VersionFormat
from deployhub.registry.tasks import TaskRefused, declare_task
from deployhub.registry.uploads import (
    DuplicateModelName,
    DuplicateVersion,
    create_dataset,
    create_model,
    create_version,
)
from deployhub.teams.access import require_role, teams_of
from deployhub.teams.models import Role
from workers.tasks import TASKS

# Its django-ninja operations (api/openapi.py mounts it at /api/v1/).
router = Router(tags=["models"])


def version_json(version):
    return {
        "id": version.pk,
        "model": version.model_id,
        "number": version.number,
        "url": version.get_absolute_url(),
        "format": version.format,
        "sha256": version.sha256,
        "size": version.size,
        "ir_version": version.ir_version,
        "opset": version.opset,
        "producer": version.producer,
        "inputs": version.inputs,
        "outputs": version.outputs,
        "graph": version.graph,
        "external_data": version.external_data,
        "contract": version.contract,
        "preprocessing": version.preprocessing,
        "task": version.task,
        "warnings": version.warnings,
        "parent": version.parent_id,
        "export_report": version.export_report,
        "notes": version.notes,
        "tags": version.tags,
        "created_at": version.created_at.isoformat(),
    }


def model_json(model, versions=False):
    body = {
        "id": model.pk,
        "name": model.name,
        "team": model.team.slug,
        "description": model.description,
        "url": model.get_absolute_url(),
    }
    if versions:
        body["versions"] = [version_json(v) for v in model.versions.order_by("number")]
    return body


def _json_field(request, name):
    raw = request.POST.get(name, "").strip()
    if not raw:
        return None
    try:
        return json_input.parse(raw, name)
    except json_input.JSONInputError as exc:
        raise BadInput(str(exc)) from exc


def _file(request, what="the model"):
    if "file" not in request.FILES:
        raise BadInput(f"Send {what} as a multipart file field named 'file'.")
    return request.FILES["file"]


def _version_fields(request):
    return {
        "notes": text(request.POST, "notes", "", max_length=settings.DEPLOYHUB_MAX_TEXT_CHARS),
        "preprocessing": _json_field(request, "preprocessing"),
        "contract": _json_field(request, "contract"),
    }


def _upload(request, model):
    export_on = _export_on(request, model.team)
    try:
        version = create_version(model, _file(request), request.user, **_version_fields(request))
    except DuplicateVersion as exc:
        raise Conflict(str(exc), existing=version_json(exc.version)) from exc
    _export_pt2(request, version, export_on)
    return version


def _export_on(request, team):
    """Return the team's class named by 'export_on', or None when none is named; an unknown
    one is refused before anything is stored (never another class in its place)."""
    slug = request.POST.get("export_on")
    chosen = team.device_classes.filter(slug=slug).first() if slug else None
    if slug and chosen is None:
        raise BadInput(f"{team} has no device class {slug[:40]!r} to export on.")
    return chosen


def _export_pt2(request, version, chosen):
    """Queue a .pt2's export on the class chosen (or the team's first)."""
    if version.format != VersionFormat.PT2:
        return
    if device_class := conversion_class(version, chosen):
        submit_export(version, device_class, request.user)


def _team(request):
    teams = teams_of(request.user)
    slug = request.POST.get("team")
    if slug:
        return get_object_or_404(teams, slug=slug)
    if teams.count() != 1:
        raise BadInput("You are in several teams: say which one with the 'team' field (its slug).")
    return teams.get()


@require_http_methods(["GET", "POST"])
@token_required
@for_pipelines
def models(request):
    if request.method == "GET":
        listed = Model.objects.filter(team__in=teams_of(request.user)).select_related("team")
        return JsonResponse({"models": [model_json(m) for m in listed]})
    team = _team(request)
    require_role(request.user, team, Role.ENGINEER)
    name = text(request.POST, "name", "", max_length=field_length(Model, "name")).strip()
    if not name:
        raise BadInput("A model needs a 'name'.")
    export_on = _export_on(request, team)
    try:
        model, version = create_model(
            team,
            request.user,
            name=name,
            description=text(
                request.POST, "description", "", max_length=settings.DEPLOYHUB_MAX_TEXT_CHARS
            ),
            uploaded_file=_file(request),
            **_version_fields(request),
        )
    except DuplicateModelName as exc:
        raise BadInput(str(exc)) from exc
    _export_pt2(request, version, export_on)
    return JsonResponse({**model_json(model), "version": version_json(version)}, status=201)


@require_http_methods(["GET"])
@token_required
@for_pipelines
def model_detail(request, pk):
    model = get_model_for_user(request, pk)
    return JsonResponse(model_json(model, versions=True))


@require_http_methods(["POST"])
@token_required
@for_pipelines
def model_versions(request, pk):
    model = get_model_for_user(request, pk)
    require_role(request.user, model.team, Role.ENGINEER)
    return JsonResponse(version_json(_upload(request, model)), status=201)


@require_http_methods(["GET"])
@token_required
@for_pipelines
def version_detail(request, pk):
    version = get_version_for_user(request, pk)
    return JsonResponse(version_json(version))


@require_http_methods(["POST"])
@token_required
@for_pipelines
def version_datasets(request, pk):
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    kind = request.POST.get("kind", "")
    name = text(request.POST, "name", "", max_length=field_length(Dataset, "name")).strip()
    if kind not in ("calibration", "validation") or not name:
        raise BadInput("Send 'kind' (calibration or validation), 'name' and a file 'file'.")
    dataset = create_dataset(version, _file(request), request.user, kind=kind, name=name)
    return JsonResponse(
        {
            "id": dataset.pk,
            "name": dataset.name,
            "kind": dataset.kind,
            "samples": dataset.samples,
            "sha256": dataset.sha256,
        },
        status=201,
    )


def golden_json(golden):
    """Describe a golden set with the newest check of it on each engine."""
    return {
        "id": golden.pk,
        "name": golden.name,
        "version": golden.model_version_id,
        "format": golden.format,
        "sha256": golden.sha256,
        "size": golden.size,
        "pairs": golden.pairs,
        "inputs": golden.input_names,
        "outputs": golden.output_names,
        "atol": golden.atol,
        "rtol": golden.rtol,
        "created_at": golden.created_at.isoformat(),
        "runs": [
            {
                "engine": run.engine_id,
                "job": run.job_id,
                "passed": run.passed,
                "failing": run.failing,
                "reference_passed": run.reference_passed,
                "outputs": run.outputs,
                "created_at": run.created_at.isoformat(),
            }
            for run in golden.latest_runs()
        ],
    }


@require_http_methods(["GET", "POST"])
@token_required
@for_pipelines
def version_golden(request, pk):
    """List a version's golden sets, or attach one (multipart: name, file, atol, rtol)."""
    version = get_version_for_user(request, pk)
    if request.method == "GET":
        return JsonResponse({"golden_sets": [golden_json(g) for g in version.golden_sets.all()]})
    require_role(request.user, version.team, Role.ENGINEER)
    golden = create_golden_set(
        version,
        _file(request, "the golden pairs"),
        request.user,
        name=request.POST.get("name", ""),
        atol=request.POST.get("atol"),
        rtol=request.POST.get("rtol"),
    )
    return JsonResponse(golden_json(golden), status=201)


@require_http_methods(["GET", "PUT", "POST"])
@token_required
@for_pipelines
def version_task(request, pk):
    """GET the version's task declaration; PUT {"task", "params"} to confirm or correct it."""
    version = get_version_for_user(request, pk)
    if request.method == "GET":
        return JsonResponse(_task_json(version))
    require_role(request.user, version.team, Role.ENGINEER)
    body = json_body(request)
    task = body.get("task") or version.task.get("task")
    params = body.get(
        "params", version.task.get("params", {}) if task == version.task.get("task") else {}
    )
    try:
        declare_task(version, request.user, task, params)
    except TaskRefused as exc:
        raise BadInput(str(exc)) from exc
    return JsonResponse(_task_json(version))


def _task_json(version):
    return {"version": version.pk, "tasks": sorted(TASKS), **version.task}


@require_http_methods(["POST"])
@token_required
@for_pipelines
def version_convert(request, pk):
    """Queue the conversion of an ONNX version to {"opset": N} (17 by default): 202 and the job."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    body = json_body(request)
    slug = text(body, "device_class")
    device_class = version.team.device_classes.filter(slug=slug).first() if slug else None
    if slug and device_class is None:
        raise BadInput(f"{version.team} has no device class {slug!r}.")
    try:
        job = submit_convert(version, device_class, request.user, body.get("opset"))
    except ConversionRefused as exc:
        raise BadInput(str(exc)) from exc
    answer = {
        "job": job.pk,
        "state": job.state,
        "opset": job.params["convert_to_opset"],
        "device_class": job.device_class.slug,
        "url": f"/api/v1/jobs/{job.pk}",
    }
    return JsonResponse(answer, status=202)
