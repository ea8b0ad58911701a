"""Per-run latency samples: the worker sends them compactly, the hub checks and stores them."""

import base64

import numpy as np
import pytest

from deployhub.benchmarks.models import NO_SAMPLES, BenchmarkRun, LatencySamples
from deployhub.jobs.actions import submit_job
from deployhub.jobs.models import Job, JobKind, JobState
from tests.api_calls import call
from tests.benchmark_results import NEW_RESULT, record_run, result
from tests.conftest import wait_until
from workers.measure.benchmark import benchmark_onnxruntime
from workers.measure.latency import SAMPLES_KEPT, compact_samples, expand_samples


def encoded(ms, measured=None, **changes):
    """Return a latency_samples block holding these milliseconds."""
    data = np.asarray(ms, dtype="<f4").tobytes()
    block = {
        "format": "f32le-base64",
        "measured": len(ms) if measured is None else measured,
        "count": len(ms),
        "data": base64.b64encode(data).decode(),
    }
    return {**block, **changes}


def test_it_sends_every_sample_of_a_short_run_in_milliseconds():
    block = compact_samples([1_500_000, 2_000_000, 2_250_000])

    assert (block["count"], block["measured"]) == (3, 3)
    assert expand_samples(block).tolist() == [1.5, 2.0, 2.25]


def test_it_thins_a_long_run_evenly_keeping_its_order_and_both_ends():
    samples_ns = np.arange(1, 10_001) * 1000  # 0.001 ms .. 10 ms, rising

    block = compact_samples(samples_ns)

    ms = expand_samples(block)
    assert (block["count"], block["measured"]) == (SAMPLES_KEPT, 10_000)
    assert ms[0] == pytest.approx(0.001) and ms[-1] == pytest.approx(10.0)
    assert np.all(np.diff(ms) > 0)  # measured order kept
    assert np.diff(ms).max() < 0.0031  # evenly spaced: never more than 3 runs apart
    assert len(base64.b64decode(block["data"])) == 4 * SAMPLES_KEPT


def test_the_hub_stores_the_samples_apart_and_gives_them_back(version, device_class):
    run = record_run(
        version, device_class, result(latency_samples=encoded([9.5, 10.0, 15.25], measured=1030))
    )

    run = BenchmarkRun.objects.get(pk=run.pk)
    assert run.samples_ms().tolist() == [9.5, 10.0, 15.25]
    assert LatencySamples.objects.get(run=run).measured == 1030  # NEW_RESULT's iterations


def test_a_run_from_before_samples_were_kept_has_none(version, device_class):
    run = record_run(version, device_class, result())

    assert run.samples_ms() is None
    assert "run the benchmark again" in NO_SAMPLES


def test_lists_of_runs_do_not_load_the_samples(version, device_class, django_assert_num_queries):
    record_run(version, device_class, result(latency_samples=encoded([9.5, 10.0], measured=1030)))

    with django_assert_num_queries(1) as queries:
        list(BenchmarkRun.objects.all())
    assert "data" not in queries.captured_queries[0]["sql"]


BAD_BLOCKS = {
    "not base64": {"data": "@@@not base64@@@"},
    "wrong length": {"count": 3},
    "a NaN": {"data": base64.b64encode(np.array([1.0, np.nan], "<f4").tobytes()).decode()},
    "an infinity": {"data": base64.b64encode(np.array([1.0, np.inf], "<f4").tobytes()).decode()},
    "another format": {"format": "f64le-base64"},
    "more than measured": {"measured": 1},
    "a count as text": {"count": "2"},
}


@pytest.mark.parametrize("changes", BAD_BLOCKS.values(), ids=BAD_BLOCKS.keys())
def test_a_completion_with_bad_samples_fails_the_job_saying_why(client, job, make_device, changes):
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    body = result(iterations=2, latency_samples=encoded([1.0, 2.0], **changes))

    response = call(
        client,
        token,
        f"jobs/{job.pk}/complete",
        {"attempt": 1, "state": "succeeded", "result": body},
    )

    assert response.status_code == 200
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.error.startswith("latency_samples refused: ")
    assert not BenchmarkRun.objects.filter(job=job).exists()
    assert not LatencySamples.objects.exists()


def test_samples_that_do_not_match_the_runs_measured_are_refused(client, job, make_device):
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    body = result(NEW_RESULT, latency_samples=encoded([1.0, 2.0]))  # 1030 runs, says 2

    call(
        client,
        token,
        f"jobs/{job.pk}/complete",
        {"attempt": 1, "state": "succeeded", "result": body},
    )

    job = Job.objects.get(pk=job.pk)
    assert job.state == JobState.FAILED and "iterations 1030" in job.error


def test_a_real_benchmark_sends_samples_the_hub_stores(client, job, make_device, model_file):
    measured = benchmark_onnxruntime(model_file, {"warmup_iterations": 3, "iterations": 200})
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})

    response = call(
        client,
        token,
        f"jobs/{job.pk}/complete",
        {"attempt": 1, "state": "succeeded", "result": measured},
    )

    assert response.status_code == 200, response.content
    run = BenchmarkRun.objects.get(job=job)
    samples = run.samples_ms()
    assert len(samples) == 200 == run.iterations
    # float32 keeps the run's own percentiles within rounding
    assert np.percentile(samples, 99) == pytest.approx(run.latency_p99_ms, rel=1e-5)
    assert samples.min() == pytest.approx(run.latency_min_ms, rel=1e-6)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_sends_samples_the_hub_keeps(
    version, device_class, make_device, start_worker, alice
):
    device, token = make_device()
    worker = start_worker(device, token)
    job = submit_job(
        team=version.team,
        kind=JobKind.BENCHMARK,
        device_class=device_class,
        user=alice,
        model_version=version,
        params={"warmup_iterations": 5, "iterations": 5000},
    )

    job = wait_until(
        lambda: (found := Job.objects.get(pk=job.pk)).is_final and found,
        90,
        "the benchmark to finish",
        on_timeout=worker.output,
    )

    assert job.state == JobState.SUCCEEDED, job.log + job.error
    run = BenchmarkRun.objects.get(job=job)
    samples = run.samples_ms()
    assert len(samples) == SAMPLES_KEPT and run.latency_samples.measured == 5000
    assert samples.min() >= run.latency_min_ms * 0.999999
    assert samples.max() <= run.latency_max_ms * 1.000001
