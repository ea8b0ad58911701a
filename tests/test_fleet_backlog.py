"""Where work waits: the fleet page's queues, and a queued job's page (and its auto run's)
saying when no device of its class is online to take it."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from deployhub.engines.models import AutoBuild, AutoRun
from deployhub.jobs.actions import submit_job
from deployhub.jobs.backlog import no_device_notice
from deployhub.jobs.models import Job, JobKind

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client, alice):
    client.force_login(alice)
    return client


def queued(device_class, alice, kind=JobKind.NOOP, **fields):
    team = device_class.team
    return submit_job(team=team, kind=kind, device_class=device_class, user=alice, **fields)


def heard(device, ago, draining=False):
    device.last_heartbeat_at = timezone.now() - ago
    device.draining = draining
    device.save()


def waiting_line(page):
    """The job page's notice, or None when it is hidden."""
    found = re.search(r'<p id="job-waiting"\s+class="warn"\s*(hidden)?>(.*?)</p>', page, re.S)
    return None if found.group(1) else found.group(2).strip()


def test_a_job_of_a_class_that_never_had_a_device_says_so(signed_in, alice, device_class):
    job = queued(device_class, alice)
    queued(device_class, alice)

    page = signed_in.get(f"/jobs/{job.pk}/").content.decode()

    expected = f"No device of class {device_class.slug} online since ever; 2 jobs waiting."
    assert waiting_line(page) == expected


def test_it_names_when_the_classs_devices_were_last_heard_from(
    signed_in, alice, device_class, make_device
):
    early, late = make_device()[0], make_device()[0]
    heard(early, timedelta(days=2))
    heard(late, timedelta(hours=3))
    job = queued(device_class, alice)

    page = signed_in.get(f"/jobs/{job.pk}/").content.decode()

    since = f"{late.last_heartbeat_at:%Y-%m-%d %H:%M} UTC"
    assert waiting_line(page) == (
        f"No device of class {device_class.slug} online since {since}; 1 job waiting."
    )
    status = signed_in.get(f"/jobs/{job.pk}/status").json()
    assert status["waiting_notice"] == waiting_line(page)


def test_an_online_device_silences_it(signed_in, alice, device_class, make_device):
    heard(make_device()[0], timedelta(seconds=5))
    job = queued(device_class, alice)

    page = signed_in.get(f"/jobs/{job.pk}/").content.decode()

    assert waiting_line(page) is None
    assert signed_in.get(f"/jobs/{job.pk}/status").json()["waiting_notice"] == ""


def test_a_revoked_device_is_no_device_and_a_draining_one_is_named(
    alice, device_class, make_device
):
    revoked, draining = make_device()[0], make_device()[0]
    heard(revoked, timedelta(seconds=5))
    revoked.revoked_at = timezone.now()
    revoked.save()
    queued(device_class, alice)
    assert "online since ever" in no_device_notice(device_class)

    heard(draining, timedelta(seconds=5), draining=True)
    assert "those online are draining; 1 job waiting" in no_device_notice(device_class)


def test_a_job_no_longer_queued_says_nothing(signed_in, alice, device_class):
    job = queued(device_class, alice)
    Job.objects.filter(pk=job.pk).update(state="running")

    assert waiting_line(signed_in.get(f"/jobs/{job.pk}/").content.decode()) is None


def test_an_auto_run_waiting_on_its_class_says_so(signed_in, alice, version, device_class):
    run = AutoRun.objects.create(model_version=version, device_class=device_class)
    compile_job = queued(
        device_class, alice, kind=JobKind.COMPILE, model_version=version, params={"backend": "x"}
    )
    AutoBuild.objects.create(
        auto_run=run, backend="onnxruntime", precision="fp32", compile_job=compile_job
    )

    page = signed_in.get(f"/auto/{run.pk}/").content.decode()

    notice = f"No device of class {device_class.slug} online since ever; 1 job waiting."
    assert f'<p class="warn" id="auto-waiting">{notice}</p>' in page

    Job.objects.filter(pk=compile_job.pk).update(state="running")
    assert 'id="auto-waiting"' not in signed_in.get(f"/auto/{run.pk}/").content.decode()


def test_the_fleet_page_shows_each_classs_queue(signed_in, alice, demo_team, device_class):
    idle = type(device_class).objects.create(team=demo_team, slug=f"{device_class.slug}-idle")
    oldest = queued(device_class, alice)
    Job.objects.filter(pk=oldest.pk).update(created_at=timezone.now() - timedelta(hours=2))
    queued(device_class, alice)

    page = signed_in.get("/devices/").content.decode()

    busy_row = re.search(rf'id="queue-{device_class.slug}">(.*?)</tr>', page, re.S).group(1)
    idle_row = re.search(rf'id="queue-{idle.slug}">(.*?)</tr>', page, re.S).group(1)
    assert '<td class="queued">2</td>' in busy_row and "2\xa0hours" in busy_row
    assert '<td class="queued">0</td>' in idle_row and "—" in idle_row
