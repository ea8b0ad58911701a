"""API v1 for people and scripts: queue benchmarks, read results, export a model's results."""

from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_http_methods
from ninja import Router

from deployhub.api.auth import BadInput, error, for_pipelines, json_body, token_required
from deployhub.benchmarks.actions import BenchmarkRefused, submit_benchmark
from deployhub.benchmarks.exports import EXPORTS, benchmark_json, model_csv, model_results_body
from deployhub.benchmarks.forms import BenchmarkForm
from deployhub.benchmarks.models import BenchmarkRun, flag_int8_slowdowns
from deployhub.benchmarks.reports import model_report as build_report
from deployhub.benchmarks.views import attachment
from deployhub.engines.access import get_engine_for_user
from deployhub.registry.access import get_model_for_user, get_version_for_user
from deployhub.teams.access import require_role
from deployhub.teams.models import Role

# Its django-ninja operations (api/openapi.py mounts it at /api/v1/).
router = Router(tags=["results"])


def _form(request, version, device_class=None):
    """Check the body's params with the page's form; raise BadInput (400) naming each problem."""
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
    return JsonResponse({"job": body}, status=202)


def _runs(runs):
    return JsonResponse({"benchmarks": [benchmark_json(run) for run in runs]})


@require_http_methods(["GET", "POST"])
@token_required
@for_pipelines
def version_benchmarks(request, pk):
    """GET: the version's benchmark runs. POST {"device_class", params...}: queue one."""
    version = get_version_for_user(request, pk)
    if request.method == "GET":
        return _runs(BenchmarkRun.objects.for_version(version))
    return _submitted(request, _form(request, version), version)


@require_http_methods(["GET", "POST"])
@token_required
@for_pipelines
def engine_benchmarks(request, pk):
    """GET: the engine's benchmark runs. POST {params...}: queue one on its device class."""
    engine = get_engine_for_user(request, pk)
    version = engine.model_version
    if request.method == "GET":
        runs = engine.benchmarks.select_related("model_version", "device", "device_class", "engine")
        return _runs(flag_int8_slowdowns(list(runs)))
    form = _form(request, version, device_class=engine.device_class)
    return _submitted(request, form, version, engine=engine)


def _model(request, pk):
    return get_model_for_user(request, pk)


@require_http_methods(["GET"])
@token_required
@for_pipelines
def model_results_json(request, pk):
    body = model_results_body(_model(request, pk))
    return HttpResponse(body, content_type="application/json")


@require_http_methods(["GET"])
@token_required
@for_pipelines
def model_results_csv(request, pk, kind):
    model = _model(request, pk)
    if kind not in EXPORTS:
        return error(404, f"No export {kind}.csv; there are {', '.join(EXPORTS)}.")
    return attachment(model_csv(model, kind), "text/csv; charset=utf-8", model, f"{kind}.csv")


@require_http_methods(["GET"])
@token_required
@for_pipelines
def model_report(request, pk):
    model = _model(request, pk)
    return attachment(build_report(model, request.user), "text/html", model, "report.html")
