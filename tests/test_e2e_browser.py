"""Step 2 of the README, driven in a real headless Chromium against a live hub and a real worker."""

import re

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.demo.management.commands.seed_demo import demo_password
from deployhub.devices.models import Device
from deployhub.jobs.models import Job, JobKind
from tests.browser import sign_in
from tests.conftest import ARTIFACTS

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def demo_with_worker(start_worker):
    """The demo data and the local worker, as `make run` has them."""
    call_command("seed_demo")
    device = Device.objects.get(name="local-worker")
    token = device.issue_token()
    device.save()
    start_worker(device, token)
    return device


def test_a_user_benchmarks_the_demo_model_and_watches_it_live(
    live_server, browser, demo_with_worker
):
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page()
    page.set_default_timeout(20_000)

    # Log in.
    page.goto(f"{live_server.url}/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", demo_password())
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/models/$"))

    # The demo model with its versions and signature.
    page.click("text=digits-cnn")
    expect(page.locator("table#versions")).to_contain_text("v2")
    expect(page.locator("table#versions")).to_contain_text("v1")
    page.click("a:text-is('v2')")
    expect(page.locator("h1")).to_contain_text("digits-cnn v2")
    expect(page.locator("body")).to_contain_text("image")
    expect(page.locator("body")).to_contain_text("[N, 3, 32, 32]")
    expect(page.locator("body")).to_contain_text("logits")
    version_url = page.url

    # The local-cpu class with its worker online.
    page.click("nav >> text=Devices")
    row = page.locator("#classes tr", has_text="local-cpu")
    expect(row).to_contain_text("local-worker")
    expect(row.locator(".badge")).to_have_text("Online")

    # Benchmark on local-cpu; watch the job without reloading the page.
    page.goto(version_url)
    page.select_option("#benchmarks select[name=device_class]", label="local-cpu")
    page.fill("#benchmarks input[name=iterations]", "30000")
    page.click("#run-benchmark")
    page.wait_for_url(re.compile(r"#job-\d+$"))
    page.evaluate("""() => {
        window.__stillSamePage = true;
        window.__states = [];
        const badge = document.querySelector('tr[id^=job-] [data-field=state]');
        window.__states.push(badge.textContent);
        new MutationObserver(() => {
            const last = window.__states[window.__states.length - 1];
            if (badge.textContent !== last) window.__states.push(badge.textContent);
        }).observe(badge, {childList: true, characterData: true, subtree: true});
    }""")
    job_row = page.locator("tr[id^=job-]").first
    expect(job_row.locator("[data-field=state]")).to_have_text("Running")
    page.wait_for_function(
        "() => document.querySelector('tr[id^=job-] progress').value > 0", timeout=20_000
    )
    page.screenshot(path=str(ARTIFACTS / "benchmark-running.png"), full_page=True)
    expect(job_row.locator("[data-field=state]")).to_have_text("Succeeded", timeout=60_000)

    # The results appear on the same page.
    results = page.locator("#results-table")
    expect(results).to_be_visible()
    run = BenchmarkRun.objects.get()
    results.locator(f"#run-{run.pk}-details summary").click()  # the details load when opened
    details = results.locator(".run-details-body[data-loaded]")
    expect(details.locator("td.p50")).to_have_text(f"{run.latency_p50_ms:.3f}")
    for cell in ("p90", "p99", "mean"):
        expect(details.locator(f"td.{cell}")).to_have_text(re.compile(r"^\d+\.\d{3}$"))
    expect(results.locator("td.throughput")).to_contain_text("img/s")
    page.screenshot(path=str(ARTIFACTS / "benchmark-done.png"), full_page=True)

    assert page.evaluate("window.__stillSamePage") is True
    states = page.evaluate("window.__states")
    assert states[-2:] == ["Running", "Succeeded"] and set(states) <= {
        "Queued",
        "Running",
        "Succeeded",
    }
    job = Job.objects.get(kind=JobKind.BENCHMARK)  # the demo also seeds a parity check
    assert job.log.index("queued on") < job.log.index("claimed by") < job.log.index("succeeded")


def test_a_user_uploads_a_model_in_the_browser_and_sees_refusals(live_server, browser, alice):
    from deployhub.registry.models import ModelVersion
    from tests.conftest import ASSETS

    page = browser.new_page()
    page.set_default_timeout(20_000)
    sign_in(page, live_server, "alice")

    # A good upload goes through the progress-bar form and lands on the new model.
    page.goto(f"{live_server.url}/models/")
    page.fill("input[name=name]", "digits")
    page.set_input_files("input[name=file]", str(ASSETS / "digits_cnn_v1.onnx"))
    page.fill(
        "textarea[name=preprocessing]",
        '{"resize": {"height": 32, "width": 32, "interpolation": "bilinear"},'
        ' "scale": 0.00392156862745098, "layout": "NCHW"}',
    )
    page.click("form[data-upload] button[type=submit]")
    expect(page.locator("h1")).to_have_text("digits")
    expect(page.locator("table#versions")).to_contain_text("[N, 3, 32, 32]")

    # A pickle is refused with the reason, on the same form, and nothing is stored.
    page.set_input_files(
        "input[name=file]",
        {
            "name": "model.pt",
            "mimeType": "application/octet-stream",
            "buffer": b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00}\x94.",
        },
    )
    page.click("form[data-upload] button[type=submit]")
    expect(page.locator(".errorlist")).to_contain_text("runs arbitrary code")
    assert ModelVersion.objects.count() == 1

    # The version page shows the generated preprocessing code.
    page.click("a:text-is('v1')")
    expect(page.locator("#preprocess-code")).to_contain_text("def preprocess(image)")
    page.screenshot(path=str(ARTIFACTS / "version-page.png"), full_page=True)
