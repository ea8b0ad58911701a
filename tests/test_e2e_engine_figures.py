"""In Chromium against a live hub: the engine, release, latency and device figures.

The engine page draws its latency distribution, its comparison with the production
engine and its batch sweep; the release page draws the candidate against production;
the latency page overlays the engines its URL names, with their batch sweeps; the
device and device class pages draw the fingerprint timeline, a stale engine opening.
Each figure is drawn by plotly.js served from the installed package, with the traces
the stored runs give and no console error. Screenshots are kept in test-artifacts/.
"""

import base64

import numpy as np
import pytest

from deployhub.engines.actions import mark_stale
from deployhub.releases.models import Release, ReleaseState
from tests.benchmark_results import SWEEP, record_run, result
from tests.browser import sign_in
from tests.conftest import ARTIFACTS, stored_engine
from tests.gate_evidence import evaluated

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def measured(engine, centre_ms, sweep=SWEEP):
    """A benchmark of the engine keeping 500 samples around centre_ms, with a batch sweep."""
    ms = np.random.default_rng(0).normal(centre_ms, centre_ms / 20, 500).clip(0.1)
    block = {
        "format": "f32le-base64",
        "measured": 500,
        "count": 500,
        "data": base64.b64encode(ms.astype("<f4").tobytes()).decode(),
    }
    p50, p90, p95, p99 = np.percentile(ms, [50, 90, 95, 99])
    latency = {"min": ms.min(), "p50": p50, "p90": p90, "p95": p95, "p99": p99, "max": ms.max()}
    latency = {key: float(value) for key, value in latency.items()}
    latency |= {"mean": float(ms.mean()), "std": float(ms.std())}
    body = result(iterations=500, latency_ms=latency, latency_samples=block, batch_sweep=sweep)
    return record_run(engine.model_version, engine.device_class, body, engine=engine)


def traces_of(page, element_id):
    """Wait until the figure is drawn; return the names of its traces."""
    page.wait_for_selector(f"#{element_id}[data-drawn='true']", timeout=20_000)
    return page.evaluate(f"document.getElementById('{element_id}').data.map(t => t.name)")


def watched_page(browser, live_server, user):
    """A logged-in page and the list its console errors and page errors go to."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, live_server, user.username)
    return page, errors


def click_marker(page, element_id, trace):
    """Click the last drawn marker of a scatter trace (by its place in the figure)."""
    page.locator(f"#{element_id}").scroll_into_view_if_needed()
    marker = page.locator(f"#{element_id} .scatterlayer .trace").nth(trace)
    box = marker.locator(".points path").last.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.click(x, y)


def test_the_engine_and_release_pages_draw_their_figures(
    browser, live_server, alice, version, device_class
):
    production = stored_engine(version, device_class)
    candidate = stored_engine(version, device_class, {"precision": "int8"})
    production_run, candidate_run = measured(production, 12.0), measured(candidate, 8.0)
    evaluated(production, agreement=1.0)
    evaluated(candidate, agreement=0.99)
    model = version.model
    Release.objects.create(
        engine=production, model=model, device_class=device_class, state=ReleaseState.PRODUCTION
    )
    release = Release.objects.create(engine=candidate, model=model, device_class=device_class)
    page, errors = watched_page(browser, live_server, alice)

    page.goto(f"{live_server.url}{candidate.get_absolute_url()}")

    label = f"engine #{candidate.pk} onnxruntime int8 b1 (run #{candidate_run.pk})"
    assert traces_of(page, "figure-latency") == [
        f"{label} histogram",
        f"{label} CDF",
        f"{label} p50/p90/p99",
    ]
    assert f"production: engine #{production.pk} onnxruntime CDF" in traces_of(
        page, "figure-against-production"
    )
    assert traces_of(page, "figure-sweep") == [f"{label} throughput", f"{label} p99"]
    assert page.locator("#figure-latency .main-svg").count() > 0  # plotly drew an SVG
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "engine-figures.png"), full_page=True)

    page.goto(f"{live_server.url}{release.get_absolute_url()}")

    drawn = traces_of(page, "figure-against-production")
    assert drawn[:2] == [
        f"candidate: engine #{candidate.pk} onnxruntime CDF",
        f"candidate: engine #{candidate.pk} onnxruntime p50/p90/p99",
    ]
    assert f"production: engine #{production.pk} onnxruntime accuracy" in drawn
    title = page.locator("#figure-against-production .gtitle").text_content()
    assert "Δ p99" in title and "Δ accuracy -1.00 points" in title
    page.locator("#against-production").screenshot(
        path=str(ARTIFACTS / "release-against-production.png")
    )
    assert errors == []
    assert production_run.samples_ms() is not None

    # The production engine has nothing to be compared with: a short strip and its note.
    page.goto(f"{live_server.url}{production.get_absolute_url()}")
    page.wait_for_selector("#figure-against-production[data-drawn='true']", timeout=20_000)
    strip = page.locator("#figure-against-production")
    assert strip.get_attribute("data-empty") == "true" and strip.bounding_box()["height"] < 150
    assert traces_of(page, "figure-latency")  # its own distribution still draws


def test_the_latency_page_overlays_two_engines_and_their_sweeps(
    browser, live_server, alice, version, device_class
):
    fp32 = stored_engine(version, device_class)
    int8 = stored_engine(version, device_class, {"precision": "int8"})
    faster = [{**row, "throughput_ips": row["throughput_ips"] * 1.5} for row in SWEEP]
    runs = measured(fp32, 12.0), measured(int8, 8.0, sweep=faster)
    page, errors = watched_page(browser, live_server, alice)

    page.goto(f"{live_server.url}/figures/latency/?engines={fp32.pk},{int8.pk}")

    labels = [
        f"engine #{run.engine_id} onnxruntime {run.precision} b1 (run #{run.pk})" for run in runs
    ]
    assert traces_of(page, "figure-latency") == [
        f"{label} {part}" for label in labels for part in ("histogram", "CDF", "p50/p90/p99")
    ]
    assert traces_of(page, "figure-sweep") == [
        f"{label} {part}" for label in labels for part in ("throughput", "p99")
    ]
    throughput = page.evaluate("document.getElementById('figure-sweep').data.map(t => t.y)")
    assert throughput[0] == [100, 200] and throughput[2] == [150, 300]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "latency-distribution.png"), full_page=True)
    page.locator("#figure-sweep").screenshot(path=str(ARTIFACTS / "batch-sweep.png"))

    page.select_option("#latency-choice select[name=precision]", "int8")

    page.wait_for_function("document.location.search.includes('precision=int8')")
    assert traces_of(page, "figure-latency") == [
        f"{labels[1]} {part}" for part in ("histogram", "CDF", "p50/p90/p99")
    ]
    assert traces_of(page, "figure-sweep") == [f"{labels[1]} throughput", f"{labels[1]} p99"]
    assert page.locator("#figure-latency-notes li").text_content().startswith("Hidden by")
    assert errors == []


@pytest.fixture
def stale_engine(version, device_class, make_device, monkeypatch):
    """A device whose fingerprint changed, and the engine the change made stale."""
    device, _ = make_device()
    engine = stored_engine(version, device_class)
    before, after = {"cpu": {"model": "A"}}, {"cpu": {"model": "B"}}
    device.fingerprint_changes.create(before=before, after=after, summary=["cpu A → B"])
    monkeypatch.setattr(
        "deployhub.engines.actions.compatibility",
        lambda engine, fingerprint: (fingerprint == before, "cpu changed", None),
    )
    assert mark_stale(device, before, after) == [engine]
    return device, engine


@pytest.mark.parametrize("where", ["device", "device-class"])
def test_the_fingerprint_timeline_draws_and_opens_a_stale_engine(
    browser, live_server, alice, version, stale_engine, where
):
    device, engine = stale_engine
    page, errors = watched_page(browser, live_server, alice)
    path = {
        "device": f"/devices/{device.pk}/",
        "device-class": device.device_class.get_absolute_url(),
    }[where]

    page.goto(f"{live_server.url}{path}")

    assert traces_of(page, "figure-fingerprints") == [
        "fingerprint changes",
        f"engine #{engine.pk} onnxruntime v{version.number} stale",
    ]
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#figure-fingerprints").screenshot(
        path=str(ARTIFACTS / f"fingerprint-timeline-{where}.png")
    )
    click_marker(page, "figure-fingerprints", trace=1)
    page.wait_for_url(f"{live_server.url}{engine.get_absolute_url()}", timeout=10_000)
    assert errors == []
