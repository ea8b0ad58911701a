"""The runs behind an engine's release gates, made directly: parity, accuracy, performance."""

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.evaluation.models import AccuracyRun
from deployhub.jobs.models import JobKind
from deployhub.parity.models import ParityRun
from tests.auto_builds import engine_of, job_of
from tests.benchmark_results import LATENCY, result


def passed_parity(engine, passed=True):
    version = engine.model_version
    ParityRun.objects.create(
        model_version=version,
        job=job_of(version, engine.device_class, JobKind.PARITY, None),
        file="parity/pack.zip",
        sha256="0" * 64,
        size=1,
        samples=3,
        passed=passed,
        tolerance_used=1e-3,
        max_abs_error=1e-5 if passed else 0.8,
        summary="" if passed else "matches if channels are swapped",
    )


def evaluated(engine, agreement):
    AccuracyRun.objects.create(
        job=job_of(engine.model_version, engine.device_class, JobKind.EVALUATE, engine),
        engine=engine,
        samples=300,
        top1_agreement=agreement,
        max_abs_error=0.1,
        mean_abs_error=0.01,
        cosine_min=0.99,
        cosine_mean=0.999,
    )


def benchmarked(engine, p99):
    body = result(latency_ms={**LATENCY, "p50": p99 / 2, "p99": p99})
    BenchmarkRun.record(
        job_of(engine.model_version, engine.device_class, JobKind.BENCHMARK, engine), body
    )


def ready_engine(version, device_class, name="fp32"):
    """An engine whose four release gates are open."""
    device_class.frame_budget_ms = 20.0
    device_class.save()
    engine = engine_of(version, device_class, name)
    passed_parity(engine)
    evaluated(engine, agreement=0.999)
    benchmarked(engine, p99=15.0)
    return engine
