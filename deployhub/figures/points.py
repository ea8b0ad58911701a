"""One point per engine: its latest benchmark and evaluation on its class, in a few queries.

Every figure of a model reads these points: the explorer, the fleet view, the version
trend and the model page. The queries aggregate in the database (the latest run per
engine) and read `.values()`, so their number does not grow with the number of runs.
"""

from dataclasses import dataclass, field

from django.db.models import F, Max, Q
from django.urls import reverse

from deployhub.benchmarks.gates import WIDE_MARGIN
from deployhub.benchmarks.models import PRECISION_NAMES, BenchmarkRun, Scenario
from deployhub.core import accuracy
from deployhub.devices.models import DeviceClass, ServingPattern
from deployhub.engines.models import Engine
from deployhub.evaluation.models import AccuracyRun
from deployhub.releases.models import Release, ReleaseState

BENCHMARK_FIELDS = (
    "id",
    "engine_id",
    "scenario",
    "batch_size",
    "latency_p50_ms",
    "latency_p99_ms",
    "server_p99_ms",
    "throughput_ips",
    "offline_throughput_ips",
    "stable",
    "peak_rss_mb",
    "peak_device_memory_mb",
)
ACCURACY_FIELDS = (
    "id",
    "engine_id",
    "top1",
    "reference_top1",
    "top1_agreement",
    "samples",
    "task",
    "agreement",
    "details__metric",
    "details__reference",
    "details__engine",
    "details__agreement",
)
ENGINE_FIELDS = (
    "id",
    "backend",
    "build_config",
    "tool_versions",
    "status",
    "device_class_id",
    "model_version_id",
    "model_version__number",
)


def precision_of_config(config):
    """Return a build config's precision by one name for all backends (fp32 when unset)."""
    precision = (config or {}).get("precision") or "fp32"
    return PRECISION_NAMES.get(precision, precision)


@dataclass
class Point(accuracy.LabelledFigures):
    """An engine and the figures of its latest benchmark and evaluation on its class."""

    engine_id: int
    version: int
    backend: str
    precision: str
    build_config: dict
    tool_versions: dict
    device_class: DeviceClass
    benchmark: dict | None = None
    accuracy: dict | None = None
    production: bool = False
    pareto: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def url(self):
        return reverse("engine_detail", args=[self.engine_id])

    @property
    def batch(self):
        return self.benchmark["batch_size"] if self.benchmark else None

    @property
    def p99_ms(self):
        """The p99 a real-time gate judges: the server run's when there is one."""
        run = self.benchmark
        if run is None:
            return None
        if run["scenario"] == Scenario.SERVER and run["server_p99_ms"] is not None:
            return run["server_p99_ms"]
        return run["latency_p99_ms"]

    @property
    def throughput(self):
        """Sustained images/s (an offline run's when there is one), which a batch gate judges."""
        run = self.benchmark
        if run is None:
            return None
        offline = run["scenario"] == Scenario.OFFLINE and run["offline_throughput_ips"]
        return offline or run["throughput_ips"]

    @property
    def latency_ms(self):
        """The explorer's x: p99 for a real-time class, ms per image for a batch class."""
        if self.benchmark is None:
            return None
        if self.device_class.is_batch:
            return 1000.0 / self.throughput if self.throughput else None
        return self.p99_ms

    @property
    def figure(self):
        """The fleet's figure: fps at p99 (batch × 1000 / p99), or sustained throughput."""
        if self.benchmark is None:
            return None
        if self.device_class.is_batch:
            return self.throughput
        return self.batch * 1000.0 / self.p99_ms if self.p99_ms else None

    @property
    def memory_mb(self):
        """Peak device memory where it was measured, else the process's peak resident memory."""
        run = self.benchmark or {}
        return run.get("peak_device_memory_mb") or run.get("peak_rss_mb")

    @property
    def memory_kind(self):
        return "device" if (self.benchmark or {}).get("peak_device_memory_mb") else "host"

    @property
    def stable(self):
        return (self.benchmark or {}).get("stable")

    @property
    def top1(self):
        return (self.accuracy or {}).get("top1")

    @property
    def task(self):
        return (self.accuracy or {}).get("task") or accuracy.CLASSIFICATION

    @property
    def agreement(self):
        """The task's headline agreement with the FP32 source (top-1 agreement, F1, cosine)."""
        run = self.accuracy or {}
        return (
            run.get("agreement") if run.get("agreement") is not None else run.get("top1_agreement")
        )

    def _labelled(self, which):
        run = self.accuracy or {}
        top1 = run.get("reference_top1" if which == "reference" else "top1")
        return accuracy.labelled_value(
            run.get("details__metric"), top1, run.get(f"details__{which}")
        )

    def meets_budget(self):
        """Whether the latest benchmark meets the class's gate (as BenchmarkRun.gate judges)."""
        dc, run = self.device_class, self.benchmark
        if run is None:
            return False
        margin = 1.0 if self.stable is not False else WIDE_MARGIN
        if dc.is_batch:
            target, ceiling = dc.throughput_target_ips, dc.batch_latency_ceiling_ms
            fast = bool(target) and self.throughput >= target * margin
            fast = fast and (not ceiling or run["latency_p99_ms"] * margin <= ceiling)
        else:
            fast = (
                run["scenario"] != Scenario.OFFLINE and self.p99_ms * margin <= dc.frame_budget_ms
            )
        memory = self.memory_mb
        return fast and (not dc.memory_limit_mb or memory is None or memory <= dc.memory_limit_mb)

    def within_tolerance(self):
        """Whether the latest evaluation is within the class's tolerance for its task, as
        AccuracyRun.tolerance_breach says (deployhub/core/accuracy.py)."""
        if self.accuracy is None:
            return False
        return not accuracy.breach(
            self.task,
            self.device_class.tolerance_for(self.task),
            before=self.reference_value,
            after=self.engine_value,
            agreement=self.agreement,
            agreements=(self.accuracy or {}).get("details__agreement"),
        )


def _latest_ids(runs):
    """Return the ids of the latest run of each engine among `runs` (one aggregate query)."""
    return list(runs.values("engine_id").annotate(last=Max("id")).values_list("last", flat=True))


def _benchmarks(engines):
    """The latest run of each engine on its own class (no Offline run for a real-time class)."""
    runs = BenchmarkRun.objects.filter(engine__in=engines, device_class=F("engine__device_class"))
    runs = runs.filter(
        Q(device_class__serving_pattern=ServingPattern.BATCH) | ~Q(scenario=Scenario.OFFLINE)
    )
    latest = BenchmarkRun.objects.filter(id__in=_latest_ids(runs)).values(*BENCHMARK_FIELDS)
    return {run["engine_id"]: run for run in latest}


def _accuracies(engines):
    """The latest evaluation of each engine, the one its accuracy gate reads."""
    ids = _latest_ids(AccuracyRun.objects.filter(engine__in=engines))
    latest = AccuracyRun.objects.filter(id__in=ids).values(*ACCURACY_FIELDS)
    return {run["engine_id"]: run for run in latest}


def _production(model):
    """Return the ids of the model's production engines, one per class at most."""
    releases = Release.objects.filter(model=model, state=ReleaseState.PRODUCTION)
    return set(releases.values_list("engine_id", flat=True))


def load_points(model, engines=None):
    """Return a Point for every engine of the model (or of `engines`, a filtered queryset).

    Seven queries, whatever the number of engines and runs.
    """
    engines = Engine.objects.filter(model_version__model=model) if engines is None else engines
    rows = list(engines.values(*ENGINE_FIELDS))
    classes = DeviceClass.objects.in_bulk({row["device_class_id"] for row in rows})
    benchmarks, accuracies = _benchmarks(engines), _accuracies(engines)
    production = _production(model)
    return [
        Point(
            engine_id=row["id"],
            version=row["model_version__number"],
            backend=row["backend"],
            precision=precision_of_config(row["build_config"]),
            build_config=row["build_config"] or {},
            tool_versions=row["tool_versions"] or {},
            device_class=classes[row["device_class_id"]],
            benchmark=benchmarks.get(row["id"]),
            accuracy=accuracies.get(row["id"]),
            production=row["id"] in production,
        )
        for row in rows
    ]
