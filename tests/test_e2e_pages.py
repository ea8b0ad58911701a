"""The pages around the figures, in headless Chromium: what a first use in the browser found."""

import pytest
from playwright.sync_api import expect

from tests.benchmark_results import LATENCY, SERVER_BLOCK, SWEEP, record_run, result
from tests.browser import sign_in
from tests.conftest import ARTIFACTS, ASSETS, stored_engine

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LONG_CONFIG = {
    "precision": "int8",
    "provider": "CPUExecutionProvider",
    "graph_optimization_level": "ORT_ENABLE_ALL",
    "quantization": {"calibration": "minmax", "per_channel": True, "op_types": ["Conv", "Gemm"]},
    "offline_optimised_model": True,
}


def log_in(browser, live_server, width=1400):
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.set_default_timeout(15_000)
    sign_in(page, live_server, "alice")
    page.wait_for_url(f"{live_server.url}/models/")
    return page


@pytest.fixture
def measured(version, device_class):
    """Three runs of the version: an engine with a long config, a server run, a batch sweep."""
    engine = stored_engine(version, device_class, build_config=LONG_CONFIG)
    unstable = {"stable": False, "reasons": ["p50 drifted 12% between the first and last window"]}
    close = {**LATENCY, "p99": 30.0}  # within 33.3 ms, not by 2x: an unstable run decides nothing
    record_run(version, device_class, result(stability=unstable, latency_ms=close), engine)
    record_run(version, device_class, result(scenario="server", server=SERVER_BLOCK))
    record_run(version, device_class, result(batch_sweep=SWEEP, latency_ms={**LATENCY, "p99": 9.0}))
    return version


def overflow(page, selector):
    """Return how many pixels the element's content overflows it sideways (0: none)."""
    return page.eval_on_selector(selector, "el => el.scrollWidth - el.clientWidth")


def test_it_fits_the_results_card_at_1400px_and_shows_no_python_reprs(
    live_server, browser, measured
):
    page = log_in(browser, live_server)
    page.goto(f"{live_server.url}{measured.get_absolute_url()}")
    table = page.locator("#results-table")
    expect(table).to_be_visible()

    assert overflow(page, "#benchmarks") <= 0
    assert overflow(page, "html") <= 0
    headers = table.locator("thead th").all_inner_texts()
    assert headers[:3] == ["Build", "Device class", "Batch"] and "Peak memory" in headers
    assert "When" in headers and "Gate" in headers
    gate = page.locator("tr.run", has_text="engine #").locator("td.gate .badge")
    assert gate.inner_text() == "Unstable: measure again"
    assert "measure again before trusting it" in gate.get_attribute("title")

    # Every details toggle opened: still no sideways scroll, and readable key/value text.
    for summary in page.locator("tr.run-details > td > details > summary").all():
        summary.click()
    # Each run's details load when opened: wait until every one has come.
    expect(page.locator(".run-details-body[data-loaded]")).to_have_count(3)
    config = page.locator("dd.build-config").first
    expect(config).to_contain_text("precision int8")
    expect(config).to_contain_text("quantization.op_types Conv, Gemm")
    assert overflow(page, "#benchmarks") <= 0
    text = page.locator("body").inner_text()
    assert "{'" not in text and "['" not in text
    assert "cv (core)" in page.locator("#results-glossary").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "results-1400.png"), full_page=True)


def test_a_runs_details_load_when_opened_again_after_a_failure_and_after_a_refresh(
    live_server, browser, measured
):
    page = log_in(browser, live_server)
    failed = []

    def fail_once(route):
        if failed:
            route.continue_()
        else:
            failed.append(route.request.url)
            route.fulfill(status=500, body="")

    page.route("**/benchmarks/runs/*/details", fail_once)
    page.goto(f"{live_server.url}{measured.get_absolute_url()}")
    details = page.locator("tr.run-details details", has_text="build config")
    details.locator("summary").click()
    expect(details.locator(".run-details-body")).to_have_text(
        "Could not load the details: 500. Try again."
    )

    details.locator("summary").click()  # closed, then opened again: it asks once more
    details.locator("summary").click()
    expect(details.locator(".run-details-body[data-loaded] dd.build-config")).to_contain_text(
        "precision int8"
    )
    assert len(failed) == 1

    # The live refresh redraws the table (a benchmark ended): its rows load their details too.
    page.evaluate(
        """async () => {
        const results = document.getElementById("results");
        results.innerHTML = await (await fetch(results.dataset.url)).text();
    }"""
    )
    fresh = page.locator("tr.run-details details", has_text="batch sweep")
    fresh.locator("summary").click()
    expect(fresh.locator(".run-details-body[data-loaded] details.sweep")).to_have_count(1)


def test_a_refused_upload_shows_every_error_by_its_field_and_keeps_the_chosen_file(
    live_server, browser, alice
):
    page = log_in(browser, live_server)
    errors = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    form = page.locator("#new-model form")
    form.locator("input[name=name]").fill("digits")
    form.locator("input[name=file]").set_input_files(str(ASSETS / "digits_cnn_v2.onnx"))
    form.locator("[data-fill-example=id_preprocessing]").click()
    spec = form.locator("textarea[name=preprocessing]")
    assert '"interpolation": "bilinear"' in spec.input_value()
    spec.fill('{"color_order": "XYZ", "layout": "NWHC"}')
    form.locator("button[type=submit]").click()

    spec_errors = form.locator("#errors-preprocessing")
    expect(spec_errors).to_contain_text("color_order: 'XYZ' is not one of RGB, BGR, GRAY.")
    expect(spec_errors).to_contain_text("layout: 'NWHC' is not one of NCHW, NHWC.")
    assert form.locator("input[name=file]").evaluate("input => input.files[0].name") == (
        "digits_cnn_v2.onnx"
    )
    assert form.locator("input[name=name]").input_value() == "digits"

    spec.fill('{"color_order": "RGB"}')  # fixed: the same file goes up without choosing it again
    form.locator("button[type=submit]").click()
    page.wait_for_url(f"{live_server.url}/models/*/")
    expect(page.locator("h1")).to_contain_text("digits")
    assert [e for e in errors if "status of 400" not in e] == []  # the refusal itself is a 400


def test_the_budget_calculator_converts_both_ways_and_compares_builds_as_you_type(
    live_server, browser, alice, device_class
):
    page = log_in(browser, live_server)
    page.goto(f"{live_server.url}{device_class.get_absolute_url()}")
    calculator = page.locator("#budget-calculator")

    calculator.locator("input[name=ms]").fill("40")
    assert calculator.locator("input[name=fps]").input_value() == "25.00"
    calculator.locator("input[name=fps]").fill("60")
    assert calculator.locator("input[name=ms]").input_value() == "16.67"

    compare = page.locator("#throughput-compare")
    compare.locator("input[name=ms_a]").fill("20")
    expect(compare.locator("#compare-output")).to_contain_text("400.0 img/s, 14.0×")
    page.screenshot(path=str(ARTIFACTS / "budget-calculator.png"))
