"""The version trend: one metric across a model's versions, per device class, regressions marked.

Each version's value is its best engine's on the class (lowest latency or memory,
highest fps or accuracy). A version worse than the one before by more than the
chosen percentage is a regression, marked with a red cross.
"""

from dataclasses import dataclass

import plotly.graph_objects as go

from deployhub.core.figure_style import BUDGET_COLOUR, LAYOUT, SYMBOLS
from deployhub.engines.models import Engine
from deployhub.figures.points import load_points

DEFAULT_REGRESSION = 5.0


@dataclass(frozen=True)
class Metric:
    label: str
    lower_is_better: bool
    attribute: str


METRICS = {
    "latency": Metric("latency at the gate (p99 ms; ms per image for batch)", True, "latency_ms"),
    "speed": Metric("fps at p99 (img/s for batch)", False, "figure"),
    "accuracy": Metric("agreement with FP32 (the task's headline)", False, "agreement"),
    "memory": Metric("peak memory (MB)", True, "memory_mb"),
}


def read_query(query):
    """Return (metric name, regression %) from ?metric=&regression=; raise ValueError."""
    metric = query.get("metric") or "latency"
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)} (got {metric!r}).")
    try:
        regression = float(query.get("regression") or DEFAULT_REGRESSION)
    except ValueError:
        raise ValueError("regression must be a percentage, like 5.") from None
    if not 0 <= regression <= 1000:
        raise ValueError("regression must be a percentage between 0 and 1000.")
    return metric, regression


def regressions(values, percent, lower_is_better):
    """Return the indices of values worse than the one before by more than `percent`."""
    found = []
    for index in range(1, len(values)):
        before, now = values[index - 1], values[index]
        if before is None or now is None or before == 0:
            continue
        change = (now - before) / abs(before) * 100
        if (change if lower_is_better else -change) > percent:
            found.append(index)
    return found


def series(points, metric):
    """Return {class: [(version, value, point)]}: each version's best engine on the class."""
    pick = min if metric.lower_is_better else max
    best = {}
    for point in points:
        value = getattr(point, metric.attribute)
        if value is None:
            continue
        key = (point.device_class, point.version)
        if key not in best or pick(value, best[key][0]) != best[key][0]:
            best[key] = (value, point)
    by_class = {}
    for (dc, version), (value, point) in sorted(best.items(), key=lambda i: i[0][1]):
        by_class.setdefault(dc, []).append((version, value, point))
    return by_class


def trend_figure(model, metric_name, percent):
    """Return (the figure, notes)."""
    metric = METRICS[metric_name]
    points = load_points(model, Engine.objects.filter(model_version__model=model))
    figure, notes = go.Figure(), []
    for index, (dc, rows) in enumerate(
        sorted(series(points, metric).items(), key=lambda i: i[0].slug)
    ):
        values = [value for _, value, _ in rows]
        figure.add_trace(
            go.Scatter(
                x=[f"v{version}" for version, _, _ in rows],
                y=values,
                mode="lines+markers",
                name=dc.slug,
                marker={"symbol": SYMBOLS[index % len(SYMBOLS)], "size": 9},
                customdata=[point.url for _, _, point in rows],
                hovertemplate="%{x}: %{y:.4g}<extra>" + dc.slug + "</extra>",
                meta={"role": "trend"},
            )
        )
        worse = regressions(values, percent, metric.lower_is_better)
        figure.add_trace(
            go.Scatter(
                x=[f"v{rows[i][0]}" for i in worse],
                y=[values[i] for i in worse],
                mode="markers",
                name=f"{dc.slug}: regression > {percent:g}%",
                marker={"symbol": "x", "size": 14, "color": BUDGET_COLOUR},
                customdata=[rows[i][2].url for i in worse],
                hoverinfo="skip",
                meta={"role": "regression"},
            )
        )
        notes += [f"{dc.slug}: v{rows[i][0]} is a regression." for i in worse]
    figure.update_layout(**LAYOUT, height=420, yaxis_title=metric.label)
    order = [f"v{n}" for n in sorted({p.version for p in points})]
    figure.update_xaxes(type="category", categoryorder="array", categoryarray=order)
    if not figure.data:
        notes.append("Nothing measured yet: benchmark (and evaluate) an engine of a version.")
    return figure, notes
