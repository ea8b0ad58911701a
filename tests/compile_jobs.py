"""A device's fingerprint and its side of a compile job, played through the real API."""

import hashlib
import io
import zipfile

from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.engines.actions import request_compile
from tests.api_calls import call
from tests.conftest import ASSETS

FINGERPRINT = {
    "schema": 2,
    "os": {"system": "Linux", "release": "6.1", "machine": "x86_64"},
    "cpu": {
        "model": "Test Xeon",
        "count": 2,
        "flags": ["avx2", "avx512f", "avx512_vnni"],
        "isa_level": "avx512",
    },
    "memory_mb": 24000,
    "gpus": None,
    "nvidia_driver": None,
    "cuda": None,
    "onnxruntime": {"version": "1.32.0", "providers": ["CPUExecutionProvider"]},
    "tensorrt": None,
    "openvino": None,
    "torch": None,
    "cudnn": None,
}
CONFIG = {"optimization_level": "all", "provider": "CPUExecutionProvider"}
# An ONNX Runtime engine is an ONNX file: the hub checks it parses as one before signing it.
ENGINE_BYTES = (ASSETS / "digits_cnn_v2.onnx").read_bytes()
OTHER_ENGINE_BYTES = (ASSETS / "digits_cnn_v1.onnx").read_bytes()


def _zip(members):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


# The smallest file each backend's artifact check accepts (workers/backends/artifacts.py).
ENGINE_BYTES_OF = {
    "onnxruntime": ENGINE_BYTES,
    "openvino": _zip({"model.xml": b'<net name="m"><layers/></net>', "model.bin": b""}),
    "tensorrt": b"ftrt" + bytes(60),
    "torch-aoti": _zip({"m/archive_format": b"pt2", "m/data/aotinductor/m/m.so": b"\x7fELF"}),
}


def build(client, job, token, data=None, timing_cache=None, fingerprint=FINGERPRINT):
    """Play the worker's side of a compile job through the real API: it heartbeats its
    fingerprint (the one the hub keys the engine on), claims, uploads and completes."""
    call(client, token, "device/heartbeat", {"fingerprint": fingerprint})
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": job.attempt})
    data = data or ENGINE_BYTES_OF[job.params["backend"]]
    return upload_and_complete(client, job, token, data, fingerprint, timing_cache)


def upload_and_complete(client, job, token, data, fingerprint, timing_cache=None, log="ok"):
    """Upload a claimed compile's engine (and timing cache) and report the build succeeded."""
    uploads = {"engine": data, **({"timing_cache": timing_cache} if timing_cache else {})}
    for name, content in uploads.items():
        client.post(
            f"/api/v1/jobs/{job.pk}/artifacts",
            {"attempt": job.attempt, "name": name, "file": SimpleUploadedFile(name, content)},
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
    result = {
        "backend": "onnxruntime",
        "build_config": CONFIG,
        "fingerprint": fingerprint,
        "tool_versions": {"onnxruntime": "1.32.0"},
        "build_seconds": 0.5,
        "build_log": log,
        "artifact": "engine",
        "artifact_sha256": hashlib.sha256(data).hexdigest(),
        "timing_cache_sha256": hashlib.sha256(timing_cache).hexdigest() if timing_cache else None,
    }
    return call(
        client,
        token,
        f"jobs/{job.pk}/complete",
        {"attempt": job.attempt, "state": "succeeded", "result": result},
    )


def compile_(version, device_class, user):
    return request_compile(version, device_class, "onnxruntime", CONFIG, user)
