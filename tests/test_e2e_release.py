"""From the demo model to production through review, in Chromium against a live hub and a worker.

alice (admin) proposes auto mode's recommended engine for local-cpu and cannot
approve it; bob approves; alice promotes; a device fetches the production engine
with `deployhub-worker fetch-production` and verifies it; a second engine is
promoted, then rolled back, and the first is production again; the audit trail
shows each step. The release page is kept as a screenshot in test-artifacts/.
"""

import json
import subprocess
import sys

import pytest
from django.core.management import call_command

from deployhub.devices.models import Device, DeviceClass
from deployhub.engines import auto
from deployhub.engines.models import AutoRun
from deployhub.parity.models import ParityRun
from deployhub.registry.models import Model
from deployhub.releases.models import Release, ReleaseState
from deployhub.teams.models import Event
from tests.browser import sign_in
from tests.conformance_run import QUICK_BENCHMARKS
from tests.conftest import ARTIFACTS, PASSWORD, ROOT, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def propose(page, live_server, engine, note):
    page.goto(f"{live_server.url}{engine.get_absolute_url()}")
    page.fill("#propose-form textarea[name=note]", note)
    page.click("#propose")
    with page.expect_navigation():  # the release page, before anyone signs in again
        page.click("#submit-release")
    return Release.objects.filter(engine=engine).latest("pk")


def decide(page, live_server, release, decision="approve"):
    page.goto(f"{live_server.url}{release.get_absolute_url()}")
    page.select_option("#review-form select[name=decision]", decision)
    # Wait for the answer's page: a sign-in straight after would otherwise race the
    # redirect's response, whose fresh CSRF cookie spoils the sign-in form's token.
    with page.expect_navigation():
        page.click("#review-form button[type=submit]")


def state_of(release):
    return Release.objects.get(pk=release.pk).state


def fetch_production(live_server, token, out):
    command = [sys.executable, "-m", "workers", "fetch-production", "--out", str(out)]
    return subprocess.run(
        command + ["--hub", live_server.url, "--token", token],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_demo_model_reaches_production_through_review_and_rolls_back(
    live_server, start_worker, browser, monkeypatch, tmp_path
):
    monkeypatch.setenv("DEPLOYHUB_DEMO_PASSWORD", PASSWORD)
    for name, value in QUICK_BENCHMARKS.items():
        monkeypatch.setattr(auto, name, value)
    call_command("seed_demo")
    local = DeviceClass.objects.get(slug="local-cpu")
    device = Device(device_class=local, name="edge-1")
    token = device.issue_token()
    device.save()
    worker = start_worker(device, token)
    version = Model.objects.get(name="digits-cnn").latest_version()
    alice = version.model.created_by
    run = auto.start(version, local, alice)
    run = wait_until(
        lambda: (r := AutoRun.objects.get(pk=run.pk)).state == "done" and r,
        400,
        "auto mode to finish",
        interval=1,
        on_timeout=worker.output,
    )
    parity = wait_until(
        lambda: (p := ParityRun.objects.filter(model_version=version).first()) and p.passed and p,
        60,
        "the seeded parity check to pass",
        on_timeout=worker.output,
    )
    assert parity.passed
    best = run.recommended.engine
    other = next(b.engine for b in run.builds.all() if b.engine and b.engine != best)

    page = browser.new_page()
    sign_in(page, live_server, "alice")
    first = propose(page, live_server, best, "auto mode's recommendation")
    assert state_of(first) == ReleaseState.IN_REVIEW
    assert "another reviewer decides" in page.content()
    assert page.locator("#review-form").count() == 0  # alice may not approve her own

    sign_in(page, live_server, "bob")
    decide(page, live_server, first)
    assert state_of(first) == ReleaseState.APPROVED, page.content()
    sign_in(page, live_server, "alice")
    page.goto(f"{live_server.url}{first.get_absolute_url()}")
    with page.expect_navigation():
        page.click("#promote")
    assert state_of(first) == ReleaseState.PRODUCTION

    fetched = fetch_production(live_server, token, tmp_path / "production")
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    manifest = json.loads((tmp_path / "production" / f"model-{version.model.pk}.json").read_text())
    assert (manifest["release"], manifest["engine"]) == (first.pk, best.pk)
    engine_file = tmp_path / "production" / manifest["file"]
    assert manifest["sha256"] == best.sha256 and engine_file.stat().st_size == best.size

    second = propose(page, live_server, other, "the other build")
    if page.locator("#override-form").count():  # its gates may not all be open: say why
        page.fill("#override-form textarea[name=justification]", "Measured by hand on the line.")
        with page.expect_navigation():
            page.click("#override-form button[type=submit]")
    sign_in(page, live_server, "bob")
    decide(page, live_server, second)
    sign_in(page, live_server, "alice")
    page.goto(f"{live_server.url}{second.get_absolute_url()}")
    with page.expect_navigation():
        page.click("#promote")
    assert state_of(second) == ReleaseState.PRODUCTION and state_of(first) == "retired"
    page.fill("#rollback-form textarea[name=reason]", "p99 regressed on the line")
    with page.expect_navigation():
        page.click("#rollback")
    assert state_of(second) == ReleaseState.ROLLED_BACK
    assert state_of(first) == ReleaseState.PRODUCTION
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(f"{live_server.url}{first.get_absolute_url()}")
    page.screenshot(path=str(ARTIFACTS / "release-page.png"), full_page=True)
    assert "Restored by the rollback" in page.content()

    page.goto(f"{live_server.url}/team/audit/?object=release")
    trail = page.locator("#events").inner_text()
    for verb in (
        "release.proposed",
        "release.submitted",
        "release.review.approve",
        "release.approved",
        "release.promoted",
        "release.retired",
        "release.rolled_back",
        "release.restored",
    ):
        assert verb in trail, verb

    # Every state change of the story says what it was before and after, on the page too.
    unchanged = {"engine.reused", "device.fingerprint_changed"}  # no state moved / a diff instead
    silent = {e.verb for e in Event.objects.exclude(verb__in=unchanged) if not e.change}
    assert not silent, silent
    page.goto(f"{live_server.url}/team/audit/?verb=job.succeeded")
    assert "running → succeeded" in page.locator("#events").inner_text()
