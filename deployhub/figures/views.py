"""The figure pages of a model and their JSON (drawn by static/js/figures.js)."""

from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.shortcuts import render

from deployhub.figures import trend as trends
from deployhub.figures.charts import tradeoff_figure
from deployhub.figures.fleet import fleet_figure
from deployhub.figures.http import figure_response
from deployhub.figures.tradeoffs import PRECISIONS, Filters, explore
from deployhub.registry.access import get_model_for_user
from workers.backends.known import BACKENDS


def _refused(exc):
    return JsonResponse({"error": str(exc)}, status=400)


def filter_choices(model):
    """What the explorer's filter form offers: the team's classes, every backend, precisions."""
    return {
        "classes": model.team.device_classes.order_by("slug"),
        "backends": list(BACKENDS),
        "precisions": PRECISIONS,
        "versions": list(model.versions.order_by("number").values_list("number", flat=True)),
    }


@login_required
def tradeoffs(request, pk):
    model = get_model_for_user(request, pk)
    context = {"model": model, "query": request.GET.urlencode(), **filter_choices(model)}
    try:
        context["filters"] = Filters.from_query(request.GET)
    except ValueError as exc:
        context["filters"], context["error"] = Filters(), str(exc)
    return render(
        request, "figures/tradeoffs.html", context, status=400 if "error" in context else 200
    )


@login_required
def tradeoffs_json(request, pk):
    model = get_model_for_user(request, pk)
    try:
        filters = Filters.from_query(request.GET)
    except ValueError as exc:
        return _refused(exc)
    explorer = explore(model, filters)
    return figure_response(tradeoff_figure(explorer), explorer.notes)


@login_required
def fleet(request, pk):
    model = get_model_for_user(request, pk)
    return render(request, "figures/fleet.html", {"model": model})


@login_required
def fleet_json(request, pk):
    model = get_model_for_user(request, pk)
    return figure_response(*fleet_figure(model))


@login_required
def trend(request, pk):
    model = get_model_for_user(request, pk)
    context = {"model": model, "metrics": trends.METRICS, "query": request.GET.urlencode()}
    try:
        context["metric"], context["regression"] = trends.read_query(request.GET)
    except ValueError as exc:
        context["error"] = str(exc)
        context["metric"], context["regression"] = "latency", trends.DEFAULT_REGRESSION
    status = 400 if "error" in context else 200
    return render(request, "figures/trend.html", context, status=status)


@login_required
def trend_json(request, pk):
    model = get_model_for_user(request, pk)
    try:
        metric, regression = trends.read_query(request.GET)
    except ValueError as exc:
        return _refused(exc)
    return figure_response(*trends.trend_figure(model, metric, regression))
