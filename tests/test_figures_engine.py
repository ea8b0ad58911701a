"""Engine, release and device figures: latency distribution, sweep, comparison, timeline."""

import base64
import json

import numpy as np
import pytest

from deployhub.devices.models import DeviceClass, ServingPattern
from deployhub.engines.actions import mark_stale
from deployhub.figures.distribution import cdf_points
from deployhub.releases.models import Release, ReleaseState
from tests.benchmark_results import LATENCY, SWEEP, record_run, result
from tests.conftest import stored_engine
from tests.gate_evidence import evaluated

pytestmark = pytest.mark.django_db


def samples_block(ms):
    data = base64.b64encode(np.asarray(ms, dtype="<f4").tobytes()).decode()
    return {"format": "f32le-base64", "measured": len(ms), "count": len(ms), "data": data}


def measured(engine, ms=(9.0, 10.0, 10.0, 12.0, 15.0), **changes):
    """A run of the engine keeping these samples (its stored percentiles are LATENCY's)."""
    body = result(iterations=len(ms), latency_samples=samples_block(list(ms)), **changes)
    return record_run(engine.model_version, engine.device_class, body, engine=engine)


def traces(client, url):
    response = client.get(url)
    assert response.status_code == 200, response.content
    body = response.json()
    return {trace.get("name"): trace for trace in body["figure"]["data"]}, body


def values(series):
    """A plotly JSON array: a list, or numpy's typed-array encoding."""
    if isinstance(series, dict):
        return np.frombuffer(base64.b64decode(series["bdata"]), dtype=series["dtype"]).tolist()
    return list(series)


def test_the_cdf_rises_and_ends_at_one():
    x, y = cdf_points([3.0, 1.0, 2.0, 2.0])

    assert list(x) == [1.0, 2.0, 2.0, 3.0]
    assert np.all(np.diff(y) > 0) and y[-1] == 1.0


def test_it_draws_an_engines_distribution_with_its_stored_percentiles(
    client, alice, version, device_class
):
    engine = stored_engine(version, device_class)
    run = measured(engine)
    client.force_login(alice)

    drawn, body = traces(client, f"/figures/latency.json?engines={engine.pk}")

    label = f"engine #{engine.pk} onnxruntime fp32 b1 (run #{run.pk})"
    cdf = drawn[f"{label} CDF"]
    assert values(cdf["y"])[-1] == 1.0 and np.all(np.diff(values(cdf["y"])) > 0)
    assert values(drawn[f"{label} histogram"]["x"]) == [9.0, 10.0, 10.0, 12.0, 15.0]
    marks = drawn[f"{label} p50/p90/p99"]
    assert values(marks["x"]) == [LATENCY["p50"], LATENCY["p90"], LATENCY["p99"]]
    assert values(marks["y"]) == [0.5, 0.9, 0.99]
    assert marks["customdata"][0] == engine.get_absolute_url()
    budget = [s for s in body["figure"]["layout"]["shapes"] if s["type"] == "line"]
    assert [s["x0"] for s in budget] == [device_class.frame_budget_ms]
    assert body["notes"] == []


def test_a_run_without_samples_says_to_run_it_again(client, alice, version, device_class):
    engine = stored_engine(version, device_class)
    run = record_run(version, device_class, result(), engine=engine)
    client.force_login(alice)

    drawn, body = traces(client, f"/figures/latency.json?engines={engine.pk}")

    assert drawn == {}
    assert body["notes"] == [
        f"Run #{run.pk}: no samples stored for this run (measured before samples were kept): "
        "run the benchmark again."
    ]


def test_the_own_page_keeps_the_chosen_engines_and_ignores_junk(
    client, alice, version, device_class
):
    engine = stored_engine(version, device_class)
    client.force_login(alice)

    page = client.get(f"/figures/latency/?engines={engine.pk},x;&runs=abc")

    assert page.status_code == 200
    assert f'value="{engine.pk}"' in page.content.decode()
    _, body = traces(client, "/figures/latency.json?engines=%00&runs=-1,1e3,99999999999999")
    assert body["notes"] == [
        "Choose engines or runs (engines=1,2 or runs=3 in the URL) to compare."
    ]


def test_another_teams_engines_are_not_drawn(client, charlie, version, device_class):
    engine = stored_engine(version, device_class)
    measured(engine)
    client.force_login(charlie)

    drawn, _ = traces(client, f"/figures/latency.json?engines={engine.pk}")

    assert drawn == {}
    assert client.get(f"/figures/engines/{engine.pk}/against-production.json").status_code == 404


@pytest.fixture
def two_classes(version, device_class, demo_team):
    """An fp32 and an int8 engine on the test class and an fp32 one on a GPU class, each
    with a run that kept samples and swept batch sizes: {name: run}."""
    gpu = DeviceClass.objects.create(team=demo_team, slug="fig-gpu", frame_budget_ms=10.0)
    engines = {
        "fp32": stored_engine(version, device_class),
        "int8": stored_engine(version, device_class, {"precision": "int8"}),
        "gpu": stored_engine(version, gpu),
    }
    return {name: measured(engine, batch_sweep=SWEEP) for name, engine in engines.items()}


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("", {"fp32", "int8", "gpu"}),
        ("&precision=int8", {"int8"}),
        ("&class=fig-gpu", {"gpu"}),
        ("&class=fig-gpu&precision=int8", set()),
        ("&backend=no-such-backend", set()),
    ],
)
@pytest.mark.parametrize("view", ["latency", "sweep"])
def test_the_filters_in_the_url_narrow_the_latency_and_sweep_views(
    client, alice, two_classes, view, query, shown
):
    engines = ",".join(str(run.engine_id) for run in two_classes.values())
    client.force_login(alice)

    drawn, body = traces(client, f"/figures/{view}.json?engines={engines}{query}")

    labels = {
        name for name, run in two_classes.items() if any(f"run #{run.pk})" in t for t in drawn)
    }
    assert labels == shown
    hidden = [f"#{run.pk}" for name, run in two_classes.items() if name not in shown]
    assert body["notes"] == (
        [f"Hidden by the filters: run {', '.join(hidden)}. Clear a filter to show it."]
        if hidden
        else []
    )


def test_the_latency_page_keeps_its_filters_and_refuses_a_bad_version(client, alice, two_classes):
    client.force_login(alice)

    page = client.get("/figures/latency/?engines=1&class=fig-gpu&precision=int8")

    html = page.content.decode()
    assert '<option value="fig-gpu" selected>' in html and '<option value="int8" selected>' in html
    assert "class=fig-gpu&amp;precision=int8" in html  # the figures' JSON gets the filters
    assert client.get("/figures/latency.json?vmin=x").status_code == 400
    assert client.get("/figures/sweep.json?vmax=x").json()["error"].startswith("vmax must be")
    assert client.get("/figures/latency/?vmin=x").status_code == 400


def test_the_sweep_draws_the_frame_budget_on_latency_for_a_real_time_class(
    client, alice, version, device_class
):
    engine = stored_engine(version, device_class)
    run = measured(engine, batch_sweep=SWEEP)
    client.force_login(alice)

    drawn, body = traces(client, f"/figures/sweep.json?engines={engine.pk}")

    label = f"engine #{engine.pk} onnxruntime fp32 b1 (run #{run.pk})"
    assert values(drawn[f"{label} throughput"]["y"]) == [100.0, 200.0]
    assert values(drawn[f"{label} p99"]["x"]) == [1, 8]
    [line] = body["figure"]["layout"]["shapes"]
    assert line["y0"] == device_class.frame_budget_ms and line["yref"] == "y2"  # latency plot


def test_the_sweep_of_a_batch_class_draws_its_ceiling_and_target(
    client, alice, version, device_class
):
    device_class.serving_pattern = ServingPattern.BATCH
    device_class.throughput_target_ips, device_class.batch_latency_ceiling_ms = 150.0, 80.0
    device_class.save()
    engine = stored_engine(version, device_class)
    measured(engine, batch_sweep=SWEEP)
    client.force_login(alice)

    _, body = traces(client, f"/figures/sweep.json?engines={engine.pk}")

    lines = {s["yref"]: s["y0"] for s in body["figure"]["layout"]["shapes"]}
    assert lines == {"y": 150.0, "y2": 80.0}


def test_an_engine_without_a_sweep_says_how_to_get_one(client, alice, version, device_class):
    engine = stored_engine(version, device_class)
    client.force_login(alice)

    _, body = traces(client, f"/figures/sweep.json?engines={engine.pk}")

    assert (
        "Batch sweep" in body["notes"][0] and f"engines/{engine.pk}/benchmarks" in body["notes"][0]
    )


def test_a_release_is_drawn_against_production_with_the_evidence_deltas(
    client, alice, version, device_class
):
    production = stored_engine(version, device_class)
    candidate = stored_engine(version, device_class, {"precision": "int8"})
    measured(production, latency_ms={**LATENCY, "p99": 20.0})
    measured(candidate)
    evaluated(production, agreement=1.0)
    evaluated(candidate, agreement=0.99)
    model = version.model
    Release.objects.create(
        engine=production, model=model, device_class=device_class, state=ReleaseState.PRODUCTION
    )
    release = Release.objects.create(engine=candidate, model=model, device_class=device_class)
    client.force_login(alice)

    drawn, body = traces(client, f"/figures/releases/{release.pk}/against-production.json")

    assert f"candidate: engine #{candidate.pk} onnxruntime CDF" in drawn
    assert f"production: engine #{production.pk} onnxruntime CDF" in drawn
    accuracy = drawn[f"candidate: engine #{candidate.pk} onnxruntime accuracy"]
    assert values(accuracy["y"]) == [pytest.approx(99.0)]
    title = body["figure"]["layout"]["title"]["text"]
    assert "Δ p99 -5.00 ms (20.00 → 15.00)" in title
    assert "Δ accuracy -1.00 points" in title
    assert body["notes"] == []


def test_without_production_the_comparison_says_so(client, alice, version, device_class):
    engine = stored_engine(version, device_class)
    client.force_login(alice)

    _, body = traces(client, f"/figures/engines/{engine.pk}/against-production.json")

    assert body["notes"] == [
        "No production release of this model on the class: nothing to compare with yet."
    ]


def test_the_timeline_shows_a_change_and_the_engine_it_made_stale(
    client, alice, version, device_class, make_device, monkeypatch
):
    device, _ = make_device()
    engine = stored_engine(version, device_class)
    before, after = {"cpu": {"model": "A"}}, {"cpu": {"model": "B"}}
    change = device.fingerprint_changes.create(before=before, after=after, summary=["cpu A → B"])
    monkeypatch.setattr(
        "deployhub.engines.actions.compatibility",
        lambda engine, fingerprint: (fingerprint == before, "cpu changed", None),
    )
    mark_stale(device, before, after)
    client.force_login(alice)

    for url in (
        f"/figures/devices/{device.pk}/fingerprints.json",
        f"/figures/device-classes/{device_class.pk}/fingerprints.json",
    ):
        drawn, body = traces(client, url)
        assert values(drawn["fingerprint changes"]["y"]) == [device.name]
        stale = drawn[f"engine #{engine.pk} onnxruntime v{version.number} stale"]
        assert stale["customdata"] == [engine.get_absolute_url()] * 2
        assert (
            stale["y"][0] == device.name
            and change.summary[0] in drawn["fingerprint changes"]["text"][0]
        )
        assert body["notes"] == []


def test_a_device_without_changes_says_when_one_is_recorded(client, alice, make_device):
    device, _ = make_device()
    client.force_login(alice)

    _, body = traces(client, f"/figures/devices/{device.pk}/fingerprints.json")

    assert body["notes"][0].startswith(f"No fingerprint change recorded for device {device.name}")


def test_the_production_engine_is_not_compared_with_itself(client, alice, version, device_class):
    engine = stored_engine(version, device_class)
    Release.objects.create(
        engine=engine, model=version.model, device_class=device_class, state=ReleaseState.PRODUCTION
    )
    client.force_login(alice)

    drawn, body = traces(client, f"/figures/engines/{engine.pk}/against-production.json")

    assert drawn == {}
    assert body["notes"] == [
        "This engine is in production on its class: its release page compares it."
    ]


def test_the_timeline_never_shows_another_teams_device_of_the_same_name(
    client, alice, charlie, make_device, monkeypatch
):
    from django.core.files import File

    from deployhub.devices.models import Device
    from deployhub.registry.models import Model
    from deployhub.registry.uploads import create_version
    from tests.conftest import ASSETS

    acme = charlie.memberships.get().team
    theirs = DeviceClass.objects.create(team=acme, slug="theirs", name="Theirs")
    their_device = Device(device_class=theirs, name="gpu-1")
    their_device.issue_token()
    their_device.save()
    model = Model.objects.create(team=acme, name="secret-model", created_by=charlie)
    with open(ASSETS / "digits_cnn_v2.onnx", "rb") as handle:
        their_version = create_version(model, File(handle, name="m.onnx"), charlie)
    their_engine = stored_engine(their_version, theirs)
    before, after = {"cpu": {"model": "A"}}, {"cpu": {"model": "B"}}
    mine, _ = make_device("gpu-1")  # alice's device has the same name, and changed first
    mine.fingerprint_changes.create(before=before, after=after, summary=["cpu A → B"])
    monkeypatch.setattr(
        "deployhub.engines.actions.compatibility",
        lambda engine, fingerprint: (fingerprint == before, "secret toolchain", None),
    )
    mark_stale(their_device, before, after)
    client.force_login(alice)

    drawn, _ = traces(client, f"/figures/devices/{mine.pk}/fingerprints.json")

    assert not [name for name in drawn if f"engine #{their_engine.pk} " in name]
    assert "secret toolchain" not in json.dumps(drawn)
