"""Two real workers, one with a fingerprint override: the engine store end to end."""

import json

import pytest
import requests

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.devices.models import FingerprintChange
from deployhub.engines.actions import rebuild, request_compile
from deployhub.engines.models import Engine
from deployhub.jobs.actions import submit_job
from deployhub.jobs.models import Job, JobKind
from tests.conftest import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
CONFIG = {"optimization_level": "all", "provider": "CPUExecutionProvider"}


def final(job, worker, timeout=90):
    return wait_until(
        lambda: (j := Job.objects.get(pk=job.pk)).is_final and j,
        timeout,
        f"job {job.pk} to finish",
        on_timeout=worker.output,
    )


def benchmark_engine(engine, user):
    return submit_job(
        team=engine.team,
        kind=JobKind.BENCHMARK,
        device_class=engine.device_class,
        user=user,
        model_version=engine.model_version,
        engine=engine,
        params={"warmup_iterations": 2, "iterations": 50},
    )


def download(live_server, engine, token):
    return requests.get(
        f"{live_server.url}/api/v1/engines/{engine.pk}/download",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


def test_the_engine_store_with_two_real_workers(
    live_server, settings, tmp_path, version, device_class, make_device, start_worker, alice
):
    settings.DEPLOYHUB_HEARTBEAT_INTERVAL = 1
    override_a = tmp_path / "a.json"
    override_a.write_text("{}")
    device_a, token_a = make_device("gpu-box-a")
    worker_a = start_worker(
        device_a, token_a, env={"DEPLOYHUB_FINGERPRINT_OVERRIDE": str(override_a)}
    )

    # Build once on A.
    engine, job = request_compile(version, device_class, "onnxruntime", CONFIG, alice)
    assert engine is None
    assert final(job, worker_a).state == "succeeded", job.log
    engine = Engine.objects.get()
    assert engine.built_on == device_a and engine.status == "valid"

    # A benchmarks the engine after checking its signature.
    run_job = final(benchmark_engine(engine, alice), worker_a)
    assert run_job.state == "succeeded", run_job.log + run_job.error
    assert BenchmarkRun.objects.get(job=run_job).engine == engine

    # Asking again is answered from the store.
    again, no_job = request_compile(version, device_class, "onnxruntime", CONFIG, alice)
    assert again == engine and no_job is None

    # B, with another ONNX Runtime, may not download it; A may.
    override_b = tmp_path / "b.json"
    override_b.write_text(json.dumps({"onnxruntime": {"version": "1.31.0"}}))
    device_b, token_b = make_device("gpu-box-b")
    worker_b = start_worker(
        device_b, token_b, env={"DEPLOYHUB_FINGERPRINT_OVERRIDE": str(override_b)}
    )
    assert download(live_server, engine, token_a).status_code == 200
    refused = download(live_server, engine, token_b)
    assert refused.status_code == 409
    assert refused.json()["differences"]["onnxruntime"] == ["1.32.0", "1.31.0"]

    # A's toolchain changes (a rehearsed upgrade): the engine goes stale, a rebuild makes a new one.
    override_a.write_text(json.dumps({"onnxruntime": {"version": "1.33.0"}}))
    wait_until(
        lambda: FingerprintChange.objects.filter(device=device_a).exists(),
        20,
        "A's fingerprint change to reach the hub",
        on_timeout=worker_a.output,
    )
    engine.refresh_from_db()
    assert engine.status == "stale" and "1.33.0" in engine.status_reason
    _, job = rebuild(engine, alice)
    assert final(job, worker_a).state == "succeeded"
    assert Engine.objects.count() == 2
    rebuilt = Engine.objects.exclude(pk=engine.pk).get()
    assert rebuilt.compat_key != engine.compat_key

    # A flipped byte in the store: the hub refuses to serve it and marks it corrupt, and the
    # worker fails the job with the hub's reason, before it loads anything. Only the device
    # that built it runs it: the other worker stops, so that one takes the job.
    (worker_b if rebuilt.built_on == device_a else worker_a).stop()
    path = rebuilt.file.path
    original = open(path, "rb").read()
    open(path, "wb").write(original[:10] + bytes([original[10] ^ 1]) + original[11:])
    tampered = final(benchmark_engine(rebuilt, alice), worker_a)
    assert tampered.state == "failed"
    assert tampered.error.startswith(f"Engine #{rebuilt.pk} is corrupt: Its stored file hashes")
    assert Engine.objects.get(pk=rebuilt.pk).status == "corrupt"
