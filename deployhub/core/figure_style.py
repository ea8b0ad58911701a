"""The one visual language of every figure: a colour per precision, a symbol per backend.

Neutral (imports no app), so the pages' figures (deployhub/figures) and the
downloadable HTML report (deployhub/benchmarks) draw the same build the same way.
A backend's symbol follows its place in workers.backends.known, never its name;
an unstable measurement is drawn hollow.
"""

import html

from workers.backends.known import BACKENDS

# A fixed colour per precision (colour-blind safe, Okabe-Ito); others fall back to grey.
PRECISION_COLOURS = {
    "fp32": "#0072B2",
    "tf32": "#56B4E9",
    "fp16": "#009E73",
    "bf16": "#CC79A7",
    "int8": "#D55E00",
    "fp8": "#E69F00",
    "int4": "#F0E442",
}
OTHER_COLOUR = "#7f7f7f"
# Backends get these in the order workers.backends.known registers them.
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "x", "pentagon", "star-square")
# The production engine's ring, the Pareto frontier's mark, and the budget and tolerance.
PRODUCTION_RING = {"symbol": "circle-open", "color": "#111111", "line": {"width": 2.5}}
FRONTIER_COLOUR = "#444444"
BUDGET_COLOUR = "#c0392b"
TOLERANCE_FILL = "rgba(0, 158, 115, 0.10)"
LAYOUT = {"template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 60, "b": 50}}
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def precision_colour(precision: str) -> str:
    """Return the colour of a precision (fp32, fp16, int8...); grey for one not listed."""
    return PRECISION_COLOURS.get(precision, OTHER_COLOUR)


def backend_symbol(backend: str) -> str:
    """Return the marker symbol of a backend, from its place among the known backends."""
    names = list(BACKENDS)
    index = names.index(backend) if backend in names else len(names)
    return SYMBOLS[index % len(SYMBOLS)]


def marker_symbol(backend: str, stable: bool | None = True) -> str:
    """Return the backend's symbol, hollow ("-open") when the measurement is unstable."""
    symbol = backend_symbol(backend)
    return symbol if stable is not False else f"{symbol}-open"


# A legend entry: its label, its colour or its symbol.
LegendEntry = tuple[str, str | None, str | None]


def legend() -> list[LegendEntry]:
    """Return [(label, colour or None, symbol or None)]: what each colour and symbol means."""
    colours: list[LegendEntry] = [
        (name, colour, None) for name, colour in PRECISION_COLOURS.items()
    ]
    symbols: list[LegendEntry] = [(name, None, backend_symbol(name)) for name in BACKENDS]
    return colours + symbols


def plain(value: object) -> str:
    """Text from users or devices as plotly shows it: its markup (<a>, <b>, <br>) as text."""
    return html.escape(str(value), quote=False)
