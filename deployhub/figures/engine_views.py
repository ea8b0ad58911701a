"""Figure endpoints of the engine, release and device pages: candidate against production,
batch sweep, latency distribution and fingerprint timeline.

Each answers figures.http.figure_response: the plotly figure and notes saying what to
run where data is missing. Chosen engines and runs come from the query string
(engines=1,2&runs=3), so a view is shared by its URL; ids that are not numbers or
not the user's team's are ignored, never a 500. The latency and sweep views take the
explorer's filters too (class=, backend=, precision=; tradeoffs.Filters).
"""

import re

from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.shortcuts import render

from deployhub.devices.access import get_device_class_for_user, get_device_for_user
from deployhub.devices.models import DeviceClass
from deployhub.engines.access import get_engine_for_user
from deployhub.figures import comparison, distribution, fingerprints, sweep
from deployhub.figures.http import figure_response
from deployhub.figures.tradeoffs import PRECISIONS, Filters
from deployhub.releases.access import get_release_for_user
from deployhub.teams.access import teams_of
from workers.backends.known import BACKENDS


def chosen_ids(request, name):
    """Return the distinct whole numbers of a comma-separated query param, in order (at most 8)."""
    tokens = [token.strip() for token in request.GET.get(name, "").split(",")]
    found = [int(token) for token in tokens if re.fullmatch(r"\d{1,12}", token)]
    return list(dict.fromkeys(found))[: distribution.MAX_RUNS]


def _refused(exc):
    return JsonResponse({"error": str(exc)}, status=400)


@login_required
def latency_json(request):
    try:
        filters = Filters.from_query(request.GET)
    except ValueError as exc:
        return _refused(exc)
    engines, runs = chosen_ids(request, "engines"), chosen_ids(request, "runs")
    chosen = distribution.chosen_runs(teams_of(request.user), engines, runs)
    samples = distribution.samples_of(chosen)
    notes = distribution.missing_notes(chosen, samples, engines, runs)
    shown, hidden = filters.split_runs(chosen)
    return figure_response(distribution.distribution_figure(shown, samples), notes + hidden)


@login_required
def latency_page(request):
    """The latency distribution at its own URL: the chosen engines, runs and filters are in
    the query."""
    teams = teams_of(request.user)
    context = {
        "engines": ",".join(map(str, chosen_ids(request, "engines"))),
        "runs": ",".join(map(str, chosen_ids(request, "runs"))),
        "query": request.GET.urlencode(),
        "classes": DeviceClass.objects.filter(team__in=teams).order_by("slug"),
        "backends": list(BACKENDS),
        "precisions": PRECISIONS,
    }
    try:
        context["filters"] = Filters.from_query(request.GET)
    except ValueError as exc:
        context["filters"], context["error"] = Filters(), str(exc)
    status = 400 if "error" in context else 200
    return render(request, "figures/latency.html", context, status=status)


@login_required
def sweep_json(request):
    try:
        filters = Filters.from_query(request.GET)
    except ValueError as exc:
        return _refused(exc)
    engines = chosen_ids(request, "engines")
    runs = sweep.sweep_runs(teams_of(request.user), engines)
    notes = sweep.sweep_notes(runs, engines)
    if not engines:
        notes.append("Choose engines (engines=1,2 in the URL) to compare their sweeps.")
    shown, hidden = filters.split_runs(runs)
    return figure_response(sweep.sweep_figure(shown), notes + hidden)


@login_required
def engine_comparison_json(request, pk):
    engine = get_engine_for_user(request, pk)
    release = comparison.release_for_engine(engine)
    production = comparison.production_engine(release)
    if production is not None and production.pk == engine.pk:
        note = "This engine is in production on its class: its release page compares it."
        return figure_response(comparison.empty_figure(), [note])
    return figure_response(*comparison.comparison(release))


@login_required
def release_comparison_json(request, pk):
    return figure_response(*comparison.comparison(get_release_for_user(request, pk)))


@login_required
def device_timeline_json(request, pk):
    device = get_device_for_user(request, pk)
    data = fingerprints.timeline_data([device])
    figure = fingerprints.timeline_figure(*data, title=f"Fingerprint changes of {device}")
    notes = [] if data[0] else [fingerprints.NO_CHANGES.format(what=f"device {device}")]
    return figure_response(figure, notes)


@login_required
def class_timeline_json(request, pk):
    device_class = get_device_class_for_user(request, pk)
    data = fingerprints.timeline_data(list(device_class.devices.all()))
    title = f"Fingerprint changes on {device_class}"
    figure = fingerprints.timeline_figure(*data, title=title)
    notes = (
        [] if data[0] else [fingerprints.NO_CHANGES.format(what=f"the devices of {device_class}")]
    )
    return figure_response(figure, notes)


def engine_part(engine):
    """What the engine page's figure section reads (contributed from FiguresConfig.ready)."""
    return {"figures_engine": engine}
