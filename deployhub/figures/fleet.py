"""The fleet view: a model's versions × device classes, each cell its best gate-passing engine.

A cell shows fps at p99 (real-time classes) or sustained img/s (batch classes); its
colour is that figure against the class's target (1 = exactly at budget). A cell whose
best engine is outside the budget or the accuracy tolerance is marked ✕. A click
opens the engine.
"""

from dataclasses import dataclass

import plotly.graph_objects as go

from deployhub.core.figure_style import LAYOUT
from deployhub.engines.models import Engine
from deployhub.figures.points import load_points

OUTSIDE = "✕"


@dataclass
class Best:
    """A version's best engine on a class, and whether it passes the class's gate."""

    point: object
    passes: bool
    engine: Engine | None = None

    @property
    def open_gates(self):
        return self.engine.open_gates if self.engine else 0

    @property
    def gates(self):
        return len(self.engine.release_gates) if self.engine else 0


def best_of(points):
    """Return the best engine among points: a gate-passing one first, then by its figure."""
    measured = [p for p in points if p.figure is not None]
    if not measured:
        return None
    passing = [p for p in measured if p.meets_budget() and p.within_tolerance()]
    point = max(passing or measured, key=lambda p: p.figure)
    return Best(point, bool(passing))


def best_by_version(points):
    """Return {version number: {class: Best}} for the measured engines."""
    groups = {}
    for point in points:
        groups.setdefault(point.version, {}).setdefault(point.device_class, []).append(point)
    table = {}
    for version, classes in groups.items():
        bests = {dc: best_of(group) for dc, group in classes.items()}
        table[version] = {dc: best for dc, best in bests.items() if best}
    return table


def target(device_class):
    """The figure a class asks for: its budget in fps, or its throughput target (img/s)."""
    if device_class.is_batch:
        return device_class.throughput_target_ips
    return device_class.budget_fps


def _cell(best):
    if best is None:
        return None, "no run", None
    point, goal = best.point, target(best.point.device_class)
    unit = "img/s" if point.device_class.is_batch else "fps"
    mark = "" if best.passes else f"{OUTSIDE} "
    text = f"{mark}{point.figure:.0f} {unit}<br>#{point.engine_id} {point.precision}"
    return (point.figure / goal if goal else None), text, point.url


def fleet_figure(model):
    """Return (the heatmap, notes)."""
    table = best_by_version(load_points(model, Engine.objects.filter(model_version__model=model)))
    versions = sorted(table)
    classes = sorted({dc for row in table.values() for dc in row}, key=lambda c: c.slug)
    cells = [[_cell(table[v].get(dc)) for dc in classes] for v in versions]
    figure = go.Figure(
        go.Heatmap(
            z=[[c[0] for c in row] for row in cells],
            text=[[c[1] for c in row] for row in cells],
            customdata=[[c[2] for c in row] for row in cells],
            x=[dc.slug for dc in classes],
            y=[f"v{v}" for v in versions],
            texttemplate="%{text}",
            hovertemplate="%{y} on %{x}<br>%{text}<br>%{z:.2f}× the target<extra></extra>",
            colorscale="RdYlGn",
            zmid=1.0,
            colorbar={"title": "× target"},
            meta={"role": "fleet"},
        )
    )
    figure.update_layout(**LAYOUT, height=max(260, 60 * len(versions) + 120))
    figure.update_yaxes(autorange="reversed", type="category")
    figure.update_xaxes(type="category", side="top")
    notes = [] if versions else ["No benchmarked engine yet: benchmark an engine of a version."]
    if any(OUTSIDE in (c[1] or "") for row in cells for c in row):
        notes.append(
            f"{OUTSIDE}: no engine of that version passes the class's budget and tolerance."
        )
    return figure, notes
