"""A self-contained HTML report of a model's results, to attach to a review.

One file: inline CSS, plotly.js inlined once from the installed plotly package,
every figure's data embedded. It makes no request when opened. Its data tables
are the CSVs' tables (benchmarks/exports.py EXPORTS): the same columns, the same rows.
"""

import functools

from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.safestring import mark_safe
from plotly.offline import get_plotlyjs

from deployhub.benchmarks.charts import model_figures
from deployhub.benchmarks.exports import export_tables
from deployhub.benchmarks.models import BenchmarkRun
from deployhub.core.figure_style import PLOT_CONFIG
from deployhub.evaluation.models import AccuracyRun


@functools.cache
def _plotly_js():
    return get_plotlyjs()


def _figure_html(figure):
    return figure.to_html(full_html=False, include_plotlyjs=False, config=PLOT_CONFIG)


def model_report(model, user=None):
    """Return the report of every version's benchmark and accuracy runs, as one HTML page."""
    runs = BenchmarkRun.objects.for_model(model)
    accuracy_runs = list(AccuracyRun.objects.for_model(model))
    figures = [
        (title, mark_safe(_figure_html(figure)))  # noqa: S308 (plotly's own markup)
        for title, figure in model_figures(runs, accuracy_runs)
    ]
    classes = sorted({run.device_class for run in runs}, key=lambda c: c.slug)
    context = {
        "model": model,
        "versions": model.versions.order_by("number"),
        "runs": [(run, run.gate()) for run in runs],
        "accuracy_runs": accuracy_runs,
        "classes": classes,
        "figures": figures,
        "tables": export_tables(runs, accuracy_runs),
        "plotly_js": mark_safe(_plotly_js()),  # noqa: S308 (the installed bundle)
        "generated_at": timezone.now(),
        "generated_by": user,
    }
    return render_to_string("benchmarks/report.html", context)
