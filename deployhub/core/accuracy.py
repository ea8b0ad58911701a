"""How an evaluation is judged, in its task's own terms: the one rule every page and auto mode use.

A run is judged on its task's labelled headline (mAP, mIoU, CER, top-1) when its dataset had
labels: the points lost against the FP32 source, in the metric's bad direction, against the
class's `drop`. Without labels, on its agreement headline with the source (detection F1, mask
IoU, exact strings, cosine, top-1 agreement) against the class's `agreement` floor (a ceiling
where lower is better). Plain values in, so stored runs and the figures' rows share it.
"""

import math
from typing import NamedTuple

from workers.tasks import DEFAULT_TOLERANCES, TASKS

CLASSIFICATION = "classification"


class Tolerance(NamedTuple):
    """A class's tolerance for one task: points of the labelled headline, an agreement bound,
    and a bound for each of the task's guards ({key: bound})."""

    drop: float | None
    agreement: float | None
    guards: dict = {}


def tolerance_for(task, accuracy_tolerance, overrides=None):
    """Return a class's tolerance for a task: its overrides on top of the defaults.

    A classifier's defaults are the class's accuracy_tolerance in top-1 points, and top-1
    agreement of at least 1 - that / 100, as before tasks had tolerances of their own.
    """
    if task == CLASSIFICATION:
        base = {"drop": accuracy_tolerance, "agreement": 1 - accuracy_tolerance / 100}
    else:
        base = dict(DEFAULT_TOLERANCES.get(task) or DEFAULT_TOLERANCES["generic"])
    base.update((overrides or {}).get(task) or {})
    guards = {guard.key: base.get(guard.key) for guard in task_of(task).guards}
    return Tolerance(base.get("drop"), base.get("agreement"), guards)


def task_of(name):
    """Return the registered task of a name; an unknown one (an old run) reads as generic."""
    return TASKS.get(name or CLASSIFICATION) or TASKS["generic"]


def labelled_value(metric, top1, figures):
    """Return one side's labelled headline of a run: top-1 from its column (top1) when the
    metric is top-1 (or unnamed: a run from before tasks), else from its stored figures."""
    if (metric or "top1") == "top1":
        return top1
    return (figures or {}).get(metric)


class LabelledFigures:
    """A run's labelled headline, source and engine, for stored runs and the figures' rows
    alike: each reads one side with _labelled("reference" | "engine") (labelled_value)."""

    def _labelled(self, which):
        raise NotImplementedError

    @property
    def reference_value(self):
        """The FP32 source's labelled headline (mAP, mIoU, CER, top-1); None without labels."""
        return self._labelled("reference")

    @property
    def engine_value(self):
        """The engine's labelled headline; None without labels."""
        return self._labelled("engine")

    @property
    def labelled(self):
        return self.reference_value is not None and self.engine_value is not None


def points_lost(task, before, after):
    """Return the labelled headline's change from source to candidate, in points, bad way up."""
    higher = task_of(task).labelled.higher_is_better
    return ((before - after) if higher else (after - before)) * 100


def breach(task, tolerance, *, before=None, after=None, agreement=None, agreements=None):
    """Say how a run falls outside a tolerance; '' when within.

    before and after are the labelled headline of the source and the candidate (None
    without labels); agreement is the agreement headline's value; agreements every
    agreement figure of the run, for the task's guards (judged with or without labels).
    """
    return _headline_breach(task, tolerance, before, after, agreement) or _guard_breach(
        task, tolerance, agreements or {}
    )


def _guard_breach(task, tolerance, agreements):
    for guard in task_of(task).guards:
        bound, value = tolerance.guards.get(guard.key), agreements.get(guard.key)
        if bound is None or value is None:
            continue
        if (value < bound) if guard.higher_is_better else (value > bound):
            way = "at least" if guard.higher_is_better else "at most"
            return f"{guard.label} is {value:.4g} (tolerance: {way} {bound:g})"
    return ""


def _headline_breach(task, tolerance, before, after, agreement):
    spec = task_of(task)
    if before is not None and after is not None and spec.labelled is not None:
        lost = points_lost(task, before, after)
        if tolerance.drop is None or lost <= tolerance.drop:
            return ""
        way = "below" if spec.labelled.higher_is_better else "above"
        return (
            f"{spec.labelled.label} {abs(lost):.2f} points {way} the FP32 reference "
            f"(tolerance {tolerance.drop:g})"
        )
    return _agreement_breach(spec, tolerance.agreement, agreement)


def _agreement_breach(spec, bound, value):
    if value is None:
        return f"no {spec.agreement.label} was measured"
    if bound is None:
        return ""
    higher = spec.agreement.higher_is_better
    if (value >= bound) if higher else (value <= bound):
        return ""
    if spec.name == CLASSIFICATION:
        return (
            f"top-1 agrees with the FP32 reference on {value:.1%} of samples "
            f"(tolerance: at least {bound:.1%})"
        )
    way = "at least" if higher else "at most"
    return f"{spec.agreement.label} is {value:.4g} (tolerance: {way} {bound:g})"


def score(task, *, after=None, agreement=None):
    """Return a run's accuracy as one number where higher is better, for ranking builds.

    The labelled headline when there is one, else the agreement headline; a lower-is-better
    figure (CER, pixel error) is negated.
    """
    spec = task_of(task)
    if after is not None and spec.labelled is not None:
        return after if spec.labelled.higher_is_better else -after
    if agreement is None:
        return None
    return agreement if spec.agreement.higher_is_better else -agreement


def headline_name(task, labelled):
    """Return the name of the figure a run is judged on ("mAP@0.5:0.95", "detection F1")."""
    spec = task_of(task)
    if labelled and spec.labelled is not None:
        return spec.labelled.label
    return spec.agreement.label


def describe_tolerance(task, tolerance):
    """Say a tolerance in words: "mAP@0.5:0.95 may lose at most 1 point against the FP32
    source; without labels, detection F1 vs FP32 at least 0.99"."""
    spec = task_of(task)
    parts = []
    if spec.labelled is not None and tolerance.drop is not None:
        parts.append(
            f"{spec.labelled.label} may lose at most {_points(tolerance.drop)} against the "
            "FP32 source"
        )
    if tolerance.agreement is not None:
        way = "at least" if spec.agreement.higher_is_better else "at most"
        lead = "without labels, " if parts else ""
        parts.append(f"{lead}{spec.agreement.label} {way} {tolerance.agreement:g}")
    for guard in spec.guards:
        if (bound := tolerance.guards.get(guard.key)) is not None:
            way = "at least" if guard.higher_is_better else "at most"
            parts.append(f"and {guard.label} {way} {bound:g}")
    return "; ".join(parts) or "no tolerance"


def _points(value):
    return f"{value:g} point" if value == 1 else f"{value:g} points"


def checked_overrides(overrides):
    """Return a class's per-task tolerances checked, or raise ValueError saying what is wrong.

    {task: {"drop": points >= 0, "agreement": a bound}}, known tasks and keys only.
    """
    if not isinstance(overrides, dict):
        raise ValueError('Tolerances per task are a JSON object: {"detection": {"drop": 1.0}}.')
    for task, values in overrides.items():
        if task not in TASKS:
            raise ValueError(f"{task!r} is not a task (tasks: {', '.join(sorted(TASKS))}).")
        keys = ["drop", "agreement", *(guard.key for guard in TASKS[task].guards)]
        if not isinstance(values, dict) or not set(values) <= set(keys):
            raise ValueError(f"{task}: give {_keys_text(keys)}.")
        for key, value in values.items():
            _check_bound(task, key, value)
    return overrides


def _keys_text(keys):
    named = {"drop": "points", "agreement": "bound"}
    return "{" + ", ".join(f'"{key}": {named.get(key, "bound")}' for key in keys) + "}"


def _check_bound(task, key, value):
    """Refuse a bound that is not a finite number of 0 or more (a fraction where it is one)."""
    finite = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not finite or value < 0:
        raise ValueError(f"{task}.{key} must be a finite number of 0 or more, not {value!r}.")
    if key == "agreement" and TASKS[task].agreement.higher_is_better and value > 1:
        raise ValueError(f"{task}.agreement is a share from 0 to 1, not {value!r}.")
