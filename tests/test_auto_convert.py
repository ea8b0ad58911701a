"""Auto mode converts a source whose opset every backend finds too old, then builds that.

The conversion is the Convert button's job (a derived child version, its largest
difference recorded); the worker's side is played here through the real API
with the real conversion (workers/checks/convert.py). tests/test_conformance.py takes
an opset-6 model to a recommendation with a real worker.
"""

import copy
import hashlib
import re

import onnx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.engines import auto
from deployhub.jobs.models import JobKind
from deployhub.registry.models import Model
from deployhub.registry.uploads import create_dataset, create_version
from tests.api_calls import call, token_for
from tests.compile_jobs import FINGERPRINT
from tests.conftest import PASSWORD
from tests.foreign_models import calibration_npz, old_opset_model
from workers.checks.convert import convert_onnx

pytestmark = pytest.mark.django_db
WITH_OPENVINO = {**copy.deepcopy(FINGERPRINT), "openvino": {"version": "2026.4.1"}}
CONVERTING = "Converting from opset 6 to 17 first: no backend runs an opset that old."


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "old.onnx"
    onnx.save(old_opset_model(), str(path))
    return path


@pytest.fixture
def token(make_device):
    device, token = make_device()
    device.fingerprint = WITH_OPENVINO
    device.save()
    return token


@pytest.fixture
def old(demo_team, alice, source, token):
    """The opset-6 model as version 1, with calibration data to evaluate builds on."""
    model = Model.objects.create(team=demo_team, name="old-zoo-model", created_by=alice)
    version = create_version(model, SimpleUploadedFile("old.onnx", source.read_bytes()), alice)
    data = calibration_npz(source.with_name("calibration.npz")).read_bytes()
    upload = SimpleUploadedFile("calibration.npz", data)
    create_dataset(version, upload, alice, kind="calibration", name="calibration")
    return version


def complete(client, token, job, capture, **body):
    """Claim a job as the device and complete it with body; return the response."""
    assert call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1}).status_code == 200
    with capture(execute=True):
        return call(client, token, f"jobs/{job.pk}/complete", {"attempt": 1, **body})


def convert_as_a_worker(client, token, job, source, capture):
    """Do the conversion job as a worker does: convert, upload the file, report it."""
    assert call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1}).status_code == 200
    converted = source.with_name("converted.onnx")
    result = convert_onnx(source, converted, job.params)
    data = converted.read_bytes()
    client.post(
        f"/api/v1/jobs/{job.pk}/artifacts",
        {"attempt": 1, "name": "onnx", "file": SimpleUploadedFile("converted.onnx", data)},
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    result = {**result, "artifact": "onnx", "artifact_sha256": hashlib.sha256(data).hexdigest()}
    body = {"attempt": 1, "state": "succeeded", "result": result}
    with capture(execute=True):
        answer = call(client, token, f"jobs/{job.pk}/complete", body)
    assert answer.status_code == 200, answer.content
    return result


def test_it_queues_the_conversion_before_any_build(old, device_class, alice):
    run = auto.start(old, device_class, alice)

    job = run.convert_job
    assert job.kind == JobKind.EXPORT and job.model_version == old
    assert job.params["convert_to_opset"] == 17 and job.params["auto_run"] == run.pk
    assert run.state == "running" and not run.builds.exists()
    assert run.summary == CONVERTING


def test_it_builds_the_converted_version_and_says_so_when_it_ends(
    old, device_class, alice, client, token, source, django_capture_on_commit_callbacks
):
    run = auto.start(old, device_class, alice)

    report = convert_as_a_worker(
        client, token, run.convert_job, source, django_capture_on_commit_callbacks
    )

    run.refresh_from_db()
    child = run.model_version
    assert run.converted_from == old and child.parent == old and child.opset == 17
    assert child.export_report["max_abs_diff"] == report["max_abs_diff"]
    builds = {(b.backend, b.precision): b for b in run.builds.all()}
    fp32 = builds[("onnxruntime", "fp32")]
    assert fp32.compile_job.model_version == child and not fp32.skipped
    assert "opset" not in builds[("tensorrt", "fp16")].skipped
    client.login(username="alice", password=PASSWORD)
    assert run.get_absolute_url() in client.get(old.get_absolute_url()).content.decode()
    # every build fails: the run ends, its summary opening with the conversion
    for build in run.builds.exclude(compile_job=None):
        error = {"state": "failed", "error": "internal: test"}
        complete(client, token, build.compile_job, django_capture_on_commit_callbacks, **error)
    run.refresh_from_db()
    assert run.state == "done"
    opening = re.escape(f"); builds are of v{child.number}. All ")
    assert re.match(
        rf"Converted from opset 6 to 17 first \(largest difference \d(\.\d)?e-\d{opening}",
        run.summary,
    ), run.summary
    answer = client.get(f"/api/v1/auto-runs/{run.pk}", **token_for(alice)).json()
    assert answer["model_version"] == child.pk and answer["converted_from"] == old.pk
    assert answer["convert_job"] == run.convert_job_id and answer["summary"] == run.summary


def test_a_failed_conversion_ends_the_run_saying_why_nothing_was_built(
    old, device_class, alice, client, token, django_capture_on_commit_callbacks
):
    run = auto.start(old, device_class, alice)
    error = "unsupported_operator: onnx.version_converter could not convert opset 6 to 17: x"

    complete(
        client,
        token,
        run.convert_job,
        django_capture_on_commit_callbacks,
        state="failed",
        error=error,
    )

    run.refresh_from_db()
    assert run.state == "done" and run.model_version == old and run.converted_from is None
    ort_builds = run.builds.filter(backend="onnxruntime")
    assert all("opset 6 is older than" in build.skipped for build in ort_builds)
    assert run.summary.startswith(f"Converting from opset 6 to 17 failed ({error}). No build ")
