"""An enrolled device holds one credential, its device token, and it opens its own class's
work only: with it a device of team A can neither take, delay, drop, read nor inject team
B's jobs or the jobs of its own team's other classes, through any device call of
docs/protocol.md, `device/work` or the person API. Every try is refused (403, 404 or 409;
401 or 403 at a person's call) and changes no row; B's own worker then runs B's job.

A device is never handed the broker's address: an enrolled device needs nothing but
HTTPS to the hub, and a broker-mode device is told its queue by the hub from its token.
"""

import json
import uuid

import pytest
from django.conf import settings
from django.core.files import File
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.devices.models import Delivery, Device, DeviceClass, EnrolmentToken
from deployhub.engines.models import Engine
from deployhub.jobs.actions import claim_job
from deployhub.jobs.models import Artifact, Job, JobState
from deployhub.registry.models import Model
from deployhub.registry.uploads import create_version
from tests.api_calls import call
from tests.conftest import job_finished, queued_benchmark, stored_engine

pytestmark = pytest.mark.django_db(transaction=True)

REFUSED = {403, 404, 409}
REFUSED_AT_A_PERSON_CALL = {401, 403}


class Fleet:
    """Team A's device (the one that tries), and the work it must not reach: team B's, and
    that of A's other class. Each has a job waiting and a job running on its own device."""

    def __init__(self, device, token, b_device, b_token, jobs, engines, classes, versions):
        self.device, self.token = device, token
        self.b_device, self.b_token = b_device, b_token
        self.jobs, self.engines = jobs, engines
        self.classes, self.versions = classes, versions


def team_b_version(charlie, model_file):
    model = Model.objects.create(
        team=charlie.memberships.get().team, name="b-cnn", created_by=charlie
    )
    with open(model_file, "rb") as handle:
        return create_version(model, File(handle, name="digits_cnn_v2.onnx"), charlie)


def new_device(device_class, delivery=Delivery.BROKER):
    device = Device(
        device_class=device_class, name=f"dev-{uuid.uuid4().hex[:6]}", delivery=delivery
    )
    token = device.issue_token()
    device.save()
    return device, token


@pytest.fixture
def fleet(client, device_class, version, alice, charlie, demo_team, model_file):
    """A's HTTPS-mode device on its class; B's class and A's other class, each with a
    queued job, a job running on its own device and an engine."""
    b_team = charlie.memberships.get().team
    b_class = DeviceClass.objects.create(team=b_team, slug=f"b-{uuid.uuid4().hex[:6]}", name="B")
    a_other = DeviceClass.objects.create(
        team=demo_team, slug=f"{device_class.slug}-other", name="A's other class"
    )
    b_version = team_b_version(charlie, model_file)
    b_device, b_token = new_device(b_class, Delivery.HTTPS)
    a_other_device, _ = new_device(a_other, Delivery.HTTPS)
    jobs = []
    for cls, ver, user, holder in (
        (b_class, b_version, charlie, b_device),
        (a_other, version, alice, a_other_device),
    ):
        running = queued_benchmark(ver, cls, user)
        claim_job(running.pk, holder, running.attempt)
        jobs += [Job.objects.get(pk=running.pk), queued_benchmark(ver, cls, user)]
    engines = [
        stored_engine(b_version, b_class, digest="b"),
        stored_engine(version, a_other, digest="a-other"),
    ]
    device, token = new_device(device_class, Delivery.HTTPS)
    return Fleet(
        device, token, b_device, b_token, jobs, engines, [b_class, a_other], [b_version, version]
    )


def rows():
    """Everything a device's try could change: every job's row, and what hangs off jobs."""
    return {
        "jobs": list(Job.objects.order_by("pk").values()),
        "artifacts": Artifact.objects.count(),
        "engines": Engine.objects.count(),
        "benchmark runs": BenchmarkRun.objects.count(),
        "enrolment tokens": EnrolmentToken.objects.count(),
        "devices": list(Device.objects.order_by("pk").values("pk", "device_class", "draining")),
    }


def device_calls(fleet):
    """(what the device tries, method, path, body) through every device call of the protocol."""
    tries = []
    for job in fleet.jobs:
        at = f"jobs/{job.pk}"
        attempt, next_attempt = {"attempt": job.attempt}, {"attempt": job.attempt + 1}
        tries += [
            (f"claim {job}", "post", f"{at}/claim", attempt),
            (f"claim the next attempt of {job}", "post", f"{at}/claim", next_attempt),
            (f"extend the lease of {job}", "post", f"{at}/heartbeat", {**attempt, "progress": 0.9}),
            (f"complete {job}", "post", f"{at}/complete", {**attempt, "state": "succeeded"}),
            (f"fail {job}", "post", f"{at}/complete", {**attempt, "state": "failed", "error": "x"}),
            (f"cancel {job}", "post", f"{at}/complete", {**attempt, "state": "cancelled"}),
            (f"read the model of {job}", "get", f"{at}/inputs/model", None),
            (f"upload an artifact to {job}", "upload", f"{at}/artifacts", attempt),
        ]
    for engine in fleet.engines:
        tries.append((f"download engine {engine.pk}", "get", f"engines/{engine.pk}/download", None))
    for cls in fleet.classes:
        production = f"device-classes/{cls.slug}/production"
        tries.append((f"read the production engines of {cls.slug}", "get", production, None))
    return tries


def person_calls(fleet):
    """Every person's call that queues a job, makes a device, or moves another one."""
    tries = []
    for version, cls, engine in zip(fleet.versions, fleet.classes, fleet.engines, strict=True):
        on_class = {"device_class": cls.slug}
        tries += [
            ("queue a compile", "post", f"versions/{version.pk}/engines", on_class),
            ("start auto mode", "post", f"versions/{version.pk}/auto", on_class),
            ("queue a benchmark", "post", f"versions/{version.pk}/benchmarks", on_class),
            ("queue an engine benchmark", "post", f"engines/{engine.pk}/benchmarks", {}),
            ("rebuild an engine", "post", f"engines/{engine.pk}/rebuild", {}),
            ("queue a parity check", "post", f"versions/{version.pk}/parity", {}),
            ("queue a conversion", "post", f"versions/{version.pk}/convert", {"opset": 17}),
            ("make an enrolment token", "post", f"device-classes/{cls.slug}/enrolment-tokens", {}),
        ]
    for job in fleet.jobs:
        tries.append((f"read {job}", "get", f"jobs/{job.pk}", None))
    for device in (fleet.b_device,):
        tries.append(("drain B's device", "post", f"devices/{device.pk}/drain", {}))
        tries.append(("revoke B's device", "post", f"devices/{device.pk}/revoke", {}))
    return tries


def send(client, token, method, path, body):
    if method == "upload":
        upload = SimpleUploadedFile("planted.txt", b"planted")
        return client.post(
            f"/api/v1/{path}",
            {**body, "name": "planted.txt", "file": upload},
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
    return call(client, token, path, body, method=method)


def opened(client, token, tries, refused):
    """The tries the hub did not refuse, with its answer: empty when every one was."""
    answers = [
        (what, send(client, token, method, path, body)) for what, method, path, body in tries
    ]
    return [
        (what, answer.status_code, answer.content[:200])
        for what, answer in answers
        if answer.status_code not in refused
    ]


def test_a_device_cannot_take_delay_drop_or_read_another_class_s_jobs(client, fleet):
    before = rows()

    assert opened(client, fleet.token, device_calls(fleet), REFUSED) == []

    assert rows() == before


def test_asking_for_work_hands_over_its_own_class_s_jobs_only(client, fleet):
    before = rows()
    names_others = {
        "wait": 0,
        "device_class": fleet.classes[0].slug,
        "queue": fleet.classes[0].queue,
        "team": fleet.classes[0].team.slug,
        "job": fleet.jobs[1].pk,
    }

    answers = [
        call(client, fleet.token, "device/work", body) for body in ({"wait": 0}, names_others)
    ]

    assert [a.status_code for a in answers] == [200, 200]
    assert [a.json()["job"] for a in answers] == [None, None]
    assert rows() == before


def test_a_draining_device_sends_no_other_class_s_job_anywhere(client, fleet, broker):
    fleet.device.draining = True
    fleet.device.save()
    before = rows()
    queued = [job for job in fleet.jobs if job.state == JobState.QUEUED]

    for job in queued:
        answer = call(client, fleet.token, f"jobs/{job.pk}/claim", {"attempt": job.attempt})
        assert answer.status_code in REFUSED, answer.content

    # Not even a message on its own queue, and no job's sent_at moved (the reaper resends a
    # job whose message was lost by it).
    assert broker.llen(fleet.device.device_class.queue) == 0
    assert rows() == before


def test_a_device_token_opens_no_person_call_and_creates_nothing(client, fleet):
    before = rows()

    assert opened(client, fleet.token, person_calls(fleet), REFUSED_AT_A_PERSON_CALL) == []

    assert rows() == before


def test_a_device_token_cancels_nothing_on_the_web(client, fleet):
    before = rows()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {fleet.token}"}

    answers = [client.post(f"/jobs/{job.pk}/cancel", **headers) for job in fleet.jobs]

    assert {a.status_code for a in answers} == {302}
    assert all("/login/" in a["Location"] for a in answers)
    assert rows() == before


def test_a_broker_device_is_told_its_own_class_s_queue_whatever_it_sends(client, fleet):
    device, token = new_device(fleet.device.device_class, Delivery.BROKER)
    other_queue = fleet.classes[0].queue
    lure = {"queue": other_queue, "device_class": fleet.classes[0].slug}

    call(client, token, "device/heartbeat", lure)
    answer = client.get(
        f"/api/v1/device?queue={other_queue}", HTTP_AUTHORIZATION=f"Bearer {token}"
    ).json()

    assert answer["queue"] == device.device_class.queue != other_queue
    assert answer["device_class"] == device.device_class.slug


def test_no_answer_to_a_device_names_the_broker(client, fleet):
    answers = [
        client.get("/api/v1/device", HTTP_AUTHORIZATION=f"Bearer {fleet.token}"),
        call(client, fleet.token, "device/heartbeat", {}),
        call(client, fleet.token, "device/work", {"wait": 0}),
    ]

    for answer in answers:
        assert answer.status_code == 200
        assert_no_broker(answer.content.decode())


def assert_no_broker(text):
    broker_url = settings.CELERY_BROKER_URL
    assert broker_url and broker_url not in text
    assert not any(scheme in text for scheme in ("redis://", "amqp://", "filesystem://"))


@pytest.mark.e2e
def test_an_enrolled_device_gets_no_broker_and_b_s_worker_runs_b_s_job_after_a_s_tries(
    client, fleet, live_server, device_class, alice, start_worker, tmp_path
):
    from workers.enrolment import enrol

    record = EnrolmentToken(device_class=device_class, created_by=alice)
    secret = record.issue()
    record.save()
    config_path = tmp_path / "worker.json"
    saved, _, answer = enrol(live_server.url, secret, "a-enrolled", config_path=config_path)
    assert_no_broker(json.dumps(answer))
    assert_no_broker(config_path.read_text())
    token = saved["token"]
    before = rows()

    assert opened(client, token, device_calls(fleet), REFUSED) == []
    assert call(client, token, "device/work", {"wait": 0}).json()["job"] is None
    assert rows() == before

    b_job = next(job for job in fleet.jobs if job.state == JobState.QUEUED)
    worker = start_worker(fleet.b_device, fleet.b_token, mode="https")
    b_job = job_finished(b_job, worker)
    assert b_job.state == JobState.SUCCEEDED, b_job.error + worker.output()
    assert b_job.device_id == fleet.b_device.pk and b_job.attempt == 1
