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

Builds benchmarked one after another each meet the machine in another state, so
two builds a few percent apart would be ranked by noise. Before recommending,
the eligible builds whose separate runs came close to the fastest one are timed
again side by side, in one process on one device (a `compare` job,
workers/measure/side_by_side.py), and that run decides between them.

A version whose opset every backend finds too old is converted first, as the
version page's Convert button does, and the run builds the converted version.
"""

import math
import re
from collections import Counter

from django.db import transaction
from django.utils import timezone

from deployhub.benchmarks.batches import batch_rule
from deployhub.benchmarks.gates import GateVerdict
from deployhub.conversions.actions import ConversionRefused, converted_version, submit_convert
from deployhub.engines.actions import (
    BuildRefused,
    canonical_config,
    request_compile,
)
from deployhub.engines.models import AutoBuild, AutoRun, AutoRunState
from deployhub.engines.preflight import grid, preflight, too_old_for_every_build
from deployhub.evaluation.actions import request_evaluation
from deployhub.jobs.actions import submit_job
from deployhub.jobs.errors import ResultRejected
from deployhub.jobs.models import JobKind, JobState
from workers.backends.known import BACKENDS
from workers.measure.side_by_side import TIE_MARGIN

# The builds auto mode tries, as each backend lists them: (backend, precision) -> build config.
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
# Eligible builds whose separate runs came within this share of the fastest one (at most
# COMPARE_MAX of them, fastest first) are timed again side by side before one is recommended.
COMPARE_MARGIN = 0.25
COMPARE_MAX = 4
COMPARE_BENCHMARK = {"rounds": 10, "duration_s": 2.0, "warmup_s": 0.5}


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
    if not allowed_batches(version):
        raise AutoRefused(
            f"The input-shape contract of {version} allows no batch size that every input "
            "takes: derive a version with a contract that does."
        )
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
        if not (too_old_for_every_build(version, device_class) and _convert_first(run, user)):
            _add_grid(run, user)
        advance(run)
    return run


def _add_grid(run, user):
    """Ask for every build of the grid the preflight does not rule out (the rest: skipped)."""
    for backend, precision in grid():
        _add_build(run, backend, precision, user)


def _convert_first(run, user):
    """Queue the conversion of a source every backend finds too old, as the Convert button
    does; the run builds the converted version once it is stored. False when refused."""
    version = run.model_version
    try:
        job = submit_convert(version, run.device_class, user)
    except ConversionRefused:
        return False  # its builds are skipped, each saying why
    job.params = {**job.params, "auto_run": run.pk}
    job.save(update_fields=["params"])
    run.convert_job = job
    run.summary = (
        f"Converting from opset {version.opset} to {job.params['convert_to_opset']} first: "
        "no backend runs an opset that old."
    )
    run.save(update_fields=["convert_job", "summary"])
    return True


def _converting(run):
    """Return True while the run waits on its conversion; once it has ended, go on with the
    grid: of the converted version, or of the source (skipped) when there is none."""
    job = run.convert_job
    if job is None or run.converted_from_id is not None or run.builds.exists():
        return False
    if not job.is_final:
        return True
    if child := converted_version(job):
        run.converted_from, run.model_version = run.model_version, child
        run.save(update_fields=["converted_from", "model_version"])
    _add_grid(run, run.created_by)
    return False


def _conversion_note(run):
    """Say how the run converted its source first (or failed to), as the summary's opening."""
    job = run.convert_job
    if job is None:
        return ""
    target = job.params.get("convert_to_opset")
    source = run.converted_from
    if source is None:
        why = job.error or job.get_state_display().lower()
        return f"Converting from opset {run.model_version.opset} to {target} failed ({why}). "
    version = run.model_version
    difference = (version.export_report or {}).get("max_abs_diff")
    return (
        f"Converted from opset {source.opset} to {version.opset} first (largest difference "
        f"{_short_number(difference)}); builds are of v{version.number}. "
    )


def _short_number(value):
    """Return a difference as people write it: 2e-7, 0.0013; "unknown" when it is not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "unknown"
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{value:.2g}").replace("e+", "e")


def source_for(version, backend):
    """Return the version a backend builds from: one that builds from the .pt2 program takes
    the .pt2 this version was exported from."""
    wanted, parent = BACKENDS[backend].source_format, version.parent
    if wanted != "onnx" and parent is not None and parent.format == wanted:
        return parent
    return version


def _add_build(run, backend, precision, user):
    config = canonical_config(backend, BACKENDS[backend].auto_builds[precision])
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
    """Return how auto mode benchmarks a build for this class's serving pattern.

    The batch is one the version's contract allows; when it is not the class's own
    (1 for real time, PREFERRED_BATCH for batch), "batch_note" says why.
    """
    if device_class.is_batch:
        params = {**BATCH_BENCHMARK, "batch_size": batch_for(version)}
    else:
        params = {**REALTIME_BENCHMARK, "batch_size": realtime_batch(version)}
    wanted = PREFERRED_BATCH if device_class.is_batch else 1
    if params["batch_size"] != wanted:
        params["batch_note"] = _batch_note(version, params["batch_size"])
    return params


def allowed_batches(version):
    """Return the batch sizes the version's contract (and its fixed batch dims) allow."""
    rule = batch_rule(version)
    return rule.sizes or range(rule.low, rule.high + 1)


def realtime_batch(version):
    """Return the batch a real-time class's builds are measured at: 1, else the smallest allowed."""
    allowed = allowed_batches(version)
    return 1 if 1 in allowed else min(allowed)


def batch_for(version):
    """Return the batch a batch class's builds are measured at: 8, or what the contract allows."""
    allowed = allowed_batches(version)
    below = [size for size in allowed if size <= PREFERRED_BATCH]
    return max(below) if below else min(allowed)


def _batch_note(version, batch):
    rule = batch_rule(version)
    fixed = len(rule.sizes) == 1
    why = "the contract fixes it" if fixed else f"the contract allows {rule.describe()}"
    return f"measured at batch {batch}: {why}"


def _measure(build, user):
    """Queue the benchmark and the evaluation of a build's engine."""
    run, engine = build.auto_run, build.engine
    params = {**benchmark_params(engine.model_version, run.device_class), "auto_build": build.pk}
    build.benchmark_job = submit_job(
        kind=JobKind.BENCHMARK,
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
        if run.state != AutoRunState.RUNNING or _converting(run):
            return run
        for build in run.builds.filter(finished=False).select_related(
            "compile_job", "benchmark_job", "evaluate_job"
        ):
            build.finished = _step(build)
            build.save()
        if not run.builds.filter(finished=False).exists():
            _conclude(run)
    return run


def _conclude(run):
    """With every build measured: time the closest ones side by side, then rank."""
    if run.compare_job is None:
        contenders = _contenders(run, _judge(run))
        if len(contenders) >= 2:
            run.compare_job = _compare(run, contenders)
            run.save(update_fields=["compare_job"])
            return
    elif not run.compare_job.is_final:
        return
    rank(run)


def _contenders(run, measured):
    """Return the eligible builds that came close to the fastest, fastest first.

    An AOTInductor build from the .pt2 parent has other inputs than the version's
    ONNX file, so it keeps the figure of its separate run.
    """
    eligible = sorted(_eligible(measured), key=ms_per_image)
    if not eligible:
        return []
    close = [
        b
        for b in eligible
        if _close_to_fastest(b, eligible) and b.engine.model_version_id == run.model_version_id
    ]
    return close[:COMPARE_MAX]


def _close_to_fastest(build, eligible):
    """Tell whether a build came within COMPARE_MARGIN of the fastest, by either figure.

    The gate's figure (p99 on a real-time class) is the noisiest one a short run
    gives, so builds whose medians came close are timed side by side too.
    """
    return any(
        figure(build) <= min(map(figure, eligible)) * (1 + COMPARE_MARGIN)
        for figure in (ms_per_image, typical_ms_per_image)
    )


def typical_ms_per_image(build):
    """Return the build's median time per image (a batch class: its gate figure)."""
    benchmark = build.benchmark
    if build.auto_run.device_class.is_batch:
        return ms_per_image(build)
    return benchmark.latency_p50_ms / benchmark.batch_size


def _compare(run, contenders):
    """Queue the side-by-side benchmark of the contenders' engines on the run's class."""
    engines = [build.engine for build in contenders]
    batch_size = benchmark_params(run.model_version, run.device_class)["batch_size"]
    params = {
        **COMPARE_BENCHMARK,
        "batch_size": batch_size,
        "engines": [engine.pk for engine in engines],
        "auto_run": run.pk,
    }
    return submit_job(
        kind=JobKind.COMPARE,
        team=run.team,
        device_class=run.device_class,
        user=run.created_by,
        model_version=run.model_version,
        engine=engines[0],
        params=params,
    )


def record_comparison(job, result):
    """Store a side-by-side benchmark's figures on the auto run's builds (ms per image)."""
    run = AutoRun.objects.filter(compare_job=job).first()
    if run is None:
        raise ResultRejected("no auto run waits on this side-by-side benchmark")
    asked = {str(pk) for pk in job.params.get("engines") or ()}
    figures = {str(f.get("engine")): f for f in result.get("engines") or () if isinstance(f, dict)}
    if set(figures) != asked:
        raise ResultRejected(
            f"the result times engines {sorted(figures)}; the job asked for {sorted(asked)}"
        )
    batch_size = job.params.get("batch_size") or 1
    for build in run.builds.filter(engine_id__in=asked):
        best = figures[str(build.engine_id)].get("best_round_ms")
        if isinstance(best, bool) or not isinstance(best, int | float) or not 0 < best < math.inf:
            raise ResultRejected(
                f"best_round_ms of engine {build.engine_id} must be a positive number, got {best!r}"
            )
        build.side_by_side_ms = best / batch_size
        build.save(update_fields=["side_by_side_ms"])
    return run


def advance_for_job(job):
    """Advance the auto run a finished job belongs to (a build's job, or its comparison)."""
    if not (job.params.get("auto_build") or job.params.get("auto_run")):
        return
    build = AutoBuild.objects.filter(pk=job.params.get("auto_build")).first()
    run = build.auto_run if build else AutoRun.objects.filter(pk=job.params.get("auto_run")).first()
    if run is not None:
        advance(run)


def _accuracy_ok(accuracy, device_class):
    return not accuracy.tolerance_breach(device_class)


def _golden_ok(build):
    """Return True unless the build's evaluation checked golden pairs and they failed."""
    golden = build.golden
    return golden is None or golden.passed


def ms_per_image(build):
    """Return the build's time per image by the figure its class's gate judges (lower is faster).

    A batch class: 1000 / sustained throughput. A real-time class: p99 per image, the
    inverse of its fps at p99, so the ranking and the gate read the same figure.
    """
    benchmark = build.benchmark
    if build.auto_run.device_class.is_batch:
        return 1000.0 / benchmark.gate_throughput_ips
    return benchmark.gate_p99_ms / benchmark.batch_size  # 1000 / fps at p99, never None


def _score(build):
    """The build's accuracy in its task's headline, higher is better (AccuracyRun.score)."""
    return build.accuracy.score


def rank(run):
    """Mark the Pareto-optimal builds and the recommended one; finish the run."""
    measured = _judge(run)
    run.recommended = _recommend(measured)
    run.summary = _summary(run, measured)
    run.state, run.finished_at = AutoRunState.DONE, timezone.now()
    run.save()


def _judge(run):
    """Mark each measured build's budget, tolerance and Pareto flags; return the measured."""
    measured = [b for b in run.builds.all() if not b.error and b.benchmark and b.accuracy]
    for build in measured:
        verdict = build.benchmark.gate().verdict
        build.meets_budget = {GateVerdict.MEETS: True, GateVerdict.MISSES: False}.get(verdict)
        within = _accuracy_ok(build.accuracy, run.device_class)
        build.within_tolerance = within and _golden_ok(build)
        # Speed as the recommendation reads it (the side-by-side run's where there was one),
        # so the recommended build is never shown off the front its own figure decides.
        point = (_decisive_ms(build), _score(build))
        build.pareto = not any(
            _decisive_ms(other) <= point[0]
            and _score(other) >= point[1]
            and (_decisive_ms(other), _score(other)) != point
            for other in measured
        )
        build.save()
    return measured


def _eligible(measured):
    """Return the builds a recommendation may name: within tolerance, meeting the gate if any do.

    An int8 build that quantised nothing runs in float like the fp32 build: it
    is never presented as an INT8 speed-up, so it is left out (its row says why).
    """
    within = [b for b in measured if b.within_tolerance and not quantised_nothing(b)]
    return [b for b in within if b.meets_budget] or within


def quantised_nothing(build):
    """Return True when the build's engine is labelled int8 but quantised nothing."""
    return build.engine is not None and build.engine.quantised_nothing


def _decisive_ms(build):
    """Return a build's time per image, from the side-by-side run when it was in it."""
    return build.side_by_side_ms if build.side_by_side_ms is not None else ms_per_image(build)


def _recommend(measured):
    return min(_eligible(measured), key=_decisive_ms, default=None)


def _summary(run, measured):
    """Say what the run recommends and how far it meets the gate, or why it recommends nothing;
    first, how it converted its source, if it did."""
    return _conversion_note(run) + _outcome(run, measured)


def _outcome(run, measured):
    """Say what the run recommends and how far it meets the gate, or why it recommends nothing."""
    if run.recommended is None:
        return _nothing_recommended(run, measured)
    best, device_class = run.recommended, run.device_class
    text = f"Recommended: {best.backend} {best.precision}, {_figure(best.benchmark)}"
    gate = device_class.gate_rule[:-1]
    if best.meets_budget is None:
        reason = best.benchmark.gate().reason.rstrip(".")
        text += f"; no build was measured meeting the class's gate ({gate}): {reason}"
    elif not best.meets_budget:
        text += f"; no build meets the class's gate ({gate})"
    failures = _failures(run)
    return text + _comparison_summary(run, measured) + (f"; {failures}" if failures else "")


def _figure(benchmark):
    """Return the figure the class's gate judges, named as every page names it."""
    if benchmark.device_class.is_batch:
        return (
            f"sustained throughput {benchmark.gate_throughput_ips:.1f} images/s "
            f"at batch {benchmark.batch_size}"
        )
    return f"p99 {benchmark.gate_p99_ms:.3f} ms ({benchmark.fps_at_p99:.1f} fps at p99)"


def _nothing_recommended(run, measured):
    """Say why a finished run recommends nothing: every build failed, skipped, or off tolerance."""
    tried, skipped = run.tried_builds, run.builds.exclude(skipped="").count()
    skips = f"{skipped} skipped (see why below)" if skipped else ""
    if not tried:
        return f"No build could be tried: all {skipped} were skipped (see why below)."
    failures = _failures(run)
    if len(run.failed_builds) == len(tried):
        return f"{failures}; {skips}." if skips else f"{failures}."
    if not measured:
        return f"No build was measured; {failures or 'no result was stored'}."
    verdict = "No build stayed within the accuracy tolerance"
    if any(build.within_tolerance for build in measured):
        verdict = "No build within the accuracy tolerance could be recommended (see why below)"
    return "; ".join(clause for clause in (verdict, failures, skips) if clause) + "."


def _failures(run):
    """Say how many of the builds tried failed and how (their categories); '' when none did."""
    tried, failed = run.tried_builds, run.failed_builds
    if not failed:
        return ""
    count = f"{len(failed)} of {len(tried)} builds failed"
    if len(failed) == len(tried):
        count = f"All {len(tried)} builds failed" if len(tried) > 1 else "The only build failed"
    labels = Counter(build.failure_label for build in failed)
    how = ", ".join(f"{label}: {n}" if n > 1 else label for label, n in labels.most_common())
    return f"{count} ({how})"


def _comparison_summary(run, measured):
    """Return what the side-by-side run decided, or why it did not, as a clause."""
    job = run.compare_job
    if job is None:
        return ""
    if job.state != JobState.SUCCEEDED:
        why = job.error or job.get_state_display().lower()
        return f"; the side-by-side benchmark did not finish ({why}), so the separate runs decided"
    best = run.recommended
    others = sorted(
        (b for b in measured if b.side_by_side_ms is not None and b.pk != best.pk),
        key=lambda b: b.side_by_side_ms,
    )
    if not others or best.side_by_side_ms is None:
        return ""
    lead = others[0].side_by_side_ms / best.side_by_side_ms
    verdict = "as fast as" if lead <= 1 + TIE_MARGIN else f"{lead:.2f}× faster than"
    return (
        f"; timed side by side with {', '.join(str(b) for b in others)}, "
        f"it was {verdict} {others[0]} ({best.side_by_side_ms:.3g} vs "
        f"{others[0].side_by_side_ms:.3g} ms per image)"
    )


def advance_running():
    """Advance every running auto run (the reaper calls this: nothing waits forever)."""
    for run in AutoRun.objects.filter(state=AutoRunState.RUNNING):
        advance(run)
