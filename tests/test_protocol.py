"""The job protocol as a device sees it: claim, heartbeat, complete, artifacts, inputs."""

import hashlib

from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.jobs.actions import cancel_job, submit_job
from deployhub.jobs.models import Job, JobKind, JobState
from tests.api_calls import call
from tests.io_models import BOOL, FLOAT, INT64, io_version

RESULT = {
    "backend": "onnxruntime",
    "provider": "CPUExecutionProvider",
    "batch_size": 1,
    "warmup_iterations": 5,
    "iterations": 50,
    "intra_op_threads": 2,
    "latency_ms": {
        "min": 1.0,
        "p50": 1.2,
        "p90": 1.5,
        "p95": 1.6,
        "p99": 2.0,
        "max": 2.5,
        "mean": 1.3,
        "std": 0.2,
    },
    "throughput_ips": 769.2,
    "peak_rss_mb": 80.0,
    "rss_growth_mb": 3.0,
    "fingerprint": {"cpu": {"model": "Test CPU"}},
}


def test_it_refuses_calls_without_a_token(client, job):
    response = call(client, None, f"jobs/{job.pk}/claim", {"attempt": 1})
    assert response.status_code == 401
    assert "token" in response.json()["error"]


def test_it_refuses_an_unknown_token(client, job):
    response = call(client, "dht_not-a-real-token", f"jobs/{job.pk}/claim", {"attempt": 1})
    assert response.status_code == 401


def test_it_tells_a_device_who_it_is(client, make_device, device_class):
    device, token = make_device()
    body = call(client, token, "device", method="get").json()
    assert body["name"] == device.name
    assert body["queue"] == f"dc.{device_class.slug}"


def test_it_marks_a_device_online_on_heartbeat(client, make_device):
    device, token = make_device()
    assert not device.is_online
    response = call(client, token, "device/heartbeat", {"fingerprint": {"cpu": {"model": "X"}}})
    assert response.json()["state"] == "online"
    device.refresh_from_db()
    assert device.is_online and device.fingerprint["cpu"]["model"] == "X"


def test_it_gives_a_queued_job_to_the_claiming_device(client, job, make_device):
    device, token = make_device()
    response = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    assert response.status_code == 200
    body = response.json()
    assert body["kind"] == JobKind.BENCHMARK and body["params"] == {"iterations": 50}
    assert body["inputs"]["model"]["sha256"] == job.model_version.sha256
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.device == device and job.lease_expires_at


def test_it_sends_the_versions_signature_and_contract_with_the_job(
    client, alice, demo_team, device_class, make_device
):
    inputs = [("image", FLOAT, [2, 3, 4, 4]), ("tokens", INT64, [2, 5]), ("flag", BOOL, [2])]
    version = io_version(demo_team, alice, inputs)
    job = submit_job(
        team=demo_team,
        kind=JobKind.BENCHMARK,
        device_class=device_class,
        user=alice,
        model_version=version,
    )
    _, token = make_device()

    model_io = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1}).json()["model_io"]

    assert [(i["name"], i["dtype"], i["shape"]) for i in model_io["inputs"]] == [
        ("image", "float", [2, 3, 4, 4]),
        ("tokens", "int64", [2, 5]),
        ("flag", "bool", [2]),
    ]
    assert [o["name"] for o in model_io["outputs"]] == ["image_out", "tokens_out", "flag_out"]
    assert model_io["contract"]["inputs"]["tokens"] == {
        "shape": ["batch", 5],
        "batch": {"sizes": [2]},
        "dynamic": {},
    }
    assert model_io["contract"] == version.contract


def test_a_job_without_a_model_version_has_no_model_io(
    client, alice, demo_team, device_class, make_device
):
    job = submit_job(team=demo_team, kind=JobKind.NOOP, device_class=device_class, user=alice)
    _, token = make_device()

    body = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1}).json()

    assert body["kind"] == JobKind.NOOP and body["model_io"] is None


def test_it_refuses_a_redelivered_message_for_a_running_job(client, job, make_device):
    _, token_a = make_device()
    _, token_b = make_device()
    call(client, token_a, f"jobs/{job.pk}/claim", {"attempt": 1})
    response = call(client, token_b, f"jobs/{job.pk}/claim", {"attempt": 1})
    assert response.status_code == 409
    assert Job.objects.get(pk=job.pk).device.name != ""


def test_it_refuses_a_stale_attempt_at_claim(client, job, make_device):
    _, token = make_device()
    Job.objects.filter(pk=job.pk).update(attempt=2)
    response = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    assert response.status_code == 409
    assert "stale" in response.json()["error"]
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED


def test_it_refuses_to_hand_out_a_cancelled_job(client, job, make_device, alice):
    _, token = make_device()
    cancel_job(job.pk, alice)
    response = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    assert response.status_code == 409
    assert "cancelled" in response.json()["error"]


def test_it_refuses_a_device_of_another_class(client, job, make_device, demo_team):
    from deployhub.devices.models import DeviceClass

    other = DeviceClass.objects.create(team=demo_team, slug="other-class", name="Other")
    _, token = make_device(cls=other)
    assert call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1}).status_code == 403


def test_it_hides_jobs_of_other_teams_from_devices(client, job, charlie):
    from deployhub.devices.models import Device, DeviceClass

    acme_class = DeviceClass.objects.create(team=charlie.memberships.get().team, slug="acme-gpu")
    device = Device(device_class=acme_class, name="acme-1")
    token = device.issue_token()
    device.save()
    assert call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1}).status_code == 404


def test_it_extends_the_lease_and_records_progress_on_heartbeat(client, job, make_device):
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    first_lease = Job.objects.get(pk=job.pk).lease_expires_at
    body = call(
        client,
        token,
        f"jobs/{job.pk}/heartbeat",
        {"attempt": 1, "progress": 0.4, "message": "measuring", "log": "40 of 100\n"},
    ).json()
    job.refresh_from_db()
    assert job.lease_expires_at > first_lease
    assert job.progress == 0.4 and job.message == "measuring" and "40 of 100" in job.log
    assert body["cancel_requested"] is False


def test_it_tells_the_worker_when_cancel_was_requested(client, job, make_device, alice):
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    cancel_job(job.pk, alice)
    body = call(client, token, f"jobs/{job.pk}/heartbeat", {"attempt": 1}).json()
    assert body["cancel_requested"] is True
    call(client, token, f"jobs/{job.pk}/complete", {"attempt": 1, "state": "cancelled"})
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


def test_it_refuses_another_devices_heartbeat_with_403(client, job, make_device):
    _, token_a = make_device()
    _, token_b = make_device()
    call(client, token_a, f"jobs/{job.pk}/claim", {"attempt": 1})
    response = call(client, token_b, f"jobs/{job.pk}/heartbeat", {"attempt": 1})
    assert response.status_code == 403


def test_it_stores_a_benchmark_result_with_the_completion(client, job, make_device):
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    response = call(
        client,
        token,
        f"jobs/{job.pk}/complete",
        {"attempt": 1, "state": "succeeded", "result": RESULT, "log": "done\n"},
    )
    assert response.status_code == 200
    run = BenchmarkRun.objects.get(job=job)
    assert run.latency_p50_ms == 1.2 and run.latency_p99_ms == 2.0 and run.throughput_ips == 769.2
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.progress == 1.0 and job.finished_at


def test_it_answers_a_repeated_completion_without_storing_twice(client, job, make_device):
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    body = {"attempt": 1, "state": "succeeded", "result": RESULT}
    assert call(client, token, f"jobs/{job.pk}/complete", body).status_code == 200
    assert call(client, token, f"jobs/{job.pk}/complete", body).status_code == 200
    assert BenchmarkRun.objects.filter(job=job).count() == 1


def test_it_refuses_a_completion_with_a_stale_attempt_and_changes_nothing(client, job, make_device):
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    Job.objects.filter(pk=job.pk).update(attempt=2, state=JobState.QUEUED, device=None)
    before = Job.objects.get(pk=job.pk)
    response = call(
        client,
        token,
        f"jobs/{job.pk}/complete",
        {"attempt": 1, "state": "succeeded", "result": RESULT},
    )
    assert response.status_code == 409
    after = Job.objects.get(pk=job.pk)
    assert (after.state, after.attempt, after.log) == (before.state, before.attempt, before.log)
    assert not BenchmarkRun.objects.filter(job=job).exists()


def test_it_rejects_a_malformed_result_and_keeps_the_job_running(client, job, make_device):
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    response = call(
        client,
        token,
        f"jobs/{job.pk}/complete",
        {"attempt": 1, "state": "succeeded", "result": {"backend": "x"}},
    )
    assert response.status_code == 400
    assert "malformed" in response.json()["error"]
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING


def test_it_rejects_a_body_that_is_not_json(client, job, make_device):
    _, token = make_device()
    response = client.post(
        f"/api/v1/jobs/{job.pk}/claim",
        b"{not json",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 400


def test_it_serves_the_model_only_to_the_device_running_the_job(client, job, make_device):
    _, token_a = make_device()
    _, token_b = make_device()
    url = f"jobs/{job.pk}/inputs/model"
    assert call(client, token_a, url, method="get").status_code == 403
    call(client, token_a, f"jobs/{job.pk}/claim", {"attempt": 1})
    response = call(client, token_a, url, method="get")
    assert response.status_code == 200
    assert "attachment" in response["Content-Disposition"]
    body = b"".join(response.streaming_content)
    assert hashlib.sha256(body).hexdigest() == job.model_version.sha256
    assert call(client, token_b, url, method="get").status_code == 403


def test_it_stores_an_artifact_of_the_running_attempt(client, job, make_device):
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    upload = SimpleUploadedFile("../../engine.bin", b"engine bytes")
    response = client.post(
        f"/api/v1/jobs/{job.pk}/artifacts",
        {"attempt": 1, "name": "../../engine.bin", "file": upload},
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 201
    artifact = job.artifacts.get()
    assert artifact.sha256 == hashlib.sha256(b"engine bytes").hexdigest()
    assert artifact.name == "engine.bin" and ".." not in artifact.file.name


def test_it_refuses_an_artifact_from_a_stale_attempt_and_keeps_no_file(
    client, job, make_device, settings
):
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    Job.objects.filter(pk=job.pk).update(attempt=2)
    upload = SimpleUploadedFile("engine.bin", b"late engine")
    response = client.post(
        f"/api/v1/jobs/{job.pk}/artifacts",
        {"attempt": 1, "name": "engine.bin", "file": upload},
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 409
    assert not job.artifacts.exists()
    assert list(settings.FILE_UPLOAD_TEMP_DIR.iterdir()) == []
    digest = hashlib.sha256(b"late engine").hexdigest()
    assert not (settings.STORAGE_ROOT / "artifacts" / digest[:2] / digest).exists()


def test_a_refused_artifact_never_touches_the_stored_file_of_the_same_bytes(
    client, job, make_device, monkeypatch
):
    """A stale attempt uploading what the holder stored must not place (then remove) it."""
    from deployhub.core import store

    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    Job.objects.filter(pk=job.pk).update(attempt=2)
    placed = []
    monkeypatch.setattr(store, "place", lambda *args, **kw: placed.append(args) or True)
    response = client.post(
        f"/api/v1/jobs/{job.pk}/artifacts",
        {"attempt": 1, "name": "engine.bin", "file": SimpleUploadedFile("e", b"same bytes")},
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 409 and placed == []


def test_an_artifact_whose_row_is_not_saved_leaves_no_file(
    client, job, make_device, settings, monkeypatch
):
    from django.db import OperationalError

    from deployhub.jobs.models import Artifact

    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})

    def database_gone(**fields):
        raise OperationalError("the database went away")

    monkeypatch.setattr(Artifact.objects, "create", database_gone)
    response = client.post(
        f"/api/v1/jobs/{job.pk}/artifacts",
        {"attempt": 1, "name": "engine.bin", "file": SimpleUploadedFile("e", b"unsaved engine")},
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 503 and "error" in response.json()
    digest = hashlib.sha256(b"unsaved engine").hexdigest()
    assert not (settings.STORAGE_ROOT / "artifacts" / digest[:2] / digest).exists()
    assert list(settings.FILE_UPLOAD_TEMP_DIR.iterdir()) == []


def test_a_draining_device_is_refused_and_the_job_goes_back_on_the_queue(
    client, job, make_device, broker
):
    device, token = make_device()
    device.draining = True
    device.save()
    queue = job.device_class.queue
    broker.delete(queue)
    response = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    assert response.status_code == 409 and "draining" in response.json()["error"]
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    assert broker.llen(queue) == 1  # republished for another device of the class


def test_the_heartbeat_tells_a_drained_device_so(client, make_device):
    device, token = make_device()
    device.draining = True
    device.save()
    assert call(client, token, "device/heartbeat", {}).json()["state"] == "draining"


def fail_claimed(client, job, make_device, **fields):
    """Claim the job with a new device and complete it failed with these fields."""
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    body = {"attempt": 1, "state": "failed", **fields}
    response = call(client, token, f"jobs/{job.pk}/complete", body)
    job.refresh_from_db()
    return response


def test_a_failed_build_keeps_the_category_its_worker_sent(client, job, make_device):
    error = "Could not find an implementation for ConvInteger(10)"

    fail_claimed(client, job, make_device, error=error, failure_category="unsupported_operator")

    assert job.failure_category == "unsupported_operator"
    assert job.failure_label == "Unsupported operator"


def test_an_error_that_reads_like_a_category_is_not_one(client, job, make_device):
    fail_claimed(client, job, make_device, error="timeout: the hub was slow")

    assert job.state == JobState.FAILED and job.failure_category == ""


def test_it_refuses_a_failure_category_it_does_not_know(client, job, make_device):
    response = fail_claimed(client, job, make_device, error="x", failure_category="cosmic_rays")

    assert response.status_code == 400 and "failure_category" in response.json()["error"]
    assert job.state == JobState.RUNNING
