"""Candidate against production: latency CDFs, accuracy and memory side by side.

The deltas are the evidence pack's (releases.evidence.comparison_item: Δ p99,
throughput, accuracy, peak memory), so the figure and the pack never disagree; the
runs drawn are the ones the pack compares (each engine's latest benchmark on its
class and latest evaluation).
"""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from deployhub.benchmarks.models import NO_SAMPLES
from deployhub.core.figure_style import LAYOUT, marker_symbol, plain, precision_colour
from deployhub.figures.distribution import cdf_points, percentile_marks, samples_of
from deployhub.releases.evidence import (
    comparison_item,
    latest_accuracy,
    latest_benchmark,
    production_to_compare,
)
from deployhub.releases.models import Release

DELTAS = (
    ("p99_ms", "Δ p99", "ms"),
    ("throughput_ips", "Δ throughput", "img/s"),
    ("accuracy", "Δ accuracy", "points"),
    ("peak_memory_mb", "Δ peak memory", "MB"),
)


def release_for_engine(engine):
    """The release the engine page compares: an unsaved proposal of the engine for its class."""
    return Release(
        engine=engine, model=engine.model_version.model, device_class=engine.device_class
    )


def production_engine(release):
    """Return the engine of the production release the candidate is compared with, or None."""
    current = production_to_compare(release)
    return current.engine if current is not None else None


def side(engine, role):
    """What the figure draws of one engine: its latest benchmark and evaluation."""
    run = latest_benchmark(engine)
    accuracy = latest_accuracy(engine)
    return {"engine": engine, "role": role, "run": run, "accuracy": accuracy}


def accuracy_value(accuracy):
    """The task's headline in points: labelled (mAP, top-1), else agreement with the FP32 source."""
    if accuracy is None or accuracy.headline_value is None:
        return None
    return accuracy.headline_value * 100


def delta_lines(deltas):
    """Return the evidence pack's deltas as sentences ("Δ p99 -1.20 ms (3.40 → 2.20)")."""
    lines = []
    for key, title, unit in DELTAS:
        delta = deltas.get(key)
        if delta is not None:
            lines.append(
                f"{title} {delta['delta']:+.2f} {unit} "
                f"({delta['production']:.2f} → {delta['candidate']:.2f})"
            )
    return lines


def empty_figure():
    return go.Figure(layout={"title": "Candidate against production", **LAYOUT})


def comparison(release):
    """Return (figure, notes) comparing the release's engine with production."""
    production = production_engine(release)
    if production is None:
        note = "No production release of this model on the class: nothing to compare with yet."
        return empty_figure(), [note]
    sides = [side(release.engine, "candidate"), side(production, "production")]
    deltas = (comparison_item(release).get("details") or {}).get("deltas") or {}
    samples = samples_of([s["run"] for s in sides if s["run"]])
    return comparison_figure(sides, samples, deltas), comparison_notes(sides, samples)


def comparison_notes(sides, samples):
    notes = []
    for s in sides:
        engine, run = s["engine"], s["run"]
        if run is None:
            notes.append(f"The {s['role']} (engine #{engine.pk}) has no benchmark: benchmark it.")
        elif run.pk not in samples:
            notes.append(f"The {s['role']}'s run #{run.pk}: {NO_SAMPLES}.")
        if s["accuracy"] is None:
            notes.append(
                f"The {s['role']} (engine #{engine.pk}) is not evaluated: evaluate it on its page."
            )
    return notes


def comparison_figure(sides, samples, deltas):
    figure = make_subplots(
        rows=1,
        cols=3,
        column_widths=[0.5, 0.25, 0.25],
        subplot_titles=("Latency CDF", "Accuracy (points)", "Peak memory (MB)"),
    )
    for index, s in enumerate(sides):
        _add_side(figure, s, samples, "solid" if index == 0 else "dash")
    title = "Candidate against production"
    lines = [plain(line) for line in delta_lines(deltas)]
    figure.update_layout(
        title={"text": title + ("<br><sub>" + " · ".join(lines) + "</sub>" if lines else "")},
        height=440,
        **{**LAYOUT, "margin": {**LAYOUT["margin"], "t": 90}},
    )
    figure.update_xaxes(title_text="latency per query (ms)", row=1, col=1)
    figure.update_yaxes(title_text="share at or below", range=[0, 1.02], row=1, col=1)
    return figure


def _name(s):
    engine = s["engine"]
    return f"{s['role']}: engine #{engine.pk} {engine.backend}"


def _add_side(figure, s, samples, dash):
    run, engine, name = s["run"], s["engine"], _name(s)
    precision = run.precision if run else "fp32"
    colour, link = precision_colour(precision), engine.get_absolute_url()
    stable = run.stable if run else None
    if run is not None and run.pk in samples:
        x, y = cdf_points(samples[run.pk])
        line = {"shape": "hv", "color": colour, "dash": dash}
        figure.add_trace(go.Scatter(x=x, y=y, mode="lines", line=line, name=f"{name} CDF"), 1, 1)
        marks = percentile_marks(run)
        figure.add_trace(
            go.Scatter(
                x=[ms for _, ms, _ in marks],
                y=[share for _, _, share in marks],
                mode="markers",
                marker={
                    "size": 10,
                    "color": colour,
                    "symbol": marker_symbol(engine.backend, stable),
                },
                customdata=[link] * len(marks),
                name=f"{name} p50/p90/p99",
            ),
            1,
            1,
        )
    bar = {"marker": {"color": colour, "pattern": {"shape": "" if dash == "solid" else "/"}}}
    accuracy, memory = accuracy_value(s["accuracy"]), run.peak_memory_mb if run else None
    for column, value, what in ((2, accuracy, "accuracy"), (3, memory, "peak memory")):
        if value is not None:
            figure.add_trace(
                go.Bar(x=[s["role"]], y=[value], customdata=[link], name=f"{name} {what}", **bar),
                1,
                column,
            )
