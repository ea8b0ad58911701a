"""Auto mode: build a small grid over the class's backends, measure each, recommend one.

Each build is compiled (or taken from the store), benchmarked and evaluated
against the FP32 source on the version's dataset (and on its newest golden
set, when it has one). The device class's serving pattern decides how builds
are measured and compared: a real-time class one frame at a time (batch 1,
SingleStream, p99 against the frame budget), a batch class in its batches
(Offline, throughput against the target). The recommendation is the fastest
build within the class's accuracy tolerance (and reproducing the golden pairs)
that meets the class's gate; the Pareto-optimal builds (no other build both
faster and more accurate) are marked.
"""

from django.db import transaction
from django.utils import timezone

from deployhub.benchmarks.batches import batch_rule
from deployhub.benchmarks.models import GateVerdict
from deployhub.engines.actions import BuildRefused, request_compile, request_evaluation
from deployhub.engines.models import AutoBuild, AutoRun, AutoRunState
from deployhub.engines.preflight import GRID, preflight
from deployhub.jobs.models import JobState

BUILD_CONFIGS = {
    ("onnxruntime", "fp32"): {"optimization_level": "all", "provider": "CPUExecutionProvider"},
    ("onnxruntime", "int8"): {
        "optimization_level": "all",
        "provider": "CPUExecutionProvider",
        "precision": "int8",
    },
    ("openvino", "fp32"): {"device": "CPU", "precision": "f32"},
    ("openvino", "bf16"): {"device": "CPU", "precision": "bf16"},
    ("openvino", "int8"): {"device": "CPU", "precision": "int8"},
    ("tensorrt", "fp16"): {"precision": "fp16"},
    ("tensorrt", "int8"): {"precision": "int8"},
    ("torch-aoti", "fp32"): {"device": "cpu", "precision": "fp32"},
}
# Measured by time, so a slow build is not measured for minutes and a fast one not for
# milliseconds; the harness flags a run as unstable when its windows disagree.
REALTIME_BENCHMARK = {
    "scenario": "single-stream",
    "batch_size": 1,
    "warmup_s": 1.0,
    "duration_s": 3.0,
}
BATCH_BENCHMARK = {"scenario": "offline", "warmup_s": 1.0, "duration_s": 3.0}
# A batch class is measured at this batch when the contract allows it (tensor cores like
# multiples of 8), else at the largest batch below it the contract allows.
PREFERRED_BATCH = 8
EVALUATION_SAMPLES = 1000


class AutoRefused(ValueError):
    """Auto mode cannot start; the message says what is missing."""


def evaluation_dataset(version):
    """Return the dataset builds are evaluated on: a validation set, else calibration data."""
    datasets = version.model.datasets.order_by("-created_at")
    return datasets.filter(kind="validation").first() or datasets.filter(kind="calibration").first()


def start(version, device_class, user):
    """Create an auto run and ask for every build of the grid the preflight does not rule out."""
    if not version.is_onnx:
        raise AutoRefused("Auto mode builds from an ONNX version: use this .pt2's ONNX child.")
    dataset = evaluation_dataset(version)
    if dataset is None:
        raise AutoRefused(
            "Auto mode evaluates every build: attach a validation (or "
            "calibration) dataset to the model first."
        )
    with transaction.atomic():
        run = AutoRun.objects.create(
            model_version=version, device_class=device_class, dataset=dataset, created_by=user
        )
        for backend, precision in GRID:
            _add_build(run, backend, precision, user)
        advance(run)
    return run


def source_for(version, backend):
    """Return the version a backend builds from: AOTInductor takes the .pt2 this came from."""
    parent = version.parent
    if backend == "torch-aoti" and parent is not None and parent.format == "pt2":
        return parent
    return version


def _add_build(run, backend, precision, user):
    config = BUILD_CONFIGS[(backend, precision)]
    build = AutoBuild(auto_run=run, backend=backend, precision=precision, build_config=config)
    source = source_for(run.model_version, backend)
    [verdict] = preflight(source, run.device_class, [backend], precision)
    if verdict.fails:
        build.skipped, build.finished = "; ".join(verdict.fails), True
        build.save()
        return
    try:
        engine, job = request_compile(source, run.device_class, backend, config, user)
    except BuildRefused as exc:
        build.skipped, build.finished = str(exc), True
        build.save()
        return
    build.engine, build.compile_job = engine, job
    build.save()
    if job is not None:
        job.params = {**job.params, "auto_build": build.pk}
        job.save(update_fields=["params"])


def benchmark_params(version, device_class):
    """Return how auto mode benchmarks a build for this class's serving pattern."""
    if not device_class.is_batch:
        return dict(REALTIME_BENCHMARK)
    return {**BATCH_BENCHMARK, "batch_size": batch_for(version)}


def batch_for(version):
    """Return the batch a batch class's builds are measured at: 8, or what the contract allows."""
    rule = batch_rule(version)
    allowed = rule.sizes or range(rule.low, rule.high + 1)
    below = [size for size in allowed if size <= PREFERRED_BATCH]
    return max(below) if below else min(allowed)


def _measure(build, user):
    """Queue the benchmark and the evaluation of a build's engine."""
    from deployhub.jobs.actions import submit_job

    run, engine = build.auto_run, build.engine
    params = {**benchmark_params(engine.model_version, run.device_class), "auto_build": build.pk}
    build.benchmark_job = submit_job(
        kind="benchmark",
        team=run.team,
        device_class=run.device_class,
        user=user,
        model_version=engine.model_version,
        engine=engine,
        params=params,
    )
    build.evaluate_job = request_evaluation(
        engine,
        user,
        dataset=run.dataset,
        golden_set=engine.model_version.golden_sets.order_by("-created_at").first(),
        max_samples=EVALUATION_SAMPLES,
        extra_params={"auto_build": build.pk},
    )


def _step(build):
    """Move one build on; return True when it has nothing left to wait for."""
    compile_job = build.compile_job
    if build.engine is None and compile_job is not None and compile_job.is_final:
        if compile_job.state != JobState.SUCCEEDED or compile_job.engine is None:
            build.error = compile_job.error or f"the compile {compile_job.state}"
            return True
        build.engine = compile_job.engine
    if build.engine is not None and build.benchmark_job is None:
        _measure(build, build.auto_run.created_by)
    measured = [build.benchmark_job, build.evaluate_job]
    if all(job is not None and job.is_final for job in measured):
        failed = [job for job in measured if job.state != JobState.SUCCEEDED]
        build.error = "; ".join(f"{job.kind}: {job.error or job.state}" for job in failed)
        return True
    return False


def advance(run):
    """Move every unfinished build on, and rank the builds once none is left waiting."""
    with transaction.atomic():
        run = AutoRun.objects.select_for_update().get(pk=run.pk)
        if run.state != AutoRunState.RUNNING:
            return run
        for build in run.builds.filter(finished=False).select_related(
            "compile_job", "benchmark_job", "evaluate_job"
        ):
            build.finished = _step(build)
            build.save()
        if not run.builds.filter(finished=False).exists():
            rank(run)
    return run


def advance_for_job(job):
    """Advance the auto run a finished job belongs to, if any."""
    build = AutoBuild.objects.filter(pk=job.params.get("auto_build")).first()
    if build is not None:
        advance(build.auto_run)


def _accuracy_ok(accuracy, tolerance):
    return not accuracy.tolerance_breach(tolerance)


def _golden_ok(build):
    """Return True unless the build's evaluation checked golden pairs and they failed."""
    golden = build.golden
    return golden is None or golden.passed


def ms_per_image(build):
    """Return the build's time per image as its class's pattern measures it (lower is faster)."""
    benchmark = build.benchmark
    if build.auto_run.device_class.is_batch:
        return 1000.0 / benchmark.gate_throughput_ips
    return benchmark.latency_p50_ms / benchmark.batch_size


def _score(build):
    accuracy = build.accuracy
    return accuracy.top1 if accuracy.top1 is not None else accuracy.top1_agreement


def rank(run):
    """Mark the Pareto-optimal builds and the recommended one; finish the run."""
    measured = [b for b in run.builds.all() if not b.error and b.benchmark and b.accuracy]
    tolerance = run.device_class.accuracy_tolerance
    for build in measured:
        verdict = build.benchmark.gate().verdict
        build.meets_budget = {GateVerdict.MEETS: True, GateVerdict.MISSES: False}.get(verdict)
        build.within_tolerance = _accuracy_ok(build.accuracy, tolerance) and _golden_ok(build)
        point = (ms_per_image(build), _score(build))
        build.pareto = not any(
            ms_per_image(other) <= point[0]
            and _score(other) >= point[1]
            and (ms_per_image(other), _score(other)) != point
            for other in measured
        )
        build.save()
    run.recommended = _recommend(measured)
    run.summary = _summary(run, measured)
    run.state, run.finished_at = AutoRunState.DONE, timezone.now()
    run.save()


def _recommend(measured):
    eligible = [b for b in measured if b.within_tolerance and b.meets_budget]
    eligible = eligible or [b for b in measured if b.within_tolerance]
    return min(eligible, key=ms_per_image, default=None)


def _summary(run, measured):
    if run.recommended is None:
        return "No build stayed within the accuracy tolerance." if measured else "No build ran."
    best, device_class = run.recommended, run.device_class
    benchmark = best.benchmark
    if device_class.is_batch:
        figure = f"{benchmark.gate_throughput_ips:.1f} images/s at batch {benchmark.batch_size}"
    else:
        figure = f"p50 {benchmark.latency_p50_ms:.3f} ms"
    text = f"Recommended: {best.backend} {best.precision}, {figure}"
    if not best.meets_budget:
        text += f"; no build meets the class's gate ({device_class.gate_rule[:-1]})"
    return text


def advance_running():
    """Advance every running auto run (the reaper calls this: nothing waits forever)."""
    for run in AutoRun.objects.filter(state=AutoRunState.RUNNING):
        advance(run)
