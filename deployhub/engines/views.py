"""Pages and actions for compiled engines and device fingerprints."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from deployhub.benchmarks.actions import BenchmarkRefused, submit_benchmark
from deployhub.benchmarks.forms import BenchmarkForm
from deployhub.benchmarks.models import flag_int8_slowdowns, flag_int8_slowdowns_in_version
from deployhub.core.gates import gates_open
from deployhub.devices.access import team_class
from deployhub.engines import auto
from deployhub.engines.access import get_auto_run_for_user, get_engine_for_user
from deployhub.engines.actions import (
    BuildRefused,
    compatibility_matrix,
    rebuild,
    request_compile,
)
from deployhub.engines.forms import CompileForm, EvaluateForm
from deployhub.engines.gates import release_gates
from deployhub.engines.pages import engine_sections
from deployhub.evaluation.actions import EvaluationRefused, request_evaluation
from deployhub.jobs.backlog import no_device_notice
from deployhub.jobs.models import JobState
from deployhub.registry.access import get_version_for_user
from deployhub.registry.pages import version_page
from deployhub.teams.access import require_role
from deployhub.teams.models import Role


def _report(request, engine, job):
    """Say whether the store answered at once or a build was queued."""
    if engine is not None:
        messages.success(request, f"Reused {engine}: it is already built for this toolchain.")
    else:
        messages.info(request, f"Compile queued as job #{job.pk}.")


@login_required
@require_POST
def version_compile(request, pk):
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    form = CompileForm(request.POST, team=version.team)
    if not form.is_valid():
        messages.error(request, f"Compile not queued: {form.errors.as_text()}")
        return redirect(f"{version.get_absolute_url()}#engines")
    data = form.cleaned_data
    try:
        engine, job = request_compile(
            version, data["device_class"], data["backend"], data["build_config"], request.user
        )
    except BuildRefused as exc:
        messages.error(request, str(exc))
        return redirect(version)
    _report(request, engine, job)
    return redirect(f"{version.get_absolute_url()}#engines")


@login_required
def engine_detail(request, pk):
    return _engine_page(request, get_engine_for_user(request, pk))


def _engine_form(engine, data=None):
    version = engine.model_version
    return BenchmarkForm(data, team=engine.team, version=version, device_class=engine.device_class)


def _engine_page(request, engine, benchmark_form=None, status=200, evaluate_form=None):
    matrix = compatibility_matrix(engine.model_version, engine.device_class)
    cells = next((row for candidate, row in matrix if candidate.pk == engine.pk), [])
    benchmarks = flag_int8_slowdowns_in_version(
        engine.benchmarks.select_related("device", "device_class", "job", "engine")
    )
    context = {
        "engine": engine,
        "cells": cells,
        "benchmarks": benchmarks,
        "benchmark_form": benchmark_form or _engine_form(engine),
        "evaluate_form": evaluate_form or EvaluateForm(engine=engine),
        "accuracy_runs": engine.accuracy.select_related("dataset", "job")[:10],
        "golden_runs": engine.golden_runs.select_related("golden_set", "job")[:10],
        "gates": (gates := release_gates(engine)),
        "gates_open": gates_open(gates),
        **engine_sections.context(engine),
    }
    return render(request, "engines/detail.html", context, status=status)


@login_required
@require_POST
def engine_rebuild(request, pk):
    engine = get_engine_for_user(request, pk)
    require_role(request.user, engine.team, Role.ENGINEER)
    try:
        _report(request, *rebuild(engine, request.user))
    except BuildRefused as exc:
        messages.error(request, str(exc))
    return redirect(f"{engine.model_version.get_absolute_url()}#engines")


@login_required
@require_POST
def engine_benchmark(request, pk):
    engine = get_engine_for_user(request, pk)
    require_role(request.user, engine.team, Role.ENGINEER)
    form = _engine_form(engine, request.POST)
    if not form.is_valid():
        messages.error(request, "Benchmark not queued: see the form below.")
        return _engine_page(request, engine, benchmark_form=form, status=400)
    try:
        job = submit_benchmark(form, request.user, engine.model_version, engine=engine)
    except BenchmarkRefused as exc:
        messages.error(request, str(exc))
        return redirect(engine)
    messages.success(request, f"Benchmark of {engine} queued as job #{job.pk}.")
    return redirect(f"{engine.model_version.get_absolute_url()}#job-{job.pk}")


@login_required
@require_POST
def engine_evaluate(request, pk):
    """Queue an evaluate job of the engine: on a dataset, on golden pairs, or both."""
    engine = get_engine_for_user(request, pk)
    require_role(request.user, engine.team, Role.ENGINEER)
    form = EvaluateForm(request.POST, engine=engine)
    if not form.is_valid():
        messages.error(request, "Evaluation not queued: see the form below.")
        return _engine_page(request, engine, status=400, evaluate_form=form)
    data = form.cleaned_data
    try:
        job = request_evaluation(
            engine,
            request.user,
            dataset=data["dataset"],
            golden_set=data["golden_set"],
            max_samples=data["max_samples"],
        )
    except EvaluationRefused as exc:
        messages.error(request, str(exc))
        return redirect(engine)
    messages.success(request, f"Evaluation of {engine} queued as job #{job.pk}.")
    return redirect(job)


@login_required
@require_POST
def version_auto(request, pk):
    """Start auto mode for a version on a device class; a refusal is shown beside the button."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    device_class = team_class(version.team, request.POST.get("device_class"))
    try:
        if device_class is None:
            raise auto.AutoRefused("Choose one of your team's device classes for auto mode.")
        run = auto.start(version, device_class, request.user)
    except auto.AutoRefused as exc:
        messages.error(request, "Auto mode not started: see the reason beside its button.")
        compile_form = CompileForm(team=version.team, initial={"device_class": device_class})
        return version_page(
            request, version, status=400, auto_error=str(exc), compile_form=compile_form
        )
    return redirect(run)


@login_required
def auto_run_detail(request, pk):
    run = get_auto_run_for_user(request, pk)
    builds = list(
        run.builds.select_related("engine", "compile_job", "benchmark_job", "evaluate_job")
    )
    flag_int8_slowdowns([b.benchmark for b in builds if b.benchmark])
    context = {"run": run, "builds": builds, "waiting_notice": _waiting_notice(run, builds)}
    return render(request, "engines/auto_run.html", context)


def _waiting_notice(run, builds):
    """Say that no device of the run's class is online while one of its jobs waits, or ""."""
    jobs = [run.convert_job, run.compare_job]
    jobs += [job for b in builds for job in (b.compile_job, b.benchmark_job, b.evaluate_job)]
    if any(job is not None and job.state == JobState.QUEUED for job in jobs):
        return no_device_notice(run.device_class)
    return ""
