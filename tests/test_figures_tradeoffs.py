"""The trade-off explorer: Pareto set, budget lines, tolerance bands, filters, query count."""

import json

import plotly.graph_objects as go
import plotly.io as pio
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from deployhub.figures.charts import tradeoff_figure
from deployhub.figures.pareto import dominates, pareto_front
from deployhub.figures.tradeoffs import Filters, explore
from deployhub.releases.models import Release, ReleaseState
from deployhub.teams.models import Role
from tests.api_calls import token_for
from tests.auto_builds import engine_of
from tests.conftest import PASSWORD, make_user
from tests.figure_results import seed_classes, seed_engines, seed_runs
from tests.gate_evidence import benchmarked, evaluated

# (latency ms, accuracy, memory MB)
FAST_ROUGH = (5.0, 0.70, 100.0)
SLOW_EXACT = (20.0, 0.76, 100.0)
DOMINATED = (25.0, 0.75, 120.0)  # slower, less accurate and larger than SLOW_EXACT
TWO_BETTER_ONE_WORSE = (22.0, 0.74, 50.0)  # beats DOMINATED on latency and memory, not SLOW_EXACT
TIE = (5.0, 0.70, 100.0)  # the same figures as FAST_ROUGH
NO_MEMORY = (30.0, 0.77, None)


def test_it_keeps_on_the_frontier_what_no_build_beats_on_every_axis():
    points = [FAST_ROUGH, SLOW_EXACT, DOMINATED, TWO_BETTER_ONE_WORSE, TIE, NO_MEMORY]

    front = pareto_front(points)

    assert front == [0, 1, 3, 4, 5]


def test_it_keeps_both_of_two_equal_builds_and_drops_neither():
    assert not dominates(FAST_ROUGH, TIE) and not dominates(TIE, FAST_ROUGH)
    assert pareto_front([FAST_ROUGH, TIE]) == [0, 1]


def test_it_keeps_a_build_better_on_two_axes_and_worse_on_the_third():
    assert pareto_front([SLOW_EXACT, TWO_BETTER_ONE_WORSE]) == [0, 1]
    assert dominates(SLOW_EXACT, DOMINATED)
    assert pareto_front([DOMINATED, SLOW_EXACT]) == [1]


def test_it_judges_an_unmeasured_memory_on_latency_and_accuracy_only():
    assert dominates((5.0, 0.8, None), (6.0, 0.8, 10.0))
    assert pareto_front([(5.0, 0.8, None), (5.0, 0.8, 10.0)]) == [0, 1]


@pytest.fixture
def classes(demo_team):
    return seed_classes(demo_team)


def test_it_plots_p99_for_a_real_time_class_and_ms_per_image_for_a_batch_class(version, classes):
    edge, _, batch = classes
    realtime_engine, batch_engine = engine_of(version, edge, "rt"), engine_of(version, batch, "b")
    benchmarked(realtime_engine, p99=12.0)
    benchmarked(batch_engine, p99=40.0)
    for engine in (realtime_engine, batch_engine):
        evaluated(engine, agreement=0.995)

    explorer = explore(version.model)

    by_class = {facet.device_class.slug: facet.points[0] for facet in explorer.facets}
    assert by_class[edge.slug].latency_ms == 12.0
    point = by_class[batch.slug]
    assert point.latency_ms == pytest.approx(1000.0 / point.throughput)


def test_it_draws_the_budget_and_the_tolerance_band_where_the_class_says(version, classes):
    edge, gpu, batch = classes
    for dc in classes:
        engine = engine_of(version, dc, dc.slug)
        benchmarked(engine, p99=8.0)
        evaluated(engine, agreement=0.999)

    facets = {facet.device_class.slug: facet for facet in explore(version.model).facets}

    assert facets[edge.slug].budget_ms == 33.3
    assert facets[gpu.slug].budget_ms == 10.0
    assert facets[batch.slug].budget_ms == pytest.approx(1000.0 / 500.0)
    assert facets[edge.slug].band == pytest.approx((0.99, 1.0))  # 1 point of agreement
    assert facets[gpu.slug].band == pytest.approx((0.995, 1.0))


def test_it_puts_the_budget_line_and_band_into_the_figure(client, alice, version, classes):
    edge = classes[0]
    engine = engine_of(version, edge, "fp32")
    benchmarked(engine, p99=15.0)
    evaluated(engine, agreement=0.999)
    client.login(username="alice", password=PASSWORD)

    body = client.get(f"/models/{version.model.pk}/tradeoffs.json").json()

    shapes = body["figure"]["layout"]["shapes"]
    lines = [s for s in shapes if s["type"] == "line"]
    bands = [s for s in shapes if s["type"] == "rect"]
    assert [line["x0"] for line in lines] == [33.3]
    assert [(band["y0"], band["y1"]) for band in bands] == [pytest.approx((0.99, 1.0))]
    engines = [t for t in body["figure"]["data"] if t["meta"]["role"] == "engines"]
    assert engines[0]["customdata"] == [f"/engines/{engine.pk}/"]
    assert body["figure"]["layout"]["xaxis"]["type"] == "log"


def test_it_rings_the_production_engine_and_marks_an_unstable_run_hollow(
    client, alice, version, classes
):
    edge = classes[0]
    engine = engine_of(version, edge, "fp32")
    benchmarked(engine, p99=15.0)
    evaluated(engine, agreement=0.999)
    engine.benchmarks.update(stable=False)
    Release.objects.create(
        engine=engine, model=version.model, device_class=edge, state=ReleaseState.PRODUCTION
    )
    client.login(username="alice", password=PASSWORD)

    data = client.get(f"/models/{version.model.pk}/tradeoffs.json").json()["figure"]["data"]

    production = next(t for t in data if t["meta"]["role"] == "production")
    assert production["customdata"] == [f"/engines/{engine.pk}/"]
    engines = next(t for t in data if t["meta"]["role"] == "engines")
    assert engines["marker"]["symbol"][0].endswith("-open")


def test_the_figure_is_plotly_json_that_plotly_takes_as_it_is(version, classes):
    """The figure is built as plotly JSON directly (plotly's objects took ten times as long):
    plotly's own checks must accept every part and change nothing, on 3 classes (one batch),
    with budgets, bands, a production engine and an unstable run."""
    engines = seed_engines([version], classes, precisions=("fp32", "int8"))
    seed_runs(engines, benchmarks=3 * len(engines), accuracies=len(engines))
    engines[0].benchmarks.update(stable=False)
    Release.objects.create(
        engine=engines[0],
        model=version.model,
        device_class=engines[0].device_class,
        state=ReleaseState.PRODUCTION,
    )

    figure = tradeoff_figure(explore(version.model))

    checked = go.Figure(figure)  # raises on a property plotly does not know or a bad value
    assert json.loads(checked.to_json()) == json.loads(pio.to_json(figure, validate=False))
    layout = figure["layout"]
    assert [a["text"].split(" · ")[0] for a in layout["annotations"]] == [
        dc.slug for dc in sorted(classes, key=lambda dc: dc.slug)
    ]
    domains = [layout[f"xaxis{n}"]["domain"] for n in ("", 2, 3)]
    assert domains[0][0] == 0.0 and domains[-1][1] == 1.0
    assert all(left[1] < right[0] for left, right in zip(domains, domains[1:], strict=False))
    assert layout["template"]["layout"]["plot_bgcolor"] == "white"  # plotly_white, expanded
    assert {t["xaxis"] for t in figure["data"]} == {"x", "x2", "x3"}


def test_it_says_what_to_run_when_there_is_nothing_to_plot(client, alice, version, classes):
    engine = engine_of(version, classes[0], "fp32")
    client.login(username="alice", password=PASSWORD)

    notes = client.get(f"/models/{version.model.pk}/tradeoffs.json").json()["notes"]
    assert "no benchmark yet" in notes[0]

    benchmarked(engine, p99=15.0)
    notes = client.get(f"/models/{version.model.pk}/tradeoffs.json").json()["notes"]
    assert "no accuracy run yet: run an evaluation" in notes[0]


def test_it_filters_by_class_backend_precision_and_versions(version, classes):
    engines = seed_engines([version], classes)
    seed_runs(engines, benchmarks=len(engines), accuracies=len(engines))
    edge = classes[0]

    explorer = explore(version.model, Filters(classes=[edge.slug], precisions=["int8"]))

    assert [f.device_class for f in explorer.facets] == [edge]
    assert {p.precision for p in explorer.points} == {"int8"}
    assert explore(version.model, Filters(vmin=2)).points == []


def test_it_refuses_a_version_that_is_not_a_number(client, alice, version):
    client.login(username="alice", password=PASSWORD)

    response = client.get(f"/models/{version.model.pk}/tradeoffs.json?vmin=abc")

    assert response.status_code == 400
    assert "vmin must be a version number" in response.json()["error"]


def test_it_hides_another_teams_model(client, charlie, version):
    client.login(username="charlie", password=PASSWORD)

    assert client.get(f"/models/{version.model.pk}/tradeoffs.json").status_code == 404
    assert client.get(f"/models/{version.model.pk}/tradeoffs/").status_code == 404


def test_it_lets_a_viewer_see_the_explorer(client, demo_team, version):
    make_user("vera", demo_team, Role.VIEWER)
    client.login(username="vera", password=PASSWORD)

    response = client.get(f"/models/{version.model.pk}/tradeoffs/?class=x")

    assert response.status_code == 200
    assert b'data-figure="/models/' in response.content


def _queries(client, url):
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured)


@pytest.mark.parametrize("page", ["/models/{pk}/tradeoffs.json", "/models/{pk}/"])
def test_it_asks_the_database_as_often_for_1000_results_as_for_100(
    client, alice, version, classes, page
):
    engines = seed_engines([version], classes, precisions=("fp32", "int8"))
    seed_runs(engines, benchmarks=100, accuracies=50)
    client.login(username="alice", password=PASSWORD)
    url = page.format(pk=version.model.pk)
    client.get(url)
    few = _queries(client, url)

    seed_runs(engines, benchmarks=900, accuracies=150, seed=2)
    many = _queries(client, url)

    assert many == few
    body = client.get(f"/models/{version.model.pk}/tradeoffs.json").json()
    plotted = sum(len(t["x"]) for t in body["figure"]["data"] if t["meta"]["role"] == "engines")
    assert plotted == len(engines)


def test_it_serves_the_explorer_data_in_api_v1_by_personal_token(client, alice, version, classes):
    engine = engine_of(version, classes[0], "fp32")
    benchmarked(engine, p99=15.0)
    evaluated(engine, agreement=0.999)

    body = client.get(f"/api/v1/models/{version.model.pk}/tradeoffs", **token_for(alice)).json()

    (facet,) = body["facets"]
    assert facet["device_class"] == classes[0].slug and facet["budget_ms"] == 33.3
    assert facet["points"][0]["engine"] == engine.pk and facet["points"][0]["latency_ms"] == 15.0
    assert facet["points"][0]["pareto"] is True


def test_the_api_filters_the_explorer_by_the_fields_results_are_filtered_by(
    client, alice, version, classes
):
    first = engine_of(version, classes[0], "a", "fp32")
    second = engine_of(version, classes[1], "b", "int8")
    for engine in (first, second):
        benchmarked(engine, p99=15.0)
        evaluated(engine, agreement=0.999)
    url = f"/api/v1/models/{version.model.pk}/tradeoffs"

    def shown(query):
        body = client.get(f"{url}?{query}", **token_for(alice)).json()
        return {
            facet["device_class"]: [p["engine"] for p in facet["points"]]
            for facet in body["facets"]
        }

    assert shown(f"device_class={classes[1].slug}") == {classes[1].slug: [second.pk]}
    assert shown("precision=fp32") == {classes[0].slug: [first.pk]}
    assert shown("vmin=2") == {}
    response = client.get(f"{url}?vmax=v1", **token_for(alice))
    assert response.status_code == 400 and "vmax" in response.json()["error"]


def test_it_hides_another_teams_explorer_data_in_api_v1(client, charlie, version):
    response = client.get(f"/api/v1/models/{version.model.pk}/tradeoffs", **token_for(charlie))

    assert response.status_code == 404


def test_a_devices_words_in_the_hover_are_text_not_markup(client, alice, version, classes):
    engine = engine_of(version, classes[0], "fp32")
    engine.tool_versions = {"onnxruntime": '<a href="https://evil.example">1.32</a>'}
    engine.save()
    benchmarked(engine, p99=15.0)
    evaluated(engine, agreement=0.999)
    client.login(username="alice", password=PASSWORD)

    data = client.get(f"/models/{version.model.pk}/tradeoffs.json").json()["figure"]["data"]

    [hover] = next(t for t in data if t["meta"]["role"] == "engines")["text"]
    assert '<a href="https://evil.example">' not in hover
    assert "&lt;a href=" in hover
