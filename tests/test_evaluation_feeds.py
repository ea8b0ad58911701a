"""An evaluation is fed from the version's signature and contract, and counts real samples only."""

import io
import json

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.evaluation.actions import request_evaluation
from deployhub.evaluation.models import AccuracyRun
from deployhub.jobs.models import JobState
from deployhub.registry.uploads import create_dataset
from tests.conftest import stored_engine
from tests.io_models import FLOAT, INT64, io_version

pytestmark = pytest.mark.django_db
FIXED_BATCH_2 = [("image", FLOAT, [2, 3, 4, 4]), ("tokens", INT64, [2, 5])]


def call(client, token, path, body):
    return client.post(
        f"/api/v1/{path}",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def evaluation(alice, demo_team, device_class, samples=5):
    """Queue an evaluation of a fixed-batch-2 model's engine on a dataset of `samples` rows."""
    version = io_version(demo_team, alice, FIXED_BATCH_2)
    buffer = io.BytesIO()
    np.savez(
        buffer,
        image=np.ones((samples, 3, 4, 4), np.float32),
        tokens=np.ones((samples, 5), np.int64),
        labels=np.zeros(samples, np.int64),
    )
    upload = SimpleUploadedFile("val.npz", buffer.getvalue())
    dataset = create_dataset(version, upload, alice, kind="validation", name="val")
    engine = stored_engine(version, device_class)
    return request_evaluation(engine, alice, dataset=dataset)


def result(samples):
    return {
        "samples": samples,
        "reference": {"top1": 1.0},
        "engine": {"top1": 1.0},
        "top1_agreement": 1.0,
        "max_abs_error": 0.0,
        "mean_abs_error": 0.0,
        "cosine_min": 1.0,
        "cosine_mean": 1.0,
    }


def test_an_evaluate_job_carries_model_io_and_no_batch_of_its_own(
    client, alice, demo_team, device_class, make_device
):
    job = evaluation(alice, demo_team, device_class)
    _, token = make_device()

    body = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1}).json()

    assert body["model_io"]["contract"]["inputs"]["tokens"]["batch"] == {"sizes": [2]}
    assert [i["dtype"] for i in body["model_io"]["inputs"]] == ["float", "int64"]
    assert set(body["params"]) == {"max_samples", "dataset", "task"}  # no batch_size of its own
    assert body["params"]["task"]["task"] == job.model_version.task["task"]
    assert set(body["inputs"]) == {"engine", "model", "dataset"}


def test_it_records_the_real_samples_and_refuses_a_count_with_padding(
    client, alice, demo_team, device_class, make_device, django_capture_on_commit_callbacks
):
    job = evaluation(alice, demo_team, device_class, samples=5)  # batches 2, 2, 1 + 1 padded
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})

    padded = call(
        client,
        token,
        f"jobs/{job.pk}/complete",
        {"attempt": 1, "state": "succeeded", "result": result(6)},
    )
    assert padded.status_code == 400
    assert (
        "reports 6 samples evaluated; the dataset 'val' gives 1 to 5 real samples"
        in (padded.json()["error"])
    )
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and not AccuracyRun.objects.exists()

    with django_capture_on_commit_callbacks(execute=True):
        real = call(
            client,
            token,
            f"jobs/{job.pk}/complete",
            {"attempt": 1, "state": "succeeded", "result": result(5)},
        )
    assert real.status_code == 200, real.json()
    assert AccuracyRun.objects.get().samples == 5
