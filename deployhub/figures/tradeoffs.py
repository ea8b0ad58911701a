"""The trade-off explorer: accuracy against latency, memory as size, one facet per device class.

x is the latency the class's gate judges (p99 for a real-time class, milliseconds per
image at the measured batch for a batch class; log scale), y the accuracy in the task's
headline (mAP, mIoU, CER, top-1 with labels; else agreement with the FP32 source: detection
F1, mask IoU, exact strings, cosine, top-1 agreement), marker size the peak memory. The
Pareto frontier over the three is marked, the frame budget is a vertical line, the
accuracy tolerance a band, the production engine is ringed.
"""

from collections import Counter
from dataclasses import dataclass, field

from django.http import QueryDict

from deployhub.core import accuracy
from deployhub.engines.models import Engine
from deployhub.figures.pareto import pareto_front
from deployhub.figures.points import load_points

# The precisions a filter offers, by their one name across backends.
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
NO_ENGINE = "No engine yet: compile one or start auto mode on a version's page."
NO_BENCHMARK = "{n} engine(s) have no benchmark yet: run one on the engine page ({names})."
NO_ACCURACY = (
    "{n} engine(s) have no accuracy run yet: run an evaluation on the engine page ({names})."
)


@dataclass
class Filters:
    """What the explorer shows, read from the URL so that a view can be shared."""

    classes: list = field(default_factory=list)
    backends: list = field(default_factory=list)
    precisions: list = field(default_factory=list)
    vmin: int | None = None
    vmax: int | None = None

    @classmethod
    def from_query(cls, query: QueryDict):
        """Read ?class=&backend=&precision=&vmin=&vmax=; raise ValueError on a bad version."""
        return cls(
            classes=[v for v in query.getlist("class") if v],
            backends=[v for v in query.getlist("backend") if v],
            precisions=[v for v in query.getlist("precision") if v],
            vmin=_version(query, "vmin"),
            vmax=_version(query, "vmax"),
        )

    def engines(self, model):
        """The model's engines these filters keep (precision is kept in keep())."""
        engines = Engine.objects.filter(model_version__model=model)
        if self.classes:
            engines = engines.filter(device_class__slug__in=self.classes)
        if self.backends:
            engines = engines.filter(backend__in=self.backends)
        if self.vmin is not None:
            engines = engines.filter(model_version__number__gte=self.vmin)
        if self.vmax is not None:
            engines = engines.filter(model_version__number__lte=self.vmax)
        return engines

    def keep(self, point):
        return not self.precisions or point.precision in self.precisions

    def keeps_run(self, run):
        """Whether a benchmark run passes every filter (for views that choose runs by id)."""
        number = run.model_version.number
        return (
            (not self.classes or run.device_class.slug in self.classes)
            and (not self.backends or run.backend in self.backends)
            and self.keep(run)
            and (self.vmin is None or number >= self.vmin)
            and (self.vmax is None or number <= self.vmax)
        )

    def split_runs(self, runs):
        """Return (the runs the filters keep, a note naming those they hide, if any)."""
        kept = [run for run in runs if self.keeps_run(run)]
        hidden = [f"#{run.pk}" for run in runs if run not in kept]
        if not hidden:
            return kept, []
        note = f"Hidden by the filters: run {', '.join(hidden)}. Clear a filter to show it."
        return kept, [note]


def _version(query, name):
    value = (query.get(name) or "").strip().lstrip("v")
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"{name} must be a version number, like 3 (got {query.get(name)!r}).")
    return int(value)


@dataclass
class Facet:
    """One device class's part of the explorer: its points and where its budget lies."""

    device_class: object
    points: list
    accuracy_kind: str  # "labelled" (the task's headline on labels) or "agreement" (vs FP32)

    @property
    def task(self):
        """The task the points are judged in (a model's engines share their version's task)."""
        tasks = Counter(point.task for point in self.points)
        return tasks.most_common(1)[0][0] if tasks else accuracy.CLASSIFICATION

    @property
    def title(self):
        """The y axis: the task's headline by name ("mAP@0.5:0.95", "detection F1 vs FP32")."""
        return accuracy.headline_name(self.task, self.accuracy_kind == "labelled")

    @property
    def budget_ms(self):
        """The frame budget; for a batch class, the ms per image its throughput target allows."""
        dc = self.device_class
        if dc.is_batch:
            return 1000.0 / dc.throughput_target_ips if dc.throughput_target_ips else None
        return dc.frame_budget_ms

    @property
    def band(self):
        """(low, high) of the accuracy the class's tolerance accepts, on this facet's y."""
        tolerance = self.device_class.tolerance_for(self.task)
        spec = accuracy.task_of(self.task)
        if self.accuracy_kind == "agreement":
            bound = tolerance.agreement
            if bound is None:
                return None
            return (bound, 1.0) if spec.agreement.higher_is_better else (0.0, bound)
        references = [p.reference_value for p in self.points if p.reference_value is not None]
        if not references or tolerance.drop is None:
            return None
        if spec.labelled.higher_is_better:
            reference = max(references)
            return (reference - tolerance.drop / 100, reference)
        reference = min(references)
        return (reference, reference + tolerance.drop / 100)

    @property
    def tolerance_text(self):
        """The band in words: "mAP drop ≤ 1 pt", "F1 ≥ 0.99"."""
        tolerance = self.device_class.tolerance_for(self.task)
        spec = accuracy.task_of(self.task)
        if self.accuracy_kind == "labelled" and tolerance.drop is not None:
            return f"{spec.labelled.key} drop ≤ {tolerance.drop:g} pt"
        if tolerance.agreement is None:
            return "no tolerance"
        way = "≥" if spec.agreement.higher_is_better else "≤"
        return f"{spec.agreement.key} {way} {tolerance.agreement:g}"

    def accuracy(self, point):
        """The point's y: its labelled headline, or its agreement with the FP32 source."""
        return point.engine_value if self.accuracy_kind == "labelled" else point.agreement

    def score(self, point):
        """The point's y with higher better, for the Pareto front (a CER is negated)."""
        value = self.accuracy(point)
        if self.accuracy_kind == "labelled":
            return accuracy.score(self.task, after=value)
        return accuracy.score(self.task, agreement=value)


def make_facet(device_class, points):
    """Return the class's facet, its Pareto points marked (point.pareto)."""
    labelled = all(p.labelled for p in points) and points
    facet = Facet(device_class, points, "labelled" if labelled else "agreement")
    axes = [(p.latency_ms, facet.score(p), p.memory_mb) for p in points]
    front = set(pareto_front(axes))
    for index, point in enumerate(points):
        point.pareto = index in front
    return facet


@dataclass
class Explorer:
    facets: list
    notes: list

    @property
    def points(self):
        return [point for facet in self.facets for point in facet.points]


def _names(points, limit=3):
    names = [f"v{p.version} {p.backend} {p.precision} #{p.engine_id}" for p in points[:limit]]
    return ", ".join(names) + (", …" if len(points) > limit else "")


def explore(model, filters=None):
    """Return the explorer's facets (classes with something to plot) and its notes."""
    filters = filters or Filters()
    points = [p for p in load_points(model, filters.engines(model)) if filters.keep(p)]
    notes = [] if points else [NO_ENGINE]
    unmeasured = [p for p in points if p.latency_ms is None]
    unevaluated = [p for p in points if p.latency_ms is not None and p.accuracy is None]
    if unmeasured:
        notes.append(NO_BENCHMARK.format(n=len(unmeasured), names=_names(unmeasured)))
    if unevaluated:
        notes.append(NO_ACCURACY.format(n=len(unevaluated), names=_names(unevaluated)))
    plotted = [p for p in points if p.latency_ms is not None and p.accuracy is not None]
    by_class = {}
    for point in plotted:
        by_class.setdefault(point.device_class, []).append(point)
    facets = [make_facet(dc, by_class[dc]) for dc in sorted(by_class, key=lambda c: c.slug)]
    return Explorer(facets, notes)
