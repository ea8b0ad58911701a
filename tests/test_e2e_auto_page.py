"""Auto mode's pages in a real Chromium: a refusal beside its button, failures that unfold."""

import re

import pytest
from playwright.sync_api import expect

from deployhub.engines import auto
from deployhub.engines.models import AutoRun
from tests.auto_builds import LONG_ERROR, SKIP_REASON, failed_build, skipped_build
from tests.browser import sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
GREEN = "rgb(26, 127, 55)"  # --green in static/css/deployhub.css


def logged_in_page(browser, live_server):
    page = browser.new_page()
    page.set_default_timeout(20_000)
    return sign_in(page, live_server, "alice")


def test_a_refused_auto_mode_shows_its_reason_beside_the_button(
    live_server,
    browser,  # noqa: F811
    alice,
    version,
    device_class,
):
    page = logged_in_page(browser, live_server)
    page.goto(f"{live_server.url}{version.get_absolute_url()}")

    page.select_option("#auto-form select[name=device_class]", str(device_class.pk))
    page.click("#auto")

    error = page.locator("#auto-error")
    expect(error).to_contain_text("attach a validation (or calibration) dataset")
    expect(error).to_be_in_viewport()
    expect(page.locator("#auto")).to_be_in_viewport()
    assert not AutoRun.objects.exists()


def test_a_failed_auto_run_is_not_green_and_its_failures_unfold_to_their_logs(
    live_server,
    browser,  # noqa: F811
    alice,
    version,
    device_class,
):
    run = AutoRun.objects.create(model_version=version, device_class=device_class)
    failed = failed_build(run, "fp32")
    failed_build(run, "int8", error="internal: the child process crashed: SIGSEGV")
    skipped_build(run, "fp16", SKIP_REASON)
    auto.advance(run)
    page = logged_in_page(browser, live_server)

    page.goto(f"{live_server.url}{run.get_absolute_url()}")

    state = page.locator("#auto-state")
    expect(state).to_have_text("All 2 builds failed")
    assert state.evaluate("e => getComputedStyle(e).backgroundColor") != GREEN
    expect(page.locator("#auto-summary")).to_contain_text("All 2 builds failed")
    expect(page.locator(".skip-reason")).to_have_text(f"skipped: {SKIP_REASON}")
    row = page.locator(f"#build-{failed.pk}")
    full = row.locator(".full-error")
    expect(full).to_be_hidden()
    row.locator("details summary").click()
    expect(full).to_have_text(LONG_ERROR)
    row.locator("a.job-log").click()
    expect(page).to_have_url(re.compile(rf"/jobs/{failed.compile_job_id}/#job-log$"))
    expect(page.locator("#failure-category")).to_have_text("Unsupported operator")
