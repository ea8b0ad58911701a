"""The fleet heatmap, the version trend and the model page as the model's home."""

import pytest

from deployhub.figures.trend import regressions
from tests.auto_builds import engine_of
from tests.benchmark_results import ranged
from tests.conftest import PASSWORD
from tests.figure_results import seed_classes
from tests.gate_evidence import benchmarked, evaluated


def test_it_marks_a_version_worse_than_the_one_before_by_more_than_the_percentage():
    latencies = [10.0, 10.4, 12.0, 11.0, None, 20.0]

    assert regressions(latencies, 5, lower_is_better=True) == [2]
    assert regressions([100.0, 90.0, 89.0], 5, lower_is_better=False) == [1]


@pytest.fixture
def two_versions(version, alice, demo_team):
    edge = seed_classes(demo_team)[0]  # 33.3 ms budget
    second = ranged(version, alice)
    fast = engine_of(version, edge, "fast")
    slow = engine_of(second, edge, "slow")
    benchmarked(fast, p99=10.0)
    benchmarked(slow, p99=50.0)  # over the budget: v2 regresses and passes nothing
    for engine in (fast, slow):
        evaluated(engine, agreement=0.999)
    return edge, fast, slow


def test_it_shows_each_versions_best_engine_per_class_and_marks_cells_outside_budget(
    client, alice, version, two_versions
):
    edge, fast, slow = two_versions
    client.login(username="alice", password=PASSWORD)

    body = client.get(f"/models/{version.model.pk}/fleet.json").json()

    heatmap = body["figure"]["data"][0]
    assert heatmap["y"] == ["v1", "v2"] and heatmap["x"] == [edge.slug]
    assert heatmap["customdata"] == [[f"/engines/{fast.pk}/"], [f"/engines/{slow.pk}/"]]
    assert heatmap["z"][0][0] == pytest.approx(100 / (1000 / 33.3))  # 100 fps against 30 fps
    assert not heatmap["text"][0][0].startswith("✕") and heatmap["text"][1][0].startswith("✕")


def test_it_marks_the_regression_in_the_version_trend(client, alice, version, two_versions):
    _, _, slow = two_versions
    client.login(username="alice", password=PASSWORD)

    body = client.get(f"/models/{version.model.pk}/trend.json?metric=latency&regression=10").json()

    marked = next(t for t in body["figure"]["data"] if t["meta"]["role"] == "regression")
    assert marked["x"] == ["v2"] and marked["customdata"] == [f"/engines/{slow.pk}/"]
    assert client.get(f"/models/{version.model.pk}/trend.json?metric=nope").status_code == 400
    assert client.get(f"/models/{version.model.pk}/trend.json?regression=x").status_code == 400


def test_it_makes_the_model_page_the_models_home(client, alice, version, two_versions):
    _, fast, slow = two_versions
    client.login(username="alice", password=PASSWORD)

    page = client.get(version.model.get_absolute_url()).content.decode()

    assert 'id="tradeoff-figure"' in page
    assert f'href="/engines/{fast.pk}/"' in page and f'href="/engines/{slow.pk}/"' in page
    assert "outside budget or tolerance" in page
    assert f"/models/{version.model.pk}/benchmarks.csv" in page
    assert f"/models/{version.model.pk}/report.html" in page


def test_it_hides_another_teams_fleet_and_trend(client, charlie, version):
    client.login(username="charlie", password=PASSWORD)

    for path in ("fleet.json", "trend.json", "fleet/", "trend/"):
        assert client.get(f"/models/{version.model.pk}/{path}").status_code == 404
