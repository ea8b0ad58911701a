"""Auto mode's ranking follows the class's serving pattern, its gate and the golden pairs.

The builds' results are stored as workers would send them (through the models'
record methods); the end-to-end run with a real worker is tests/test_e2e_auto.py.
"""

import pytest

from deployhub.benchmarks.models import AccuracyRun, BenchmarkRun
from deployhub.engines import auto
from deployhub.engines.models import AutoBuild, AutoRun
from deployhub.jobs.models import Job
from deployhub.registry.models import GoldenRun, GoldenSet
from tests.benchmark_results import LATENCY, result
from tests.conftest import stored_engine

pytestmark = pytest.mark.django_db


def engine_of(version, device_class, name):
    return stored_engine(version, device_class, {"name": name}, digest=name)


def job(version, device_class, kind, engine):
    return Job.objects.create(
        team=version.team,
        kind=kind,
        device_class=device_class,
        model_version=version,
        engine=engine,
        state="succeeded",
    )


def build(run, name, *, p50, p99=None, batch=1, throughput=None, agreement=1.0, stable=True):
    """Add a measured build: its benchmark (p50/p99 ms per batch) and its evaluation."""
    version, device_class = run.model_version, run.device_class
    engine = engine_of(version, device_class, name)
    body = result(
        batch_size=batch,
        latency_ms={**LATENCY, "p50": p50, "p99": p99 or p50 * 1.2, "min": p50 * 0.9},
        throughput_ips=throughput or batch * 1000 / p50,
        stability={"stable": stable, "reasons": [] if stable else ["CV 30.0% is above 10%"]},
    )
    benchmark_job = job(version, device_class, "benchmark", engine)
    BenchmarkRun.record(benchmark_job, body)
    evaluate_job = job(version, device_class, "evaluate", engine)
    AccuracyRun.objects.create(
        job=evaluate_job,
        engine=engine,
        samples=100,
        top1_agreement=agreement,
        max_abs_error=0.1,
        mean_abs_error=0.01,
        cosine_min=0.99,
        cosine_mean=0.999,
    )
    return AutoBuild.objects.create(
        auto_run=run,
        backend="onnxruntime",
        precision=name,
        engine=engine,
        benchmark_job=benchmark_job,
        evaluate_job=evaluate_job,
        finished=True,
    )


@pytest.fixture
def run(version, device_class):
    return AutoRun.objects.create(model_version=version, device_class=device_class)


def ranked(run):
    auto.rank(run)
    run.refresh_from_db()
    return {b.precision: b for b in run.builds.all()}, run


def test_a_realtime_class_gets_the_fastest_build_at_batch_1_that_meets_its_budget(run):
    run.device_class.frame_budget_ms = 10.0
    run.device_class.save()
    build(run, "slow", p50=8.0)
    build(run, "fast", p50=2.0)
    build(run, "wrong", p50=1.0, agreement=0.9)

    builds, run = ranked(run)

    assert run.recommended.precision == "fast"
    assert builds["wrong"].within_tolerance is False
    assert builds["slow"].meets_budget and not builds["slow"].pareto
    assert "p50 2.000 ms" in run.summary


def test_an_unstable_measurement_does_not_count_as_meeting_the_budget(run):
    run.device_class.frame_budget_ms = 4.0  # the noisy build's p99 (2.4 ms) is not 2x within
    run.device_class.save()
    build(run, "steady", p50=3.0)
    build(run, "noisy", p50=2.0, stable=False)

    builds, run = ranked(run)

    assert builds["noisy"].meets_budget is None
    assert run.recommended.precision == "steady"


def test_a_batch_class_compares_throughput_and_checks_its_target(run):
    device_class = run.device_class
    device_class.serving_pattern = "batch"
    device_class.throughput_target_ips = 500.0
    device_class.batch_latency_ceiling_ms = 100.0
    device_class.save()
    # "narrow" answers a batch sooner, "wide" gets more images through: throughput decides.
    build(run, "narrow", p50=10.0, batch=8, throughput=400.0)
    build(run, "wide", p50=12.0, batch=8, throughput=650.0)

    builds, run = ranked(run)

    assert builds["narrow"].meets_budget is False  # 400 images/s < 500
    assert run.recommended.precision == "wide"
    assert "650.0 images/s at batch 8" in run.summary


def test_a_build_that_fails_its_golden_pairs_is_never_recommended(run, alice):
    fast = build(run, "fast", p50=1.0)
    build(run, "correct", p50=2.0)
    golden = GoldenSet.objects.create(
        model_version=run.model_version,
        name="reference",
        file="golden/x.npz",
        sha256="0" * 64,
        size=1,
        format="npz",
        pairs=1,
        atol=1e-4,
        rtol=1e-3,
    )
    GoldenRun.objects.create(
        job=fast.evaluate_job,
        engine=fast.engine,
        golden_set=golden,
        passed=False,
        pairs=1,
        atol=1e-4,
        rtol=1e-3,
        outputs=[{"name": "logits", "passed": False}],
    )

    builds, run = ranked(run)

    assert builds["fast"].within_tolerance is False
    assert run.recommended.precision == "correct"


def test_a_batch_class_is_measured_in_batches_the_contract_allows(version, device_class):
    device_class.serving_pattern = "batch"

    assert auto.benchmark_params(version, device_class)["scenario"] == "offline"
    assert auto.benchmark_params(version, device_class)["batch_size"] == auto.batch_for(version)
    device_class.serving_pattern = "realtime"
    assert auto.benchmark_params(version, device_class) == {
        "scenario": "single-stream",
        "batch_size": 1,
        "warmup_s": 1.0,
        "duration_s": 3.0,
    }
