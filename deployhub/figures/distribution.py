"""Latency distribution: histogram and empirical CDF of chosen runs, overlaid.

Drawn from the samples each run keeps (BenchmarkRun.samples_ms); the p50/p90/p99
marks are the run's stored percentiles (taken by the worker from every run, not from
the kept samples), and a real-time class's frame budget is a line on the CDF.
"""

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from deployhub.benchmarks.models import NO_SAMPLES, BenchmarkRun, LatencySamples, Scenario
from deployhub.core.figure_style import (
    BUDGET_COLOUR,
    LAYOUT,
    marker_symbol,
    plain,
    precision_colour,
)
from deployhub.devices.models import ServingPattern

# At most this many runs on one figure: more is unreadable.
MAX_RUNS = 8
MARKS = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def cdf_points(samples):
    """Return (x, y) of the empirical CDF: sorted latencies and the share at or below each."""
    x = np.sort(np.asarray(samples, dtype=np.float64))
    return x, np.arange(1, len(x) + 1) / len(x)


def percentile_marks(run):
    """Return [(name, ms, share)]: where the run's stored p50, p90 and p99 sit on its CDF."""
    return [(name, getattr(run, f"latency_{name}_ms"), share) for name, share in MARKS]


def chosen_runs(teams, engine_ids=(), run_ids=()):
    """Return the chosen runs of these teams: each engine's latest latency run, then the runs.

    Offline runs measure no per-query latency and are left out. At most MAX_RUNS.
    """
    base = BenchmarkRun.objects.filter(device_class__team__in=teams).exclude(
        scenario=Scenario.OFFLINE
    )
    base = base.select_related("engine", "model_version", "device_class", "job")
    latest = {}
    for run in base.filter(engine_id__in=engine_ids).order_by("-created_at", "-pk"):
        latest.setdefault(run.engine_id, run)
    runs = [latest[pk] for pk in engine_ids if pk in latest]
    runs += [run for run in base.filter(pk__in=run_ids) if run not in runs]
    return runs[:MAX_RUNS]


def samples_of(runs):
    """Return {run id: samples in ms} for the runs that kept samples (one query)."""
    stored = LatencySamples.objects.filter(run__in=[run.pk for run in runs])
    return {row.run_id: row.samples_ms() for row in stored}


def run_label(run):
    """Name a run by what it measured: engine (or source model), backend, precision, batch."""
    subject = f"engine #{run.engine_id}" if run.engine_id else f"v{run.model_version.number} source"
    return f"{subject} {plain(run.backend)} {run.precision} b{run.batch_size} (run #{run.pk})"


def run_link(run):
    """The page a click on the run's marks opens: its engine's, else its job's."""
    return run.engine.get_absolute_url() if run.engine_id else run.job.get_absolute_url()


def missing_notes(runs, samples, engine_ids=(), run_ids=()):
    """Sentences for what the figure cannot draw, each saying what to run."""
    notes = [f"Run #{run.pk}: {NO_SAMPLES}." for run in runs if run.pk not in samples]
    found = {run.engine_id for run in runs}
    notes += [
        f"Engine #{pk} has no latency benchmark yet: benchmark it on its page."
        for pk in engine_ids
        if pk not in found
    ]
    shown = {run.pk for run in runs}
    notes += [f"Run #{pk} is not a latency run of your team." for pk in run_ids if pk not in shown]
    if not runs and not engine_ids and not run_ids:
        notes.append("Choose engines or runs (engines=1,2 or runs=3 in the URL) to compare.")
    return notes


def distribution_figure(runs, samples, title="Latency distribution"):
    """Histogram (left) and empirical CDF (right) of each run with samples, marks and budget."""
    figure = make_subplots(
        rows=1, cols=2, subplot_titles=("Histogram", "Empirical CDF"), horizontal_spacing=0.1
    )
    drawn = [run for run in runs if run.pk in samples]
    for index, run in enumerate(drawn):
        _add_run(figure, run, samples[run.pk], DASHES[index % len(DASHES)])
    _add_budgets(figure, drawn)
    figure.update_layout(title=title, height=440, barmode="overlay", **LAYOUT)
    figure.update_xaxes(title_text="latency per query (ms)")
    figure.update_yaxes(title_text="share of queries", row=1, col=1)
    figure.update_yaxes(title_text="share at or below", range=[0, 1.02], row=1, col=2)
    return figure


def _add_run(figure, run, ms, dash):
    label, colour = run_label(run), precision_colour(run.precision)
    group = f"run-{run.pk}"
    figure.add_trace(
        go.Histogram(
            x=ms,
            histnorm="probability",
            name=f"{label} histogram",
            legendgroup=group,
            marker={"color": colour},
            opacity=0.55,
            nbinsx=60,
        ),
        row=1,
        col=1,
    )
    x, y = cdf_points(ms)
    figure.add_trace(
        go.Scatter(
            x=x,
            y=y,
            mode="lines",
            line={"shape": "hv", "color": colour, "dash": dash},
            name=f"{label} CDF",
            legendgroup=group,
        ),
        row=1,
        col=2,
    )
    _add_marks(figure, run, label, colour, group)


def _add_marks(figure, run, label, colour, group):
    marks = percentile_marks(run)
    figure.add_trace(
        go.Scatter(
            x=[ms for _, ms, _ in marks],
            y=[share for _, _, share in marks],
            mode="markers+text",
            text=[name for name, _, _ in marks],
            textposition="middle right",
            marker={"size": 10, "color": colour, "symbol": marker_symbol(run.backend, run.stable)},
            customdata=[run_link(run)] * len(marks),
            hovertemplate="%{text} %{x:.3f} ms<extra>" + label + "</extra>",
            name=f"{label} p50/p90/p99",
            legendgroup=group,
        ),
        row=1,
        col=2,
    )


def _add_budgets(figure, runs):
    """A vertical line at each real-time class's frame budget, on the CDF."""
    classes = {run.device_class for run in runs}
    for device_class in classes:
        if device_class.serving_pattern == ServingPattern.REALTIME:
            budget = device_class.frame_budget_ms
            figure.add_vline(
                x=budget,
                line={"color": BUDGET_COLOUR, "dash": "dash"},
                annotation_text=f"{device_class.slug} frame budget {budget:g} ms",
                row=1,
                col=2,
            )
