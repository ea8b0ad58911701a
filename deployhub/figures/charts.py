"""The plotly figures of the dashboard, built from points (deployhub/figures/points.py).

Every figure speaks deployhub/figure_style.py: a colour per precision, a symbol per
backend, hollow for an unstable measurement. Each engine's point carries its page's
URL in customdata, which static/js/figures.js opens on a click.
"""

import math
from collections import defaultdict

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from deployhub.figure_style import (
    BUDGET_COLOUR,
    FRONTIER_COLOUR,
    LAYOUT,
    PRODUCTION_RING,
    TOLERANCE_FILL,
    marker_symbol,
    plain,
    precision_colour,
)

ACCURACY_TITLES = {"top1": "top-1 accuracy", "agreement": "top-1 agreement with FP32"}


def _config_text(mapping):
    text = ", ".join(f"{key}={value}" for key, value in sorted(mapping.items()))
    return plain(text) or "defaults"


def hover(point, facet):
    """The hover text of an engine: what it is, then its figures."""
    dc = point.device_class
    speed = (
        f"{point.latency_ms:.2f} ms/image at batch {point.batch} · {point.throughput:.0f} img/s"
        if dc.is_batch
        else f"p99 {point.p99_ms:.2f} ms · {point.figure:.0f} fps at p99 (batch {point.batch})"
    )
    memory = f"{point.memory_mb:.0f} MB {point.memory_kind}" if point.memory_mb else "not measured"
    flags = [
        flag
        for flag, on in (
            ("unstable measurement", point.stable is False),
            ("production", point.production),
            ("on the Pareto frontier", point.pareto),
        )
        if on
    ]
    return "<br>".join(
        [
            f"<b>engine #{point.engine_id}</b>: v{point.version} · {plain(point.backend)} · "
            f"{point.precision} on {dc.slug}",
            f"build: {_config_text(point.build_config)}",
            f"toolchain: {_config_text(point.tool_versions)}",
            speed,
            f"{ACCURACY_TITLES[facet.accuracy_kind]}: {facet.accuracy(point):.4f}",
            f"peak memory: {memory}",
            *flags,
        ]
    )


def marker_sizes(points):
    """Marker size by peak memory (area grows with memory); 8 where none was measured."""
    largest = max((p.memory_mb or 0 for p in points), default=0) or 1
    return [8 + 22 * math.sqrt(p.memory_mb / largest) if p.memory_mb else 8 for p in points]


def _group_traces(facet, sizes, seen):
    """One trace per (precision, backend) of the facet, named once in the legend."""
    groups = defaultdict(list)
    for point in facet.points:
        groups[(point.precision, point.backend)].append(point)
    for (precision, backend), points in sorted(groups.items()):
        name = f"{precision} · {backend}"
        yield go.Scatter(
            x=[p.latency_ms for p in points],
            y=[facet.accuracy(p) for p in points],
            mode="markers",
            name=name,
            legendgroup=name,
            showlegend=name not in seen,
            marker={
                "color": precision_colour(precision),
                "symbol": [marker_symbol(backend, p.stable) for p in points],
                "size": [sizes[p.engine_id] for p in points],
                "line": {"width": 1.5, "color": precision_colour(precision)},
            },
            customdata=[p.url for p in points],
            text=[hover(p, facet) for p in points],
            hovertemplate="%{text}<extra></extra>",
            meta={"role": "engines"},
        )
        seen.add(name)


def _frontier_trace(facet, first):
    front = sorted((p for p in facet.points if p.pareto), key=lambda p: p.latency_ms)
    return go.Scatter(
        x=[p.latency_ms for p in front],
        y=[facet.accuracy(p) for p in front],
        mode="lines+markers",
        name="Pareto frontier",
        legendgroup="pareto",
        showlegend=first,
        line={"color": FRONTIER_COLOUR, "dash": "dot", "width": 1},
        marker={"symbol": "star", "size": 7, "color": FRONTIER_COLOUR},
        customdata=[p.url for p in front],
        hoverinfo="skip",
        meta={"role": "pareto"},
    )


def _production_trace(facet, sizes, seen):
    production = [p for p in facet.points if p.production]
    first = bool(production) and "production" not in seen
    seen.update(["production"] if production else [])
    return go.Scatter(
        x=[p.latency_ms for p in production],
        y=[facet.accuracy(p) for p in production],
        mode="markers",
        name="production",
        legendgroup="production",
        showlegend=first,
        marker={**PRODUCTION_RING, "size": [sizes[p.engine_id] + 12 for p in production]},
        customdata=[p.url for p in production],
        hoverinfo="skip",
        meta={"role": "production"},
    )


def _facet_guides(figure, facet, column):
    """The class's budget as a vertical line and its accuracy tolerance as a band."""
    if facet.budget_ms:
        figure.add_vline(
            x=facet.budget_ms, line={"color": BUDGET_COLOUR, "dash": "dash"}, row=1, col=column
        )
    if facet.band:
        low, high = facet.band
        figure.add_hrect(y0=low, y1=high, fillcolor=TOLERANCE_FILL, line_width=0, row=1, col=column)


def _facet_title(facet):
    dc = facet.device_class
    budget = f"budget {facet.budget_ms:.3g} ms{'/image' if dc.is_batch else ''}"
    budget = budget if facet.budget_ms else "no throughput target"
    return f"{dc.slug} · {budget} · tolerance {dc.accuracy_tolerance:g} pt"


def tradeoff_figure(explorer):
    """Return the explorer's figure: one facet per device class, side by side."""
    facets = explorer.facets
    figure = make_subplots(
        rows=1,
        cols=max(len(facets), 1),
        subplot_titles=[_facet_title(f) for f in facets] or [""],
        horizontal_spacing=0.06,
    )
    points = explorer.points
    sizes = dict(zip([p.engine_id for p in points], marker_sizes(points), strict=True))
    seen = set()
    for column, facet in enumerate(facets, start=1):
        for trace in _group_traces(facet, sizes, seen):
            figure.add_trace(trace, row=1, col=column)
        figure.add_trace(_frontier_trace(facet, column == 1), row=1, col=column)
        figure.add_trace(_production_trace(facet, sizes, seen), row=1, col=column)
        _facet_guides(figure, facet, column)
        x_title = "ms per image (log)" if facet.device_class.is_batch else "p99 latency, ms (log)"
        figure.update_xaxes(type="log", title_text=x_title, row=1, col=column)
        figure.update_yaxes(title_text=ACCURACY_TITLES[facet.accuracy_kind], row=1, col=column)
    figure.update_layout(
        **LAYOUT, height=480, legend={"orientation": "h", "y": -0.2}, hovermode="closest"
    )
    return figure
