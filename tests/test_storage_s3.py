"""Models, artifacts and engines in an S3-compatible bucket (an in-process moto double of S3;
the filesystem storage is what every other test uses)."""

import hashlib

import boto3
import pytest
from moto import mock_aws

from deployhub.engines.models import Engine
from tests.api_calls import call, onnx_upload, token_for
from tests.compile_jobs import CONFIG, ENGINE_BYTES, FINGERPRINT, build, compile_

BUCKET = "deployhub-test"


@pytest.fixture
def s3_double(settings, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        settings.STORAGES = {
            **settings.STORAGES,
            "default": {
                "BACKEND": "storages.backends.s3.S3Storage",
                "OPTIONS": {"bucket_name": BUCKET, "default_acl": None, "file_overwrite": False},
            },
        }
        yield client


def keys(client):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", []))


def test_uploads_and_engines_live_in_the_bucket(
    client, alice, demo_team, device_class, make_device, s3_double, storage_root
):
    response = client.post(
        "/api/v1/models", {"name": "digits", "file": onnx_upload()}, **token_for(alice)
    )
    assert response.status_code == 201, response.json()
    version_sha = response.json()["version"]["sha256"]
    assert f"models/{version_sha[:2]}/{version_sha}.onnx" in keys(s3_double)

    from deployhub.registry.models import ModelVersion

    version = ModelVersion.objects.get()
    device, token = make_device("a")
    call(client, token, "device/heartbeat", {"fingerprint": FINGERPRINT})
    _, job = compile_(version, device_class, alice)
    assert build(client, job, token).status_code == 200
    engine = Engine.objects.get()
    assert engine.file.name in keys(s3_double)
    served = call(client, token, f"engines/{engine.pk}/download", method="get")
    assert b"".join(served.streaming_content) == ENGINE_BYTES
    assert hashlib.sha256(ENGINE_BYTES).hexdigest() == engine.sha256
    assert engine.build_config == {**CONFIG, "precision": "fp32"}  # stored canonical
    # Nothing stored on local disk, and no temporary file left behind.
    assert not (storage_root / "models").exists() and not (storage_root / "artifacts").exists()
    assert list((storage_root / "tmp").iterdir()) == []
