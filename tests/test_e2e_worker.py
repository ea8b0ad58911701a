"""A real worker process against a live hub and the real Redis broker."""

import pytest
from django.core.files import File

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.jobs.actions import cancel_job, reap_expired_jobs
from deployhub.jobs.models import Job, JobState
from deployhub.registry.contract import batch_range_contract
from deployhub.registry.models import Model
from deployhub.registry.uploads import create_version
from tests.conftest import queued_benchmark, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def final(job_id, timeout, worker):
    return wait_until(
        lambda: (j := Job.objects.get(pk=job_id)).is_final and j,
        timeout,
        f"job {job_id} to finish",
        on_timeout=worker.output,
    )


def test_a_real_worker_benchmarks_a_model(
    demo_team, device_class, make_device, start_worker, alice, model_file
):
    device, token = make_device()
    worker = start_worker(device, token)
    model = Model.objects.create(team=demo_team, name="digits-cnn", created_by=alice)
    contract = batch_range_contract("image", [3, 32, 32], low=1, opt=2, high=8)
    with open(model_file, "rb") as handle:  # a version whose contract allows the batch of 2
        version = create_version(model, File(handle, name="digits.onnx"), alice, contract=contract)
    job = queued_benchmark(
        version, device_class, alice, warmup_iterations=5, iterations=300, batch_size=2
    )
    job = final(job.pk, 60, worker)
    assert job.state == JobState.SUCCEEDED, job.log + job.error
    run = BenchmarkRun.objects.get(job=job)
    assert run.device == device and run.backend == "onnxruntime"
    assert run.iterations == 300 and run.batch_size == 2
    assert 0 < run.latency_min_ms <= run.latency_p50_ms <= run.latency_p90_ms <= run.latency_p99_ms
    assert run.throughput_ips == pytest.approx(2 * 1000 / run.latency_mean_ms, rel=1e-3)
    assert run.peak_rss_mb > 0
    import onnxruntime

    assert run.fingerprint["onnxruntime"]["version"] == onnxruntime.__version__
    device.refresh_from_db()
    assert device.fingerprint["cpu"]["count"] >= 1  # reported at start


def test_a_cancelled_job_stops_on_the_worker(
    version, device_class, make_device, start_worker, alice
):
    device, token = make_device()
    worker = start_worker(device, token)
    job = queued_benchmark(version, device_class, alice, warmup_iterations=0, iterations=10_000_000)
    wait_until(
        lambda: Job.objects.get(pk=job.pk).progress > 0,
        60,
        "the benchmark to progress",
        on_timeout=worker.output,
    )
    cancel_job(job.pk, alice)
    job = final(job.pk, 30, worker)
    assert job.state == JobState.CANCELLED
    assert not BenchmarkRun.objects.filter(job=job).exists()
    follow_up = queued_benchmark(version, device_class, alice, iterations=20)
    assert final(follow_up.pk, 60, worker).state == JobState.SUCCEEDED  # the worker lives on


@pytest.mark.parametrize("mode", ["broker", "https"])
def test_a_job_survives_its_worker_being_killed(
    version, device_class, make_device, start_worker, alice, settings, mode
):
    """A device that vanishes mid-job: its lease runs out and the job runs once more, on
    another device, whichever way the devices take their work."""
    settings.DEPLOYHUB_JOB_LEASE_SECONDS = 2
    device_a, token_a = make_device("doomed")
    device_b, token_b = make_device("rescuer")
    worker_a = start_worker(device_a, token_a, mode=mode)
    job = queued_benchmark(version, device_class, alice, warmup_iterations=0, iterations=60_000)
    wait_until(
        lambda: Job.objects.get(pk=job.pk).progress > 0,
        60,
        "worker A to be running the job",
        on_timeout=worker_a.output,
    )
    assert Job.objects.get(pk=job.pk).device == device_a
    worker_a.kill9()
    wait_until(lambda: reap_expired_jobs(), 15, "the lease to expire and the reaper to act")
    requeued = Job.objects.get(pk=job.pk)
    assert requeued.state == JobState.QUEUED and requeued.attempt == 2
    worker_b = start_worker(device_b, token_b, mode=mode)
    job = final(job.pk, 90, worker_b)
    assert job.state == JobState.SUCCEEDED, job.log + job.error
    assert job.attempt == 2 and job.device == device_b
    assert BenchmarkRun.objects.filter(job=job).count() == 1
    assert BenchmarkRun.objects.get(job=job).device == device_b
    assert "lease expired on device doomed" in job.log
