"""A device at another site, as a new team would add one: nothing but the hub's URL.

alice makes an enrolment token on the class page; a fresh virtual environment with no
checkout installs the worker from the hub's own wheel (the install line the class page
shows), enrols with the token, and runs with no flags: HTTPS mode, no broker anywhere in
its environment. Auto mode on the demo model then runs every build, benchmark and check
on that device, and recommends one of its builds.
"""

import json
import re
import subprocess

import pytest
from django.core.management import call_command

from deployhub.devices.models import Delivery, Device, DeviceClass
from deployhub.engines import auto
from deployhub.engines.models import AutoRun
from deployhub.registry.models import Model
from tests.conformance_run import QUICK_BENCHMARKS
from tests.conftest import PASSWORD, wait_until
from tests.installed_worker import clean_env, installed_worker

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def enrolment_token_from_the_class_page(client, alice, device_class):
    client.force_login(alice)
    page = client.post(
        f"/devices/classes/{device_class.pk}/enrolment-tokens",
        {"note": "edge site", "max_devices": 1},
    )
    assert page.status_code == 200
    html = page.content.decode()
    assert "deployhub-worker enroll" in html and "/downloads/deployhub-" in html
    return re.search(r'id="enrolment-secret">(dhe_[^<]+)<', html).group(1)


def device_environment(config):
    """The device's environment: this machine's, with no broker URL and the device's config."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("CELERY")}
    return {**env, "DEPLOYHUB_WORKER_CONFIG": str(config), "PYTHONUNBUFFERED": "1"}


def test_a_device_installed_from_the_hub_enrols_and_runs_auto_mode_over_https(
    live_server, client, monkeypatch, tmp_path
):
    monkeypatch.setenv("DEPLOYHUB_DEMO_PASSWORD", PASSWORD)
    for name, value in QUICK_BENCHMARKS.items():
        monkeypatch.setattr(auto, name, value)
    call_command("seed_demo")
    version = Model.objects.get(name="digits-cnn").latest_version()
    alice = version.model.created_by
    edge = DeviceClass.objects.create(
        team=version.team, slug="edge-site", name="Edge site CPU", frame_budget_ms=33.3
    )
    token = enrolment_token_from_the_class_page(client, alice, edge)

    python = installed_worker(live_server.url, tmp_path)
    worker_command = python.parent / "deployhub-worker"
    config = tmp_path / "config" / "worker.json"
    env = device_environment(config)
    enrol = [worker_command, "enroll", "--hub", live_server.url, "--token", token]
    enrolled = subprocess.run(
        [*enrol, "--name", "edge-1"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert enrolled.returncode == 0, enrolled.stdout + enrolled.stderr
    device = Device.objects.get(device_class=edge, name="edge-1")
    assert "broker" not in config.read_text().lower()
    assert json.loads(config.read_text())["device"] == device.pk

    log = tmp_path / "edge-1.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [worker_command, "run"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    output = log.read_text
    try:
        wait_until(lambda: "over HTTPS" in output(), 60, "the worker to ask", on_timeout=output)
        run = auto.start(version, edge, alice)
        run = wait_until(
            lambda: (r := AutoRun.objects.get(pk=run.pk)).state == "done" and r,
            400,
            "auto mode to finish on the enrolled device",
            interval=1,
            on_timeout=output,
        )
    finally:
        worker.terminate()
        worker.wait(30)
    assert run.recommended is not None, run.summary if hasattr(run, "summary") else run
    assert run.recommended.engine.built_on == device
    device.refresh_from_db()
    assert device.delivery == Delivery.HTTPS and device.worker_version
    assert "Traceback" not in output()
