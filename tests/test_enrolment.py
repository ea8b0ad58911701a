"""Devices that enrol themselves with a class's enrolment token, and devices an admin revokes.

A team admin makes an enrolment token on the class page or through the API (its secret
shown once), and a device posts it to /api/v1/enrol with its host name and machine id:
it becomes an HTTPS device of the class with a device token of its own, and the same
machine enrolling again gets its device back with a fresh token (a revoked device stays
revoked: the machine becomes a new one). A revoked device's token stops working and the
job it was running goes back on the queue.
"""

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from deployhub.devices.actions import create_enrolment_token, revoke_device
from deployhub.devices.models import Delivery, Device, EnrolmentToken
from deployhub.jobs.actions import claim_job, submit_job
from deployhub.jobs.models import Job, JobKind, JobState
from deployhub.teams.models import Event, TokenFailures
from tests.api_calls import call, token_for
from tests.conftest import PASSWORD

WORKER = "deployhub-worker/0.9.1 protocol/2"
FINGERPRINT = {"cpu": {"model": "Test CPU", "count": 4}, "memory_mb": 2048}
REVOKED_DEVICE = (
    "This device was revoked at {:%Y-%m-%d %H:%M} UTC: enrol it again with a new enrolment token."
)


def enrol(client, secret, name="edge-1", machine_id="machine-1", **extra):
    body = {"token": secret, "name": name, "machine_id": machine_id, **extra}
    return client.post(
        "/api/v1/enrol", json.dumps(body), content_type="application/json", HTTP_USER_AGENT=WORKER
    )


def tokens_api(client, user, device_class, body=None, method="post"):
    path = f"/api/v1/device-classes/{device_class.slug}/enrolment-tokens"
    if method == "get":
        return client.get(path, **token_for(user))
    return client.post(
        path, json.dumps(body or {}), content_type="application/json", **token_for(user)
    )


@pytest.fixture
def secret(device_class, alice):
    """A usable enrolment token of the test class, as its secret."""
    return create_enrolment_token(device_class, alice)[1]


def record_of(device_class):
    return EnrolmentToken.objects.get(device_class=device_class)


def verbs(**target):
    return list(Event.objects.filter(**target).order_by("id").values_list("verb", flat=True))


def snapshot(device_class):
    """What an enrolment that is refused must leave as it was."""
    tokens = EnrolmentToken.objects.filter(device_class=device_class).order_by("id")
    return (
        list(Device.objects.order_by("id").values_list("id", "token_hash", "revoked_at")),
        list(tokens.values_list("uses", flat=True)),
        Event.objects.count(),
    )


# Enrolment tokens: made, listed and revoked by an admin.


def test_an_admin_makes_lists_and_revokes_enrolment_tokens_through_the_api(
    client, alice, device_class
):
    made = tokens_api(
        client, alice, device_class, {"expires_in_days": 7, "max_devices": 3, "note": "rack"}
    )

    assert made.status_code == 201
    body = made.json()
    secret, shown = body["token"], body["enrolment_token"]
    assert secret.startswith("dhe_") and shown["hint"] == secret[:8]
    assert (shown["max_devices"], shown["uses"], shown["note"], shown["state"]) == (
        3,
        0,
        "rack",
        "usable",
    )
    assert f"deployhub-worker enroll --hub http://testserver --token {secret}" in body["setup"]
    record = EnrolmentToken.objects.get(pk=shown["id"])
    assert record.token_hash != secret and secret not in json.dumps(
        list(EnrolmentToken.objects.values()), default=str
    )
    assert timedelta(days=6, hours=23) < record.expires_at - timezone.now() <= timedelta(days=7)

    listed = tokens_api(client, alice, device_class, method="get").json()
    assert [t["id"] for t in listed["items"]] == [record.pk] and listed["count"] == 1
    assert secret not in json.dumps(listed)

    revoked = client.post(f"/api/v1/enrolment-tokens/{record.pk}/revoke", **token_for(alice))
    assert revoked.status_code == 200 and revoked.json()["enrolment_token"]["state"] == "revoked"
    record.refresh_from_db()
    assert record.revoked_at is not None
    assert verbs(target_type="enrolmenttoken") == [
        "enrolment_token.created",
        "enrolment_token.revoked",
    ]


def test_an_admin_makes_a_token_on_the_class_page_and_sees_its_secret_once(
    client, alice, device_class, settings
):
    settings.DEPLOYHUB_PUBLIC_URL = "https://hub.example.com"
    client.login(username="alice", password=PASSWORD)
    page = client.post(
        f"/devices/classes/{device_class.pk}/enrolment-tokens", {"max_devices": "2", "note": "lab"}
    )

    assert page.status_code == 200
    record = record_of(device_class)
    secret = page.context["new_enrolment"]["token"]
    text = page.content.decode()
    assert secret.startswith("dhe_") and record.max_devices == 2 and record.note == "lab"
    assert "https://hub.example.com/downloads/deployhub-" in text
    assert f"deployhub-worker enroll --hub https://hub.example.com --token {secret}" in text
    assert "deployhub-worker run" in text

    again = client.get(f"/devices/classes/{device_class.pk}/").content.decode()
    assert secret not in again
    assert "--token &lt;enrolment token&gt;" in again and record.token_hint in again

    revoked = client.post(f"/devices/enrolment-tokens/{record.pk}/revoke")
    assert revoked.status_code == 302
    record.refresh_from_db()
    assert record.revoked_at is not None
    assert verbs(target_type="enrolmenttoken") == [
        "enrolment_token.created",
        "enrolment_token.revoked",
    ]


def test_the_page_refuses_a_bad_token_form_and_makes_nothing(client, alice, device_class):
    client.login(username="alice", password=PASSWORD)
    page = client.post(f"/devices/classes/{device_class.pk}/enrolment-tokens", {"max_devices": "0"})
    assert page.status_code == 400
    assert "greater than or equal to 1" in page.content.decode()
    assert not EnrolmentToken.objects.exists()


def test_the_api_refuses_bad_token_fields_and_makes_nothing(client, alice, device_class):
    for body in ({"expires_in_days": 0}, {"max_devices": "many"}, {"note": "x" * 201}):
        answer = tokens_api(client, alice, device_class, body)
        assert answer.status_code == 400, body
        assert list(body)[0] in answer.json()["error"]
    assert not EnrolmentToken.objects.exists()


@pytest.mark.parametrize("who", ["bob", "vera"])
def test_only_an_admin_makes_lists_or_revokes_enrolment_tokens(
    client, request, alice, device_class, who
):
    user = request.getfixturevalue(who)
    record, _ = create_enrolment_token(device_class, alice)

    assert tokens_api(client, user, device_class).status_code == 403
    assert tokens_api(client, user, device_class, method="get").status_code == 403
    assert (
        client.post(f"/api/v1/enrolment-tokens/{record.pk}/revoke", **token_for(user)).status_code
        == 403
    )
    client.login(username=who, password=PASSWORD)
    assert (
        client.post(f"/devices/classes/{device_class.pk}/enrolment-tokens", {}).status_code == 403
    )
    assert client.post(f"/devices/enrolment-tokens/{record.pk}/revoke").status_code == 403
    assert (
        "enrolment-tokens"
        not in client.get(f"/devices/classes/{device_class.pk}/").content.decode()
    )

    record.refresh_from_db()
    assert EnrolmentToken.objects.count() == 1 and record.revoked_at is None


def test_another_team_cannot_find_the_class_or_its_tokens(client, alice, charlie, device_class):
    record, _ = create_enrolment_token(device_class, alice)

    assert tokens_api(client, charlie, device_class).status_code == 404
    assert tokens_api(client, charlie, device_class, method="get").status_code == 404
    assert (
        client.post(
            f"/api/v1/enrolment-tokens/{record.pk}/revoke", **token_for(charlie)
        ).status_code
        == 404
    )
    client.login(username="charlie", password=PASSWORD)
    assert (
        client.post(f"/devices/classes/{device_class.pk}/enrolment-tokens", {}).status_code == 404
    )
    assert client.post(f"/devices/enrolment-tokens/{record.pk}/revoke").status_code == 404
    record.refresh_from_db()
    assert EnrolmentToken.objects.count() == 1 and record.revoked_at is None


# POST /api/v1/enrol


def test_enrolling_makes_an_https_device_of_the_class_with_a_token_of_its_own(
    client, device_class, secret
):
    answer = enrol(client, secret, fingerprint=FINGERPRINT)

    assert answer.status_code == 201
    body = answer.json()
    assert body["created"] is True and body["token"].startswith("dht_")
    assert (
        body["device"]["name"] == "edge-1" and body["device"]["device_class"] == device_class.slug
    )
    device = Device.objects.get(pk=body["device"]["id"])
    assert device.delivery == Delivery.HTTPS and device.machine_id == "machine-1"
    assert device.enrolled_with == record_of(device_class) and record_of(device_class).uses == 1
    assert (device.worker_version, device.protocol_version) == ("0.9.1", 2)
    assert device.fingerprint == FINGERPRINT
    assert call(client, body["token"], "device", method="get").json() == body["device"]
    assert verbs(target_type="device", target_id=device.pk) == ["device.enrolled"]


def test_enrolling_the_same_machine_again_gives_its_device_a_fresh_token(
    client, device_class, secret, version, alice
):
    first = enrol(client, secret).json()
    device = Device.objects.get(pk=first["device"]["id"])
    running = submit_job(
        team=version.team, kind=JobKind.NOOP, device_class=device_class, user=alice
    )
    Job.objects.filter(pk=running.pk).update(state=JobState.RUNNING, device=device)

    again = enrol(client, secret, name="edge-1")

    assert again.status_code == 200
    body = again.json()
    assert body["created"] is False and body["device"]["id"] == first["device"]["id"]
    assert body["token"] != first["token"]
    assert call(client, first["token"], "device", method="get").status_code == 401
    assert call(client, body["token"], "device", method="get").status_code == 200
    assert Device.objects.count() == 1
    assert record_of(device_class).uses == 1  # enrolling again takes no use
    running.refresh_from_db()  # the old token's worker finishes nothing: the job runs again
    assert (running.state, running.attempt, running.device) == (JobState.QUEUED, 2, None)
    assert "enrolled again" in running.log
    assert verbs(target_type="device", target_id=device.pk) == [
        "device.enrolled",
        "device.re_enrolled",
    ]


def test_a_revoked_device_stays_revoked_when_its_machine_enrols_again(
    client, device_class, secret, alice
):
    first = enrol(client, secret).json()
    old = Device.objects.get(pk=first["device"]["id"])
    revoke_device(old, alice)

    again = enrol(client, secret, name="edge-1")

    assert again.status_code == 201  # a new device, counted: a revoke is never undone
    body = again.json()
    assert body["created"] is True and body["device"]["id"] != old.pk
    assert body["device"]["name"] == "edge-1"
    old.refresh_from_db()
    assert old.revoked_at is not None and old.name == f"edge-1-revoked-{old.pk}"
    assert call(client, first["token"], "device", method="get").status_code == 401
    assert record_of(device_class).uses == 2


def test_a_token_enrols_no_more_than_its_max_devices(client, device_class, alice):
    _, secret = create_enrolment_token(device_class, alice, max_devices=2)
    assert enrol(client, secret, name="a", machine_id="m-a").status_code == 201
    assert enrol(client, secret, name="b", machine_id="m-b").status_code == 201
    before = snapshot(device_class)

    third = enrol(client, secret, name="c", machine_id="m-c")

    assert third.status_code == 403
    assert third.json() == {"error": "This enrolment token has enrolled its 2 device(s)."}
    assert snapshot(device_class) == before
    # A machine it enrolled may still enrol again: that takes no use.
    assert enrol(client, secret, name="a", machine_id="m-a").status_code == 200


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"revoked_at": timezone.now() - timedelta(minutes=1)},
            "This enrolment token was revoked at",
        ),
        ({"expires_at": timezone.now() - timedelta(minutes=1)}, "This enrolment token expired at"),
    ],
)
def test_a_revoked_or_expired_token_is_refused_and_changes_nothing(
    client, device_class, secret, change, message
):
    assert enrol(client, secret, name="old", machine_id="m-old").status_code == 201
    EnrolmentToken.objects.filter(device_class=device_class).update(**change)
    before = snapshot(device_class)

    for name, machine_id in (("new", "m-new"), ("old", "m-old")):  # a new machine, and again
        answer = enrol(client, secret, name=name, machine_id=machine_id)
        assert answer.status_code == 403
        assert answer.json()["error"].startswith(message) and answer.json()["error"].endswith(
            "UTC."
        )

    assert snapshot(device_class) == before


def test_an_unknown_token_is_401_and_counts_as_a_guess(client, device_class, secret):
    before = snapshot(device_class)

    answer = enrol(client, "dhe_made-up")

    assert answer.status_code == 401 and answer.json() == {
        "error": "This enrolment token is not valid."
    }
    assert TokenFailures.objects.get(address="127.0.0.1").failures == 1
    assert snapshot(device_class) == before


def test_a_device_token_sent_to_enrol_is_refused_and_not_counted(client, make_device):
    _, token = make_device()
    answer = enrol(client, token)
    assert answer.status_code == 403 and "enrolment token (dhe_...)" in answer.json()["error"]
    assert not TokenFailures.objects.exists()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"name": ""}, "'name': it is required"),
        ({"name": "x" * 101}, "'name' is 101 characters long: at most 100"),
        ({"machine_id": None}, "'machine_id': it is required"),
        ({"machine_id": "m" * 129}, "at most 128"),
        ({"token": 3}, "'token' must be a string"),
        ({"fingerprint": {"os": "Linux"}}, "fingerprint.os must be an object"),
    ],
)
def test_bad_fields_are_400_and_change_nothing(client, device_class, secret, body, words):
    before = snapshot(device_class)
    fields = {"token": secret, "name": "edge-1", "machine_id": "machine-1", **body}
    answer = client.post("/api/v1/enrol", json.dumps(fields), content_type="application/json")
    assert answer.status_code == 400 and words in answer.json()["error"]
    assert snapshot(device_class) == before


def test_a_name_another_machine_has_is_409_and_says_how_to_choose_another(
    client, device_class, secret, make_device
):
    make_device("by-hand")
    enrol(client, secret, name="edge-1", machine_id="machine-1")
    before = snapshot(device_class)

    for name in ("edge-1", "by-hand"):
        answer = enrol(client, secret, name=name, machine_id="machine-2")
        assert answer.status_code == 409
        assert "--name" in answer.json()["error"] and repr(name) in answer.json()["error"]

    assert snapshot(device_class) == before


@pytest.mark.django_db(transaction=True)
def test_two_machines_enrolling_at_once_never_pass_max_devices(device_class, alice, monkeypatch):
    record, secret = create_enrolment_token(device_class, alice, max_devices=1)
    both_checked = threading.Barrier(2, timeout=2)
    refusal = EnrolmentToken.refusal

    def refusal_then_wait(self, *args, **kwargs):
        said = refusal(self, *args, **kwargs)
        try:  # without the row lock, both machines get here before either counts its use
            both_checked.wait()
        except threading.BrokenBarrierError:
            pass  # the other one waits on the lock: as it should
        return said

    monkeypatch.setattr(EnrolmentToken, "refusal", refusal_then_wait)
    answers = []

    def enrol_machine(n):
        from django.test import Client

        try:
            answers.append(
                enrol(Client(), secret, name=f"edge-{n}", machine_id=f"m-{n}").status_code
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=enrol_machine, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(answers) == [201, 403]
    record.refresh_from_db()
    assert record.uses == 1 and Device.objects.filter(device_class=device_class).count() == 1


# Revoking a device.


def running_job(job, device):
    claim_job(job.pk, device, 1)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


def test_an_admin_revokes_a_device_through_the_api_and_its_job_goes_back_on_the_queue(
    client, alice, job, make_device
):
    device, token = make_device()
    running_job(job, device)

    answer = client.post(f"/api/v1/devices/{device.pk}/revoke", **token_for(alice))

    assert answer.status_code == 200 and answer.json()["revoked_at"]
    device.refresh_from_db()
    refused = call(client, token, f"jobs/{job.pk}/heartbeat", {"attempt": 1})
    assert refused.status_code == 401
    assert refused.json() == {"error": REVOKED_DEVICE.format(device.revoked_at)}
    assert not TokenFailures.objects.exists()  # a known token: not a guess
    job.refresh_from_db()
    assert (job.state, job.attempt, job.device) == (JobState.QUEUED, 2, None)
    assert f"device {device} was revoked" in job.log
    assert verbs(target_type="device", target_id=device.pk) == ["device.revoked"]
    assert verbs(target_type="job", target_id=job.pk)[-1] == "job.device_revoked.queued"


def test_an_admin_revokes_a_device_from_its_page(client, alice, job, make_device):
    device, token = make_device()
    running_job(job, device)
    client.login(username="alice", password=PASSWORD)
    assert 'id="revoke-device"' in client.get(f"/devices/{device.pk}/").content.decode()

    assert client.post(f"/devices/{device.pk}/revoke").status_code == 302

    page = client.get(f"/devices/{device.pk}/").content.decode()
    assert 'id="revoked"' in page and 'id="revoke-device"' not in page
    assert call(client, token, "device", method="get").status_code == 401
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    assert verbs(target_type="device", target_id=device.pk) == ["device.revoked"]


def test_a_revoked_device_cannot_claim_a_job(client, alice, job, make_device):
    device, token = make_device()
    revoke_device(device, alice)

    # The one-statement claim (PostgreSQL) takes nothing for it; the usual way refuses it.
    answer = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})

    assert answer.status_code == 401 and "was revoked" in answer.json()["error"]
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.device is None


def test_a_job_on_its_last_attempt_fails_when_its_device_is_revoked(alice, job, make_device):
    device, _ = make_device()
    Job.objects.filter(pk=job.pk).update(max_attempts=1)
    running_job(job, device)

    revoke_device(device, alice)

    job.refresh_from_db()
    assert job.state == JobState.FAILED and "was revoked during attempt 1, its last" in job.error


@pytest.mark.parametrize("who", ["bob", "vera"])
def test_only_an_admin_revokes_a_device(client, request, make_device, who):
    user = request.getfixturevalue(who)
    device, token = make_device()

    assert client.post(f"/api/v1/devices/{device.pk}/revoke", **token_for(user)).status_code == 403
    client.login(username=who, password=PASSWORD)
    assert client.post(f"/devices/{device.pk}/revoke").status_code == 403

    device.refresh_from_db()
    assert (
        device.revoked_at is None and call(client, token, "device", method="get").status_code == 200
    )
    assert verbs(target_type="device", target_id=device.pk) == []


def test_another_team_cannot_revoke_the_device(client, charlie, make_device):
    device, _ = make_device()
    assert (
        client.post(f"/api/v1/devices/{device.pk}/revoke", **token_for(charlie)).status_code == 404
    )
    client.login(username="charlie", password=PASSWORD)
    assert client.post(f"/devices/{device.pk}/revoke").status_code == 404
    device.refresh_from_db()
    assert device.revoked_at is None
