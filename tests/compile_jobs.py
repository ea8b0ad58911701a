"""A device's fingerprint and its side of a compile job, played through the real API."""

import hashlib

from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.engines.actions import request_compile
from tests.api_calls import call

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
ENGINE_BYTES = b"an optimised onnx model"


def build(client, job, token, data=ENGINE_BYTES, timing_cache=None, fingerprint=FINGERPRINT):
    """Play the worker's side of a compile job through the real API."""
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": job.attempt})
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
        "build_log": "ok",
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
