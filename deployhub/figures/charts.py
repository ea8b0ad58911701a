"""The plotly figures of the dashboard, built from points (deployhub/figures/points.py).

Every figure speaks deployhub/core/figure_style.py: a colour per precision, a symbol per
backend, hollow for an unstable measurement. Each engine's point carries its page's
URL in customdata, which static/js/figures.js opens on a click.
"""

import functools
import math
from collections import defaultdict

import plotly.io as pio

from deployhub.core.figure_style import (
    BUDGET_COLOUR,
    FRONTIER_COLOUR,
    LAYOUT,
    PRODUCTION_RING,
    TOLERANCE_FILL,
    marker_symbol,
    plain,
    precision_colour,
)


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
            f"{facet.title}: {facet.accuracy(point):.4f}",
            f"peak memory: {memory}",
            *flags,
        ]
    )


def marker_sizes(points):
    """Marker size by peak memory (area grows with memory); 8 where none was measured."""
    largest = max((p.memory_mb or 0 for p in points), default=0) or 1
    return [8 + 22 * math.sqrt(p.memory_mb / largest) if p.memory_mb else 8 for p in points]


def _scatter(column, **spec):
    """A scatter trace of a facet, as plotly JSON on the facet's axes."""
    axis = _axis_suffix(column)
    return {"type": "scatter", "xaxis": f"x{axis}", "yaxis": f"y{axis}", **spec}


def _axis_suffix(column):
    return "" if column == 1 else str(column)


def _group_traces(facet, column, sizes, seen):
    """One trace per (precision, backend) of the facet, named once in the legend."""
    groups = defaultdict(list)
    for point in facet.points:
        groups[(point.precision, point.backend)].append(point)
    for (precision, backend), points in sorted(groups.items()):
        name = f"{precision} · {backend}"
        yield _scatter(
            column,
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


def _frontier_trace(facet, column):
    front = sorted((p for p in facet.points if p.pareto), key=lambda p: p.latency_ms)
    return _scatter(
        column,
        x=[p.latency_ms for p in front],
        y=[facet.accuracy(p) for p in front],
        mode="lines+markers",
        name="Pareto frontier",
        legendgroup="pareto",
        showlegend=column == 1,
        line={"color": FRONTIER_COLOUR, "dash": "dot", "width": 1},
        marker={"symbol": "star", "size": 7, "color": FRONTIER_COLOUR},
        customdata=[p.url for p in front],
        hoverinfo="skip",
        meta={"role": "pareto"},
    )


def _production_trace(facet, column, sizes, seen):
    production = [p for p in facet.points if p.production]
    first = bool(production) and "production" not in seen
    seen.update(["production"] if production else [])
    return _scatter(
        column,
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


def _facet_guides(facet, column):
    """The class's budget as a vertical line and its accuracy tolerance as a band (shapes)."""
    axis = _axis_suffix(column)
    if facet.budget_ms:
        yield {
            "type": "line",
            "x0": facet.budget_ms,
            "x1": facet.budget_ms,
            "xref": f"x{axis}",
            "y0": 0,
            "y1": 1,
            "yref": f"y{axis} domain",
            "line": {"color": BUDGET_COLOUR, "dash": "dash"},
        }
    if facet.band:
        low, high = facet.band
        yield {
            "type": "rect",
            "x0": 0,
            "x1": 1,
            "xref": f"x{axis} domain",
            "y0": low,
            "y1": high,
            "yref": f"y{axis}",
            "fillcolor": TOLERANCE_FILL,
            "line": {"width": 0},
        }


def _facet_title(facet):
    dc = facet.device_class
    budget = f"budget {facet.budget_ms:.3g} ms{'/image' if dc.is_batch else ''}"
    budget = budget if facet.budget_ms else "no throughput target"
    return f"{dc.slug} · {budget} · {facet.tolerance_text}"


def facet_domains(columns, spacing):
    """The x domain of each of `columns` side-by-side plots, `spacing` apart (as plotly's
    make_subplots lays them out)."""
    width = (1 - spacing * (columns - 1)) / columns
    return [
        [column * (width + spacing), min(1.0, column * (width + spacing) + width)]
        for column in range(columns)
    ]


def _title_annotation(text, domain):
    return {
        "text": text,
        "x": (domain[0] + domain[1]) / 2,
        "xanchor": "center",
        "xref": "paper",
        "y": 1.0,
        "yanchor": "bottom",
        "yref": "paper",
        "showarrow": False,
        "font": {"size": 16},
    }


def tradeoff_figure(explorer):
    """Return the explorer's figure, one facet per device class side by side, as plotly JSON
    (a dict: built as plotly objects, the figure took ten times as long as its data)."""
    facets = explorer.facets
    points = explorer.points
    sizes = dict(zip([p.engine_id for p in points], marker_sizes(points), strict=True))
    domains = facet_domains(max(len(facets), 1), spacing=0.06)
    seen, data, shapes = set(), [], []
    layout = {
        **LAYOUT,
        "template": template_json(LAYOUT["template"]),
        "height": 480,
        "legend": {"orientation": "h", "y": -0.2},
        "hovermode": "closest",
    }
    for column, domain in enumerate(domains, start=1):
        axis = _axis_suffix(column)
        layout[f"xaxis{axis}"] = {"anchor": f"y{axis}", "domain": domain}
        layout[f"yaxis{axis}"] = {"anchor": f"x{axis}", "domain": [0.0, 1.0]}
    for column, facet in enumerate(facets, start=1):
        data.extend(_group_traces(facet, column, sizes, seen))
        data.append(_frontier_trace(facet, column))
        data.append(_production_trace(facet, column, sizes, seen))
        shapes.extend(_facet_guides(facet, column))
        axis = _axis_suffix(column)
        x_title = "ms per image (log)" if facet.device_class.is_batch else "p99 latency, ms (log)"
        layout[f"xaxis{axis}"].update(type="log", title={"text": x_title})
        layout[f"yaxis{axis}"]["title"] = {"text": facet.title}
    if facets:
        layout["annotations"] = [
            _title_annotation(_facet_title(f), d) for f, d in zip(facets, domains, strict=True)
        ]
    if shapes:
        layout["shapes"] = shapes
    return {"data": data, "layout": layout}


@functools.cache
def template_json(name):
    """A plotly template as plotly.js takes it (it knows no template names)."""
    return pio.templates[name].to_plotly_json()
