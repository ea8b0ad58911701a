"""Exports of a model's results: CSV, JSON and a self-contained HTML report."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, JsonResponse
from django.utils.text import slugify

from deployhub.benchmarks.exports import accuracy_csv, benchmarks_csv, model_results
from deployhub.benchmarks.reports import model_report as build_report
from deployhub.registry.access import get_model_for_user


def attachment(body, content_type, model, suffix):
    """Return `body` as a download named after the model."""
    response = HttpResponse(body, content_type=content_type)
    filename = f"{slugify(model.name) or 'model'}-{suffix}"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
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
def model_results_json(request, pk):
    model = get_model_for_user(request, pk)
    return JsonResponse(model_results(model))


@login_required
def model_report(request, pk):
    model = get_model_for_user(request, pk)
    html = build_report(model, request.user)
    return attachment(html, "text/html; charset=utf-8", model, "report.html")
