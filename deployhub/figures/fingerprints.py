"""Fingerprint timeline: each fingerprint change of a device or a class's
devices over time, and the engines each change made stale (a click opens the engine).

A change is a devices.FingerprintChange; the engines it made stale are the
"engine.stale" events its device recorded in the same transaction (engines.actions
.mark_stale), each tied to the device's latest change at or before it.
"""

import bisect
from collections import defaultdict

import plotly.graph_objects as go

from deployhub.benchmarks.models import engine_precision
from deployhub.core.figure_style import (
    BUDGET_COLOUR,
    LAYOUT,
    marker_symbol,
    plain,
    precision_colour,
)
from deployhub.devices.models import FingerprintChange
from deployhub.engines.models import Engine
from deployhub.teams.models import Event

CHANGE_COLOUR = "#444444"
NO_CHANGES = (
    "No fingerprint change recorded for {what}: one is recorded when a worker reports "
    "other hardware or toolchain versions (a driver, CUDA or runtime update)."
)


def timeline_data(devices):
    """Return (changes oldest first, stale events, {engine id: engine}) in three queries."""
    changes = list(
        FingerprintChange.objects.filter(device__in=devices)
        .select_related("device")
        .order_by("changed_at", "pk")
    )
    # Device names repeat across classes and teams: the events are the devices' team's, and
    # an engine counts only when it is of one of the devices' classes.
    actors = [f"device:{device}" for device in devices]
    events = Event.objects.filter(
        verb="engine.stale",
        actor__in=actors,
        target_type="engine",
        team__in={device.device_class.team_id for device in devices},
    )
    events = list(events.order_by("created_at", "pk"))
    engines = Engine.objects.filter(
        pk__in={event.target_id for event in events},
        device_class__in={device.device_class_id for device in devices},
    )
    engines = {e.pk: e for e in engines.select_related("model_version")}
    return changes, [event for event in events if event.target_id in engines], engines


def stale_by_change(changes, events):
    """Return {change id: [event]}: each stale event under its device's latest change before it."""
    by_device = defaultdict(list)
    for change in changes:
        by_device[f"device:{change.device}"].append(change)
    found = defaultdict(list)
    for event in events:
        history = by_device.get(event.actor) or []
        index = bisect.bisect_right([c.changed_at for c in history], event.created_at) - 1
        if index >= 0:
            found[history[index].pk].append(event)
    return found


def timeline_figure(changes, events, engines, title):
    """Changes on one row per device; the engines each made stale on rows of their own."""
    stale = stale_by_change(changes, events)
    figure = go.Figure()
    figure.add_trace(_changes_trace(changes, stale, engines))
    for change in changes:
        for event in stale.get(change.pk, []):
            engine = engines.get(event.target_id)
            if engine is not None:
                figure.add_trace(_stale_trace(change, event, engine))
    figure.update_layout(title=title, height=360, showlegend=False, **LAYOUT)
    figure.update_xaxes(title_text="when the worker reported it", type="date")
    figure.update_yaxes(type="category", automargin=True)
    return figure


def _changes_trace(changes, stale, engines):
    def hover(change):
        made = [f"engine #{event.target_id}" for event in stale.get(change.pk, [])]
        lines = "<br>".join(plain(line) for line in change.summary[:8])
        return f"{plain(change.device)}<br>{lines}<br>made stale: {', '.join(made) or 'none'}"

    return go.Scatter(
        x=[change.changed_at for change in changes],
        y=[str(change.device) for change in changes],
        mode="markers",
        marker={"size": 14, "symbol": "diamond", "color": CHANGE_COLOUR},
        text=[hover(change) for change in changes],
        hoverinfo="text",
        name="fingerprint changes",
    )


def engine_row(engine):
    return f"engine #{engine.pk} {engine.backend} v{engine.model_version.number}"


def _stale_trace(change, event, engine):
    row, reason = engine_row(engine), (event.data or {}).get("reason") or ""
    return go.Scatter(
        x=[change.changed_at, event.created_at],
        y=[str(change.device), row],
        mode="lines+markers",
        line={"color": BUDGET_COLOUR, "width": 1, "dash": "dot"},
        marker={
            "size": [0, 12],
            "color": precision_colour(engine_precision(engine)),
            "symbol": marker_symbol(engine.backend, False),
        },
        customdata=[engine.get_absolute_url()] * 2,
        text=["", f"{row} made stale by {plain(change.device)}: {plain(reason)} ({engine.status})"],
        hoverinfo="text",
        name=f"{row} stale",
    )
