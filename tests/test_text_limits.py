"""Limits on text that everyone then reads: a person's too-long text is refused, saying so; a
device's log or error keeps its end; a fingerprint past its size is refused; the team's audit
trail comes a page at a time, and its CSV as a stream."""

import csv
import io

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import StreamingHttpResponse

from deployhub.devices.models import FingerprintChange
from deployhub.jobs.models import Job
from deployhub.registry.models import Model
from deployhub.releases.actions import propose
from deployhub.releases.models import Release, ReleaseState
from deployhub.teams.models import Event
from tests.api_calls import call, onnx_upload, token_for
from tests.compile_jobs import ENGINE_BYTES, FINGERPRINT, compile_, upload_and_complete
from tests.conftest import PASSWORD, stored_engine

pytestmark = pytest.mark.django_db

FOUR_MB = 4 * 1024 * 1024
TOO_LONG = "x" * 10_001  # DEPLOYHUB_MAX_TEXT_CHARS is 10,000


def signed_in(client, username="alice"):
    client.login(username=username, password=PASSWORD)
    return client


def post_json(client, user, path, body):
    headers = token_for(user)
    return client.post(f"/api/v1/{path}", body, content_type="application/json", **headers)


# A device's fingerprint


def test_a_4_mb_fingerprint_heartbeat_is_refused_and_keeps_nothing(client, make_device):
    device, token = make_device()
    assert call(client, token, "device/heartbeat", {"fingerprint": FINGERPRINT}).status_code == 200
    events = Event.objects.count()

    huge = {**FINGERPRINT, "cpu": {**FINGERPRINT["cpu"], "model": "x" * FOUR_MB}}
    response = call(client, token, "device/heartbeat", {"fingerprint": huge})

    assert response.status_code == 400
    assert "at most 65,536 are kept" in response.json()["error"]
    device.refresh_from_db()
    assert device.fingerprint == FINGERPRINT
    assert not FingerprintChange.objects.filter(device=device).exists()
    assert Event.objects.count() == events


def test_a_change_of_many_fields_is_summed_up_in_a_few_lines(client, make_device):
    device, token = make_device()
    many = {f"extra_{i}": "a" * 500 for i in range(120)}
    call(client, token, "device/heartbeat", {"fingerprint": {**FINGERPRINT, **many}})

    changed = {key: "b" * 500 for key in many}
    assert call(client, token, "device/heartbeat", {"fingerprint": changed}).status_code == 200

    [change] = FingerprintChange.objects.filter(device=device)
    assert len(change.summary) == 51 and change.summary[-1].startswith("… and ")
    assert max(len(line) for line in change.summary) <= 301
    event = Event.objects.get(verb="device.fingerprint_changed", target_id=device.pk)
    assert event.data["summary"] == change.summary


# A device's logs and errors


def test_a_jobs_log_keeps_its_last_characters(client, job, make_device, settings):
    settings.DEPLOYHUB_MAX_LOG_CHARS = 1_000
    device, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})

    for line in range(300):
        body = {"attempt": 1, "log": f"line {line:04d} of the build\n"}
        assert call(client, token, f"jobs/{job.pk}/heartbeat", body).status_code == 200

    job.refresh_from_db()
    assert len(job.log) <= 1_000 and job.log.endswith("line 0299 of the build\n")


def test_a_devices_long_error_keeps_its_end(client, job, make_device):
    device, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    error = "Traceback:\n" + "  frame\n" * (FOUR_MB // 8) + "RuntimeError: out of memory"

    body = {"attempt": 1, "state": "failed", "error": error}
    assert call(client, token, f"jobs/{job.pk}/complete", body).status_code == 200

    job.refresh_from_db()
    assert len(job.error) < 10_100
    assert job.error.startswith("[") and job.error.endswith("RuntimeError: out of memory")


def test_a_build_log_of_4_mb_keeps_its_end(client, version, device_class, alice, make_device):
    _, token = make_device()
    _, job = compile_(version, device_class, alice)
    call(client, token, "device/heartbeat", {"fingerprint": FINGERPRINT})
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": job.attempt})
    log = "[TRT] tactic\n" * (FOUR_MB // 13) + "[TRT] engine built in 41 s\n"

    response = upload_and_complete(client, job, token, ENGINE_BYTES, FINGERPRINT, log=log)

    assert response.status_code == 200 and response.json()["state"] == "succeeded"
    engine = Job.objects.get(pk=job.pk).engine
    assert len(engine.build_log) <= 200_100
    assert engine.build_log.endswith("[TRT] engine built in 41 s\n")


# A person's text


def test_a_release_note_of_4_mb_is_refused_by_the_api(client, version, device_class, alice):
    engine = stored_engine(version, device_class)

    response = post_json(client, alice, f"engines/{engine.pk}/releases", {"note": "x" * FOUR_MB})

    assert response.status_code == 400
    assert response.json()["error"] == "'note': String should have at most 10000 characters."
    assert not Release.objects.exists()


def test_a_too_long_note_is_refused_on_the_engine_page(client, version, device_class, alice):
    engine = stored_engine(version, device_class)

    response = signed_in(client).post(
        f"/engines/{engine.pk}/propose", {"note": TOO_LONG}, follow=True
    )

    assert "10,001 characters long: at most 10,000" in response.content.decode()
    assert not Release.objects.exists()


@pytest.fixture
def in_review(version, device_class, alice):
    release = propose(stored_engine(version, device_class), alice, "candidate")
    Release.objects.filter(pk=release.pk).update(state=ReleaseState.IN_REVIEW)
    return release


def test_a_too_long_review_comment_is_refused(client, in_review, bob):
    path = f"releases/{in_review.pk}/reviews"

    response = post_json(client, bob, path, {"decision": "approve", "comment": TOO_LONG})

    assert response.status_code == 400
    assert "'comment': String should have at most 10000" in response.json()["error"]
    assert not in_review.reviews.exists()
    page = signed_in(client, "bob").post(
        f"/releases/{in_review.pk}/review",
        {"decision": "request_changes", "comment": TOO_LONG},
        follow=True,
    )
    assert "The comment is 10,001 characters long" in page.content.decode()
    assert not in_review.reviews.exists()


def test_a_too_long_justification_or_reason_is_refused(client, in_review, alice):
    path = f"releases/{in_review.pk}/override"
    body = {"gate": "parity", "justification": TOO_LONG}

    response = post_json(client, alice, path, body)

    assert response.status_code == 400 and "'justification'" in response.json()["error"]
    page = signed_in(client).post(f"/releases/{in_review.pk}/override", body, follow=True)
    assert "The justification is 10,001 characters long" in page.content.decode()
    assert not in_review.overrides.exists()
    rollback = post_json(client, alice, f"releases/{in_review.pk}/rollback", {"reason": TOO_LONG})
    assert rollback.status_code == 400
    assert "'reason': String should have at most 10000" in rollback.json()["error"]


def test_a_too_long_model_description_or_notes_is_refused_by_the_api(client, alice, demo_team):
    headers = token_for(alice)
    for field in ("description", "notes"):
        body = {"name": f"long-{field}", "file": onnx_upload(), field: TOO_LONG}

        response = client.post("/api/v1/models", body, **headers)

        assert response.status_code == 400
        assert f"'{field}' is 10,001 characters long" in response.json()["error"]
    assert not Model.objects.filter(name__startswith="long-").exists()


def test_too_long_notes_are_said_on_the_version_page_and_not_saved(client, version):
    response = signed_in(client).post(
        f"/versions/{version.pk}/notes", {"notes": TOO_LONG, "tags": "a"}, follow=True
    )

    assert "Notes and tags not saved: notes: Ensure this value has at most 10000" in (
        response.content.decode()
    )
    version.refresh_from_db()
    assert version.notes != TOO_LONG and version.tags != ["a"]


def test_a_too_long_upload_note_or_class_description_is_a_form_error(client, alice, demo_team):
    signed_in(client)
    upload = SimpleUploadedFile("m.onnx", onnx_upload().read())

    page = client.post("/models/", {"name": "long", "notes": TOO_LONG, "file": upload})
    classes = client.post(
        "/devices/",
        {"slug": "long", "name": "Long", "description": TOO_LONG, "frame_budget_ms": 33.3},
    )

    assert "at most 10000 characters (it has 10001)" in page.content.decode()
    assert "at most 10000 characters (it has 10001)" in classes.content.decode()
    assert not Model.objects.filter(name="long").exists()
    assert not demo_team.device_classes.filter(slug="long").exists()


# The audit trail


@pytest.fixture
def long_trail(demo_team, version, alice):
    Event.objects.bulk_create(
        Event(
            team=demo_team,
            actor="alice",
            verb="version.notes",
            target_type="modelversion",
            target_id=version.pk,
            data={"n": n},
        )
        for n in range(250)
    )
    return demo_team


def test_the_audit_page_of_a_long_trail_comes_a_page_at_a_time(client, long_trail):
    first = signed_in(client).get("/team/audit/", {"verb": "version.notes"}).content.decode()
    second = client.get("/team/audit/", {"verb": "version.notes", "page": 2}).content.decode()
    last = client.get("/team/audit/", {"verb": "version.notes", "page": 99}).content.decode()

    assert first.count("<code>version.notes</code>") == 100
    assert "250 events, newest first: 1 to 100 shown" in first
    assert "n: 249" in first and "n: 149" not in first
    assert 'href="?verb=version.notes&amp;page=2"' in first
    assert second.count("<code>version.notes</code>") == 100 and "n: 149" in second
    assert last.count("<code>version.notes</code>") == 50 and "n: 0<" in last


def test_the_audit_csv_streams_every_event(client, long_trail):
    response = signed_in(client).get("/team/audit.csv", {"verb": "version.notes"})

    assert isinstance(response, StreamingHttpResponse)
    rows = list(csv.DictReader(io.StringIO(response.getvalue().decode())))
    assert len(rows) == 250 and rows[0]["data"] == '{"n": 249}'
