"""Benchmarks on the version page, and exports of a model's results (CSV, JSON, HTML report)."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils.text import slugify
from django.views.decorators.http import require_POST

from deployhub.benchmarks.access import get_run_for_user
from deployhub.benchmarks.actions import BenchmarkRefused, submit_benchmark
from deployhub.benchmarks.exports import (
    accuracy_csv,
    benchmarks_csv,
    model_csv,
    model_results_body,
)
from deployhub.benchmarks.forms import BenchmarkForm
from deployhub.benchmarks.models import flag_int8_slowdowns_in_version
from deployhub.benchmarks.pages import results_part
from deployhub.benchmarks.reports import model_report as build_report
from deployhub.core.downloads import content_disposition
from deployhub.registry.access import get_model_for_user, get_version_for_user
from deployhub.registry.pages import version_page
from deployhub.teams.access import require_role
from deployhub.teams.models import Role


@login_required
def version_results(request, pk):
    """Return the results table alone, so the page can refresh it when a job finishes."""
    version = get_version_for_user(request, pk)
    return render(request, "benchmarks/_results.html", results_part(version))


@login_required
def run_details(request, pk):
    """Return a run's details alone: a results table loads them when they are opened."""
    [run] = flag_int8_slowdowns_in_version([get_run_for_user(request, pk)])
    # Drawn without the request: the fragment reads none of the page's context (the team
    # switcher's two queries), only the run.
    html = render_to_string("benchmarks/_run_details.html", {"b": run, "gate": run.gate()})
    return HttpResponse(html)


@login_required
@require_POST
def version_benchmark(request, pk):
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    form = BenchmarkForm(request.POST, team=version.team, version=version)
    if not form.is_valid():
        messages.error(request, "Benchmark not queued: see the form below.")
        return version_page(request, version, status=400, benchmark_form=form)
    try:
        job = submit_benchmark(form, request.user, version)
    except BenchmarkRefused as exc:
        messages.error(request, str(exc))
        return redirect(version)
    messages.success(request, f"Benchmark queued as job #{job.pk}.")
    return redirect(f"{version.get_absolute_url()}#job-{job.pk}")


def attachment(body, content_type, model, suffix):
    """Return `body` as a download named after the model."""
    response = HttpResponse(body, content_type=content_type)
    filename = f"{slugify(model.name, allow_unicode=True) or 'model'}-{suffix}"
    response["Content-Disposition"] = content_disposition(filename)
    return response


@login_required
def model_benchmarks_csv(request, pk):
    model = get_model_for_user(request, pk)
    return attachment(benchmarks_csv(model), "text/csv; charset=utf-8", model, "benchmarks.csv")


@login_required
def model_accuracy_csv(request, pk):
    model = get_model_for_user(request, pk)
    return attachment(accuracy_csv(model), "text/csv; charset=utf-8", model, "accuracy.csv")


@login_required
def model_sweep_csv(request, pk):
    """The model's batch sweeps, one row per run and batch size."""
    model = get_model_for_user(request, pk)
    body = model_csv(model, "batch-sweep")
    return attachment(body, "text/csv; charset=utf-8", model, "batch-sweep.csv")


@login_required
def model_results_json(request, pk):
    model = get_model_for_user(request, pk)
    return HttpResponse(model_results_body(model), content_type="application/json")


@login_required
def model_report(request, pk):
    model = get_model_for_user(request, pk)
    html = build_report(model, request.user)
    return attachment(html, "text/html; charset=utf-8", model, "report.html")
