"""Batch sweep: throughput and per-batch latency against batch size.

From the sweeps chosen engines' runs stored (BenchmarkRun.batch_sweep), in the
visual language of deployhub/core/figure_style.py, as the HTML report's sweep figure.
The budget is the class's: a real-time class's frame budget on the latency plot, a
batch class's per-batch ceiling there and its throughput target on the throughput plot.
"""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.core.figure_style import BUDGET_COLOUR, LAYOUT, marker_symbol, precision_colour
from deployhub.devices.models import ServingPattern
from deployhub.figures.distribution import MAX_RUNS, run_label, run_link

NO_SWEEP = (
    "Engine #{pk} has no batch sweep yet: run a benchmark with “Batch sweep” ticked on its "
    'page (API: POST /api/v1/engines/{pk}/benchmarks with {{"batch_sweep": true}}).'
)


def sweep_runs(teams, engine_ids):
    """Return each chosen engine's latest run that swept batch sizes (at most MAX_RUNS)."""
    runs = (
        BenchmarkRun.objects.filter(device_class__team__in=teams, engine_id__in=engine_ids)
        .exclude(batch_sweep=[])
        .select_related("engine", "model_version", "device_class", "job")
        .order_by("-created_at", "-pk")
    )
    latest = {}
    for run in runs:
        latest.setdefault(run.engine_id, run)
    return [latest[pk] for pk in engine_ids if pk in latest][:MAX_RUNS]


def sweep_notes(runs, engine_ids):
    found = {run.engine_id for run in runs}
    return [NO_SWEEP.format(pk=pk) for pk in engine_ids if pk not in found]


def budget_lines(device_class):
    """Return {"latency": (ms, label) | None, "throughput": (ips, label) | None} for a class."""
    if device_class.serving_pattern == ServingPattern.BATCH:
        ceiling, target = device_class.batch_latency_ceiling_ms, device_class.throughput_target_ips
        return {
            "latency": (ceiling, f"{device_class.slug} per-batch ceiling {ceiling:g} ms")
            if ceiling
            else None,
            "throughput": (target, f"{device_class.slug} target {target:g} img/s")
            if target
            else None,
        }
    budget = device_class.frame_budget_ms
    return {
        "latency": (budget, f"{device_class.slug} frame budget {budget:g} ms"),
        "throughput": None,
    }


def sweep_figure(runs):
    """Throughput (left) and per-batch p99 (right) against batch size, one line per run."""
    figure = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("Throughput", "Per-batch latency (p99)"),
        horizontal_spacing=0.1,
    )
    for run in runs:
        _add_run(figure, run)
    for device_class in {run.device_class for run in runs}:
        _add_budget(figure, budget_lines(device_class))
    figure.update_layout(title="Batch sweep", height=440, **LAYOUT)
    figure.update_xaxes(title_text="batch size", type="log", dtick=0.30102999566)
    figure.update_yaxes(title_text="images/s", row=1, col=1)
    figure.update_yaxes(title_text="ms per batch", row=1, col=2)
    return figure


def _add_run(figure, run):
    rows = run.sweep_rows
    sizes = [row["batch_size"] for row in rows]
    style = {
        "mode": "lines+markers",
        "marker": {"size": 9, "symbol": marker_symbol(run.backend, run.stable)},
        "line": {"color": precision_colour(run.precision)},
        "legendgroup": f"run-{run.pk}",
        "customdata": [run_link(run)] * len(rows),
    }
    label = run_label(run)
    throughput = [row["throughput_ips"] for row in rows]
    p99 = [(row.get("latency_ms") or {}).get("p99") for row in rows]
    figure.add_trace(go.Scatter(x=sizes, y=throughput, name=f"{label} throughput", **style), 1, 1)
    figure.add_trace(go.Scatter(x=sizes, y=p99, name=f"{label} p99", **style), 1, 2)


def _add_budget(figure, lines):
    for key, column in (("throughput", 1), ("latency", 2)):
        if lines[key]:
            value, text = lines[key]
            figure.add_hline(
                y=value,
                line={"color": BUDGET_COLOUR, "dash": "dash"},
                annotation_text=text,
                row=1,
                col=column,
            )
