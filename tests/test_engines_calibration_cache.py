"""TensorRT INT8 calibration caches: stored from a build, handed to the next one that can use it.

The worker's side is played through the real API (no GPU here); the TensorRT
build that writes and reads the cache is proven by `deployhub-worker selftest`.
"""

import copy
import hashlib

import pytest
from django.core.files import File
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.engines.actions import request_compile
from deployhub.engines.models import CalibrationCache
from deployhub.registry.uploads import create_dataset
from tests.api_calls import call
from tests.compile_jobs import ENGINE_BYTES_OF, FINGERPRINT
from tests.conftest import ASSETS

CONFIG = {"precision": "int8"}
SCALES = b"TRT-1016-EntropyCalibration2\ninput: 3c010a14\n"


def gpu_fingerprint(tensorrt="10.16.1.11"):
    fingerprint = copy.deepcopy(FINGERPRINT)
    fingerprint["gpus"] = [{"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mb": 1}]
    fingerprint["nvidia_driver"] = "580.95.05"
    fingerprint["cuda"] = {"driver_api": "13.0", "runtime": "13.0"}
    fingerprint["tensorrt"] = {"version": tensorrt}
    return fingerprint


@pytest.fixture
def calibration(version, alice):
    with open(ASSETS / "calibration.npz", "rb") as handle:
        return create_dataset(
            version, File(handle, name="calibration.npz"), alice, kind="calibration", name="calib"
        )


@pytest.fixture
def gpu_device(make_device, client):
    def make(name, tensorrt="10.16.1.11"):
        device, token = make_device(name)
        call(client, token, "device/heartbeat", {"fingerprint": gpu_fingerprint(tensorrt)})
        return token

    return make


def build_int8(client, job, token, scales=SCALES):
    """Play a TensorRT INT8 build that calibrated and uploads its calibration cache."""
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": job.attempt})
    plan = ENGINE_BYTES_OF["tensorrt"]
    for name, content in {"engine": plan, "calibration_cache": scales}.items():
        client.post(
            f"/api/v1/jobs/{job.pk}/artifacts",
            {"attempt": job.attempt, "name": name, "file": SimpleUploadedFile(name, content)},
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
    result = {
        "backend": "tensorrt",
        "fingerprint": gpu_fingerprint(),
        "artifact": "engine",
        "artifact_sha256": hashlib.sha256(plan).hexdigest(),
        "calibration_cache_sha256": hashlib.sha256(scales).hexdigest(),
    }
    body = {"attempt": job.attempt, "state": "succeeded", "result": result}
    return call(client, token, f"jobs/{job.pk}/complete", body)


def compile_int8(version, device_class, user, config=CONFIG):
    return request_compile(version, device_class, "tensorrt", config, user)[1]


def test_it_stores_the_calibration_cache_an_int8_build_uploads(
    client, version, device_class, alice, calibration, gpu_device
):
    token = gpu_device("gpu-a")
    assert build_int8(client, compile_int8(version, device_class, alice), token).status_code == 200
    cache = CalibrationCache.objects.get()
    assert (cache.model_version, cache.dataset, cache.tensorrt_version) == (
        version,
        calibration,
        "10.16.1.11",
    )
    assert cache.sha256 == hashlib.sha256(SCALES).hexdigest()


def test_the_next_int8_build_of_that_tensorrt_version_gets_it_as_an_input(
    client, version, device_class, alice, calibration, gpu_device
):
    build_int8(client, compile_int8(version, device_class, alice), gpu_device("gpu-a"))
    job = compile_int8(version, device_class, alice, {**CONFIG, "optimization_level": 5})
    other_gpu = gpu_device("gpu-b")  # another device, same TensorRT release: same scales
    claimed = call(client, other_gpu, f"jobs/{job.pk}/claim", {"attempt": 1}).json()
    assert claimed["inputs"]["calibration_cache"]["sha256"] == hashlib.sha256(SCALES).hexdigest()
    served = call(client, other_gpu, f"jobs/{job.pk}/inputs/calibration_cache", method="get")
    assert b"".join(served.streaming_content) == SCALES


def test_another_class_never_gets_the_scales_a_device_of_this_class_computed(
    client, version, device_class, alice, calibration, make_device, demo_team
):
    import uuid

    from deployhub.devices.models import DeviceClass

    other = DeviceClass.objects.create(
        team=demo_team, slug=f"gpu-{uuid.uuid4().hex[:6]}", name="Other GPUs", frame_budget_ms=10
    )
    device, token = make_device("gpu-a")
    call(client, token, "device/heartbeat", {"fingerprint": gpu_fingerprint()})
    build_int8(client, compile_int8(version, device_class, alice), token)
    _, elsewhere = make_device("gpu-other", cls=other)
    call(client, elsewhere, "device/heartbeat", {"fingerprint": gpu_fingerprint()})
    job = compile_int8(version, other, alice)

    claimed = call(client, elsewhere, f"jobs/{job.pk}/claim", {"attempt": 1}).json()

    assert "calibration_cache" not in claimed["inputs"]  # same TensorRT, another class


def test_another_tensorrt_version_calibrates_again(
    client, version, device_class, alice, calibration, gpu_device
):
    build_int8(client, compile_int8(version, device_class, alice), gpu_device("gpu-a"))
    job = compile_int8(version, device_class, alice, {**CONFIG, "optimization_level": 5})
    newer = gpu_device("gpu-new", tensorrt="10.17.0.3")
    claimed = call(client, newer, f"jobs/{job.pk}/claim", {"attempt": 1}).json()
    assert "calibration_cache" not in claimed["inputs"]
    refused = call(client, newer, f"jobs/{job.pk}/inputs/calibration_cache", method="get")
    assert refused.status_code == 404


def test_a_build_that_calibrates_nothing_cannot_leave_a_cache(
    client, version, device_class, alice, calibration, gpu_device
):
    token = gpu_device("gpu-a")
    job = request_compile(version, device_class, "tensorrt", {"precision": "fp16"}, alice)[1]
    build_int8(client, job, token)
    job.refresh_from_db()
    assert job.state == "failed"
    assert "calibrates nothing" in job.error
    assert not CalibrationCache.objects.exists()
    assert job.engine is None
