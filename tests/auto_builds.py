"""Auto mode's builds as they end (measured, failed or skipped), stored as workers' results are.

Through the models' record methods, for the ranking, the gates and the pages to read.
"""

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.engines.models import AutoBuild
from deployhub.jobs.models import Job, JobKind
from tests.benchmark_results import LATENCY, record_evaluation, result
from tests.conftest import category_sent_with, stored_engine


def engine_of(version, device_class, name, precision=None):
    config = {"name": name, **({"precision": precision} if precision else {})}
    return stored_engine(version, device_class, config, digest=name)


def job_of(version, device_class, kind, engine):
    """A succeeded job of kind for the engine (None for a job before any engine)."""
    return Job.objects.create(
        team=version.team,
        kind=kind,
        device_class=device_class,
        model_version=version,
        engine=engine,
        state="succeeded",
    )


def measured_build(
    run, name, *, p50, p99=None, batch=1, throughput=None, agreement=1.0, stable=True, int8=False
):
    """Add a measured build: its benchmark (p50/p99 ms per batch) and its evaluation."""
    version, device_class = run.model_version, run.device_class
    engine = engine_of(version, device_class, name, "int8" if int8 else None)
    body = result(
        batch_size=batch,
        latency_ms={**LATENCY, "p50": p50, "p99": p99 or p50 * 1.2, "min": p50 * 0.9},
        throughput_ips=throughput or batch * 1000 / p50,
        stability={"stable": stable, "reasons": [] if stable else ["CV 30.0% is above 10%"]},
    )
    benchmark_job = job_of(version, device_class, JobKind.BENCHMARK, engine)
    BenchmarkRun.record(benchmark_job, body)
    evaluate_job = job_of(version, device_class, JobKind.EVALUATE, engine)
    record_evaluation(evaluate_job, engine, agreement)
    return AutoBuild.objects.create(
        auto_run=run,
        backend="onnxruntime",
        precision=name,
        engine=engine,
        benchmark_job=benchmark_job,
        evaluate_job=evaluate_job,
        finished=True,
    )


LONG_ERROR = (
    "unsupported_operator: [ONNXRuntimeError] : 10 : INVALID_GRAPH : This is an invalid model. "
    "In Node, ('bn', BatchNormalization, '', -1) : ('x': tensor(float),) -> ('y',) , Error "
    "Unrecognized attribute: spatial for operator BatchNormalization at the end of the line"
)


def failed_build(run, name, *, error=LONG_ERROR, kind=JobKind.COMPILE):
    """Add a build whose compile (or benchmark) job failed with `error`."""
    version, device_class = run.model_version, run.device_class
    failed = job_of(version, device_class, kind, None)
    failed.state, failed.error = "failed", error
    failed.failure_category = category_sent_with(error)
    failed.save()
    jobs = {"compile_job": failed} if kind == JobKind.COMPILE else {}
    if kind == JobKind.BENCHMARK:
        engine = engine_of(version, device_class, name)
        jobs = {"engine": engine, "benchmark_job": failed}
        jobs["evaluate_job"] = job_of(version, device_class, JobKind.EVALUATE, engine)
        error = f"benchmark: {error}"
    return AutoBuild.objects.create(
        auto_run=run, backend="openvino", precision=name, error=error, finished=True, **jobs
    )


def skipped_build(run, name, reason):
    return AutoBuild.objects.create(
        auto_run=run, backend="tensorrt", precision=name, skipped=reason, finished=True
    )


SKIP_REASON = (
    "tensorrt is not installed on any device of this class: no worker reports a TensorRT "
    "version, so an fp16 engine cannot be built here; add a GPU device or drop the backend"
)
