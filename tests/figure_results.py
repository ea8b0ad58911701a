"""Many engines and runs of one model, made in bulk, for the figures' tests and `make bench`.

Each engine gets a latency that depends on its precision and backend (int8 faster,
fp32 more accurate), so the explorer has a frontier to find; runs are stored with
their jobs the way workers' results are, without a worker.
"""

import random

from deployhub.benchmarks.models import BenchmarkRun, Scenario
from deployhub.devices.models import DeviceClass, ServingPattern
from deployhub.engines.models import Engine
from deployhub.evaluation.models import AccuracyRun
from deployhub.jobs.models import Job, JobKind
from workers.backends.known import BACKENDS

PRECISIONS = ("fp32", "fp16", "int8")


def seed_classes(team, prefix="fig"):
    """Two real-time classes (33.3 ms and 10 ms) and a batch class (500 img/s at batch 8)."""
    return [
        DeviceClass.objects.create(
            team=team, slug=f"{prefix}-edge", name="Edge", frame_budget_ms=33.3
        ),
        DeviceClass.objects.create(
            team=team,
            slug=f"{prefix}-gpu",
            name="GPU",
            frame_budget_ms=10.0,
            accuracy_tolerance=0.5,
        ),
        DeviceClass.objects.create(
            team=team,
            slug=f"{prefix}-batch",
            name="Batch",
            serving_pattern=ServingPattern.BATCH,
            throughput_target_ips=500.0,
            batch_latency_ceiling_ms=100.0,
        ),
    ]


def seed_engines(versions, classes, precisions=PRECISIONS):
    """One engine per version, class, known backend and precision."""
    rows = [
        Engine(
            model_version=version,
            device_class=dc,
            backend=backend,
            build_config={} if precision == "fp32" else {"precision": precision},
            config_digest=f"{backend}-{precision}",
            compat_key=f"seed-{dc.slug}",
            file=f"engines/seed-{version.pk}-{dc.pk}-{backend}-{precision}",
            sha256="0" * 64,
            size=1,
            signature="",
            tool_versions={backend: "1.0"},
        )
        for version in versions
        for dc in classes
        for backend in BACKENDS
        for precision in precisions
    ]
    return Engine.objects.bulk_create(rows)


def _speed(engine):
    factor = {"fp32": 1.0, "fp16": 0.6, "int8": 0.4}.get(
        engine.build_config.get("precision", "fp32")
    )
    return 8.0 * factor * (1 + list(BACKENDS).index(engine.backend) * 0.15)


def _benchmark(engine, job, rng):
    batch = 8 if engine.device_class.is_batch else 1
    p50 = _speed(engine) * batch * rng.uniform(0.9, 1.1)
    latency = {"min": p50 * 0.9, "p50": p50, "p90": p50 * 1.1, "p95": p50 * 1.15}
    latency |= {"p99": p50 * 1.3, "max": p50 * 1.6, "mean": p50 * 1.02, "std": p50 * 0.05}
    return BenchmarkRun(
        job=job,
        model_version=engine.model_version,
        device_class=engine.device_class,
        engine=engine,
        backend=engine.backend,
        scenario=Scenario.SINGLE_STREAM,
        batch_size=batch,
        warmup_iterations=10,
        iterations=100,
        throughput_ips=batch * 1000 / latency["mean"],
        stable=rng.random() > 0.1,
        peak_rss_mb=rng.uniform(80, 400),
        **{f"latency_{key}_ms": value for key, value in latency.items()},
    )


def _accuracy(engine, job, rng):
    drop = {"fp32": 0.0, "fp16": 0.001, "int8": 0.012}.get(
        engine.build_config.get("precision", "fp32")
    )
    return AccuracyRun(
        job=job,
        engine=engine,
        samples=500,
        reference_top1=0.76,
        top1=0.76 - drop - rng.uniform(0, 0.004),
        top1_agreement=1 - drop - rng.uniform(0, 0.004),
        max_abs_error=0.1,
        mean_abs_error=0.01,
        cosine_min=0.99,
        cosine_mean=0.999,
    )


def _jobs(engines, kind, count):
    rows = [
        Job(
            team=engine.device_class.team,
            kind=kind,
            state="succeeded",
            model_version=engine.model_version,
            device_class=engine.device_class,
            engine=engine,
        )
        for engine in (engines[i % len(engines)] for i in range(count))
    ]
    return Job.objects.bulk_create(rows, batch_size=2000)


def seed_runs(engines, benchmarks, accuracies, seed=14):
    """Spread `benchmarks` benchmark runs and `accuracies` accuracy runs over the engines."""
    rng = random.Random(seed)
    jobs = _jobs(engines, JobKind.BENCHMARK, benchmarks)
    BenchmarkRun.objects.bulk_create(
        [_benchmark(job.engine, job, rng) for job in jobs], batch_size=2000
    )
    jobs = _jobs(engines, JobKind.EVALUATE, accuracies)
    AccuracyRun.objects.bulk_create(
        [_accuracy(job.engine, job, rng) for job in jobs], batch_size=2000
    )
