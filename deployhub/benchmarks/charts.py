"""Plotly figures of a model's results: latency by version, accuracy against latency, sweeps.

Figures are built from stored runs only; the web process never measures anything.
"""

from collections import defaultdict

import plotly.graph_objects as go

from deployhub.benchmarks.models import engine_precision
from deployhub.core.figure_style import LAYOUT as STYLE_LAYOUT
from deployhub.core.figure_style import marker_symbol, precision_colour
from deployhub.devices.models import ServingPattern

LAYOUT = {**STYLE_LAYOUT, "height": 420}


def _marker(runs, precision, size=10):
    """The shared visual language: colour by precision, symbol by backend, hollow if unstable."""
    return {
        "size": size,
        "color": precision_colour(precision),
        "symbol": [marker_symbol(run.backend, run.stable) for run in runs],
    }


def _figure(title, xaxis, yaxis):
    figure = go.Figure()
    figure.update_layout(title=title, xaxis_title=xaxis, yaxis_title=yaxis, **LAYOUT)
    return figure


def _run_text(run):
    gate = run.gate()
    return (
        f"v{run.model_version.number} {run.backend} {run.precision} on {run.device_class.slug}<br>"
        f"{run.scenario_label}, batch {run.batch_size}: p50 {run.latency_p50_ms:.3f} ms, "
        f"p99 {run.gate_p99_ms:.3f} ms<br>{gate.label}: {gate.reason}"
    )


def latency_figure(runs):
    """p99 latency of each run by version, one trace per device class and precision."""
    figure = _figure("p99 latency by version", "version", "p99 latency (ms)")
    groups = defaultdict(list)
    for run in runs:
        groups[(run.device_class.slug, run.precision)].append(run)
    for (slug, precision), group in sorted(groups.items()):
        figure.add_trace(
            go.Scatter(
                x=[f"v{run.model_version.number}" for run in group],
                y=[run.gate_p99_ms for run in group],
                mode="markers",
                marker=_marker(group, precision),
                name=f"{slug} · {precision}",
                text=[_run_text(run) for run in group],
                hoverinfo="text",
            )
        )
    for device_class in {run.device_class for run in runs}:
        if device_class.serving_pattern == ServingPattern.REALTIME:
            figure.add_hline(
                y=device_class.frame_budget_ms,
                line_dash="dash",
                annotation_text=f"{device_class.slug} budget {device_class.frame_budget_ms:g} ms",
            )
    figure.update_xaxes(type="category", categoryorder="category ascending")
    return figure


def _engine_latency(runs):
    """Return each engine's best p99 per image among its runs (the real-time gate's figure)."""
    best = {}
    for run in runs:
        if run.engine_id is not None:
            per_image = run.gate_p99_ms / run.batch_size
            best[run.engine_id] = min(best.get(run.engine_id, per_image), per_image)
    return best


def accuracy_latency_figure(runs, accuracy_runs):
    """The task's headline (labelled, else agreement with FP32) against each engine's p99.

    The p99 per image is the figure a real-time gate judges and auto mode ranks a
    real-time class's builds by; the axis says so, and the y axis names the headline.
    """
    names = sorted({run.headline for run in accuracy_runs}) or ["accuracy"]
    figure = _figure("Accuracy against latency", "p99 latency per image (ms)", " / ".join(names))
    latency = _engine_latency(runs)
    groups = defaultdict(list)
    for run in accuracy_runs:
        if run.engine_id in latency:
            groups[engine_precision(run.engine)].append(run)
    for precision, points in sorted(groups.items()):
        figure.add_trace(
            go.Scatter(
                x=[latency[run.engine_id] for run in points],
                y=[run.headline_value for run in points],
                mode="markers+text",
                marker={
                    "size": 11,
                    "color": precision_colour(precision),
                    "symbol": [marker_symbol(run.engine.backend) for run in points],
                },
                text=[_engine_label(run.engine) for run in points],
                textposition="top center",
                name=precision,
            )
        )
    return figure


def _engine_label(engine):
    return f"v{engine.model_version.number} {engine.backend} {engine_precision(engine)}"


def sweep_figure(runs):
    """Throughput against batch size for every run that swept batch sizes."""
    figure = _figure("Batch sweep: throughput", "batch size", "images/s")
    for run in runs:
        if not run.batch_sweep:
            continue
        rows = sorted(run.batch_sweep, key=lambda row: row["batch_size"])
        figure.add_trace(
            go.Scatter(
                x=[row["batch_size"] for row in rows],
                y=[row["throughput_ips"] for row in rows],
                mode="lines+markers",
                marker={"symbol": marker_symbol(run.backend, run.stable)},
                line={"color": precision_colour(run.precision)},
                name=f"v{run.model_version.number} {run.backend} {run.precision} #{run.pk}",
            )
        )
    figure.update_xaxes(type="log", dtick=0.30102999566)
    return figure


def model_figures(runs, accuracy_runs):
    """Return (title, figure) for each figure that has data."""
    figures = []
    if runs:
        figures.append(("Latency by version, precision and device class", latency_figure(runs)))
    if runs and any(run.engine_id for run in accuracy_runs):
        figures.append(("Accuracy against latency", accuracy_latency_figure(runs, accuracy_runs)))
    if any(run.batch_sweep for run in runs):
        figures.append(("Batch sweep", sweep_figure(runs)))
    return figures
