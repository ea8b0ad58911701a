"""Benchmark results with the conditions they were measured under.

The worker's result JSON is read in results.py and the budget gate a run faces is judged in
gates.py: this module keeps the models, their queries and what a page shows of a run.
"""

import binascii
import functools

import numpy as np
from django.db import models
from django.db.models import Case, F, When
from django.db.models.functions import Coalesce
from django.urls import get_script_prefix, reverse

from deployhub.benchmarks.gates import budget_verdict
from deployhub.benchmarks.results import run_fields, sample_fields
from deployhub.benchmarks.scenarios import Scenario
from deployhub.core.choices import ChoiceSet
from deployhub.jobs.errors import ResultRejected


class Stability(ChoiceSet):
    """Whether the worker found the latencies steady enough to trust."""

    STABLE = "stable"
    UNSTABLE = "unstable"
    UNCHECKED = "unchecked"
    CHOICES = (
        (STABLE, "Stable", "green"),
        (UNSTABLE, "Unstable", "orange"),
        (UNCHECKED, "Not checked", "grey"),
    )


class BenchmarkRunQuerySet(models.QuerySet):
    def for_version(self, version):
        """Runs of the version, sharing its few devices, classes and engines (as for_model)."""
        runs = list(
            self.filter(model_version=version).prefetch_related("device", "device_class", "engine")
        )
        for run in runs:  # the page links each run to its version: not a query per run
            run.model_version = version
        return flag_int8_slowdowns(runs)

    def latest_of_version(self, version, count):
        """The version's latest `count` runs, newest first, flagged against all its runs (an
        INT8 run slower than an FP32 one of its class and batch), and how many it has.

        Only the latest are read whole: the flags need four fields of the others, and a
        version with hundreds of runs spent most of its page decoding what it did not show.
        """
        newest_first = ("-created_at", "-pk")
        every = list(
            self.filter(model_version=version)
            .order_by(*newest_first)
            .only(*FLAGGED_BY, "created_at")
            .prefetch_related("engine")
        )
        flags = {run.pk: run.int8_slower_than for run in flag_int8_slowdowns(every)[:count]}
        latest = list(
            self.filter(pk__in=flags)
            .order_by(*newest_first)
            .prefetch_related("device", "device_class", "engine")
        )
        for run in latest:
            run.model_version = version  # the page links each run to its version: no query
            run.int8_slower_than = flags[run.pk]
        return latest, len(every)

    def for_model(self, model):
        """Runs of every version of the model, oldest version first.

        A model's results JSON, CSV and report read a thousand runs of a few versions,
        classes, devices and engines: each of those is read once and shared by its runs (a
        join per run decoded the same version's graph a thousand times). The job is not
        read: a run links to it by its id.
        """
        runs = self.filter(model_version__model=model).prefetch_related(
            "model_version", "device", "device_class", "engine"
        )
        return flag_int8_slowdowns(list(runs.order_by("model_version__number", "created_at")))

    def latency_runs(self):
        """Runs that measure per-query latency (single-stream and server, not offline)."""
        return self.exclude(scenario=Scenario.OFFLINE).annotate(
            gate_p99=Coalesce("server_p99_ms", "latency_p99_ms")
        )

    def within_budget(self, budget_ms):
        """Latency runs whose deciding p99 is within `budget_ms`."""
        return self.latency_runs().filter(gate_p99__lte=budget_ms)

    def sustaining(self, images_per_s):
        """Runs whose sustained throughput (gate_throughput_ips) reaches `images_per_s`."""
        offline = When(
            scenario=Scenario.OFFLINE,
            offline_throughput_ips__isnull=False,
            then=F("offline_throughput_ips"),
        )
        sustained = Case(offline, default=F("throughput_ips"))
        return self.annotate(sustained=sustained).filter(sustained__gte=images_per_s)


# Backends name some precisions their own way (OpenVINO says f32): compare them as one.
PRECISION_NAMES = {"f32": "fp32", "f16": "fp16"}


def engine_precision(engine):
    """Return an engine's precision by one name for all backends (fp32 when unset)."""
    precision = (engine.build_config.get("precision") if engine else None) or "fp32"
    return PRECISION_NAMES.get(precision, precision)


def precision_of(run):
    """Return the precision a run measured: its engine's, else the source model's fp32."""
    return engine_precision(run.engine)


def job_url(job_id):
    """A job page's URL (see url_with_id)."""
    return url_with_id("job_detail", job_id)


def url_with_id(name, pk):
    """The URL `name` takes with one id: reverse() once per name and script prefix, then the
    id put in its place (a thousand reverse() calls were a third of a model's results JSON)."""
    before, after = _url_around_id(name, get_script_prefix())
    return f"{before}{pk}{after}"


_ID_SLOT = 987654321


@functools.lru_cache(maxsize=64)
def _url_around_id(name, script_prefix):
    # script_prefix keys the cache: reverse() reads the thread's prefix, which it is.
    before, after = reverse(name, args=[_ID_SLOT]).rsplit(str(_ID_SLOT), 1)
    return before, after


# What flag_int8_slowdowns reads of each run.
FLAGGED_BY = ("device_class_id", "batch_size", "latency_p50_ms", "engine_id")


def flag_int8_slowdowns(runs):
    """Mark INT8 runs slower than an FP32 run of the same class and batch (int8_slower_than)."""
    fastest_fp32 = {}
    for run in runs:
        if precision_of(run) == "fp32":
            key = (run.device_class_id, run.batch_size)
            fastest_fp32[key] = min(fastest_fp32.get(key, run.latency_p50_ms), run.latency_p50_ms)
    for run in runs:
        reference = fastest_fp32.get((run.device_class_id, run.batch_size))
        slower = precision_of(run) == "int8" and reference and run.latency_p50_ms > reference
        run.int8_slower_than = reference if slower else None
    return runs


def flag_int8_slowdowns_in_version(runs):
    """Mark runs of one version as flag_int8_slowdowns marks them among all the version's runs
    (the version page's rule), for a page that shows only some (a job's run, an engine's runs,
    a run's details). The version's FP32 runs are read, once, only when an INT8 run is there.
    """
    runs = list(runs)
    for run in runs:
        run.int8_slower_than = None
    int8 = [run for run in runs if precision_of(run) == "int8"]
    if not int8:
        return runs
    [version_id] = {run.model_version_id for run in runs}
    peers = BenchmarkRun.objects.filter(
        model_version_id=version_id,
        device_class_id__in={run.device_class_id for run in int8},
        batch_size__in={run.batch_size for run in int8},
    )
    peers = peers.select_related("engine").only(*FLAGGED_BY, "engine__build_config")
    flags = {peer.pk: peer.int8_slower_than for peer in flag_int8_slowdowns(list(peers))}
    for run in int8:
        run.int8_slower_than = flags.get(run.pk)
    return runs


class BenchmarkRun(models.Model):
    """Latency and throughput of one model version on one device, and how they were taken."""

    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="benchmark")
    model_version = models.ForeignKey(
        "registry.ModelVersion", on_delete=models.CASCADE, related_name="benchmarks"
    )
    device_class = models.ForeignKey("devices.DeviceClass", on_delete=models.CASCADE)
    device = models.ForeignKey("devices.Device", null=True, on_delete=models.SET_NULL)
    engine = models.ForeignKey(
        "engines.Engine",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="benchmarks",
    )
    backend = models.CharField(max_length=40)
    provider = models.CharField(max_length=60, blank=True)
    scenario = models.CharField(
        max_length=20, choices=Scenario.choices(), default=Scenario.SINGLE_STREAM
    )
    batch_size = models.PositiveIntegerField()
    warmup_iterations = models.PositiveIntegerField()
    iterations = models.PositiveIntegerField()
    warmup_s = models.FloatField(null=True, blank=True)
    duration_s = models.FloatField(null=True, blank=True)
    intra_op_threads = models.PositiveIntegerField(default=0)
    latency_min_ms = models.FloatField()
    latency_p50_ms = models.FloatField()
    latency_p90_ms = models.FloatField()
    latency_p95_ms = models.FloatField()
    latency_p99_ms = models.FloatField()
    latency_max_ms = models.FloatField()
    latency_mean_ms = models.FloatField()
    latency_std_ms = models.FloatField()
    throughput_ips = models.FloatField()
    cv = models.FloatField(null=True, blank=True, help_text="std / mean of the latencies.")
    stable = models.BooleanField(null=True, help_text="Null when the worker did not check.")
    drift = models.FloatField(null=True, blank=True)
    stability = models.JSONField(default=dict, blank=True, help_text="reasons, windows_p50_ms.")
    server = models.JSONField(null=True, blank=True, help_text="The server scenario's block.")
    server_target_qps = models.FloatField(null=True, blank=True)
    server_achieved_qps = models.FloatField(null=True, blank=True)
    server_p99_ms = models.FloatField(null=True, blank=True)
    max_qps_in_budget = models.FloatField(null=True, blank=True)
    offline_samples = models.PositiveIntegerField(null=True, blank=True)
    offline_wall_s = models.FloatField(null=True, blank=True)
    offline_throughput_ips = models.FloatField(null=True, blank=True)
    batch_sweep = models.JSONField(default=list, blank=True)
    peak_rss_mb = models.FloatField(null=True)
    rss_growth_mb = models.FloatField(null=True)
    peak_device_memory_mb = models.FloatField(null=True, blank=True)
    gpu = models.JSONField(null=True, blank=True)
    host = models.JSONField(default=dict, blank=True)
    host_cpu_model = models.CharField(max_length=200, blank=True)
    host_logical_cpus = models.PositiveIntegerField(null=True, blank=True)
    fingerprint = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = BenchmarkRunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.model_version} on {self.device_class}: p50 {self.latency_p50_ms:.2f} ms"

    @classmethod
    def record(cls, job, result):
        """Store a worker's benchmark result for `job`; raise ValueError if it is malformed."""
        fields = run_fields(result)
        samples = LatencySamples.read(result.get("latency_samples"), fields["iterations"])
        run = cls.objects.create(
            job=job,
            model_version=job.model_version,
            device_class=job.device_class,
            device=job.device,
            engine=job.engine,
            **fields,
        )
        if samples is not None:
            samples.run = run
            samples.save()
        return run

    def samples_ms(self):
        """Return the run's stored latencies in ms (numpy array, measured order), or None.

        None for a run measured before samples were kept (NO_SAMPLES says what to do).
        """
        try:
            return self.latency_samples.samples_ms()
        except LatencySamples.DoesNotExist:
            return None

    @property
    def precision(self):
        return precision_of(self)

    @property
    def fps_at_p99(self):
        """Frames per second one stream sustains with 99% of its frames on time.

        batch × 1000 / the p99 a real-time gate judges (gate_p99_ms): 1000 / p99 ms at
        batch 1. Shown as "fps at p99"; no page shows an fps taken from p50.
        """
        p99 = self.gate_p99_ms
        return self.batch_size * 1000.0 / p99 if p99 else None

    @property
    def scenario_label(self):
        return Scenario.label(self.scenario)

    @property
    def scenario_color(self):
        return Scenario.color(self.scenario)

    @property
    def scenario_help(self):
        return Scenario.HELP.get(self.scenario, "")

    @property
    def gate_p99_ms(self):
        """The p99 that decides a real-time gate: the server run's when there is one."""
        if self.scenario == Scenario.SERVER and self.server_p99_ms is not None:
            return self.server_p99_ms
        return self.latency_p99_ms

    @property
    def gate_throughput_ips(self):
        """Sustained throughput: the images/s the run achieved, which decides a batch gate.

        The offline run's (samples / wall time) when there is one, else the worker's
        batch × 1000 / mean latency of its timed runs. Shown as "sustained throughput".
        """
        if self.scenario == Scenario.OFFLINE and self.offline_throughput_ips is not None:
            return self.offline_throughput_ips
        return self.throughput_ips

    @property
    def peak_memory_mb(self):
        """Peak device memory on a GPU, else the process's peak resident memory."""
        return self.peak_device_memory_mb if self.gpu else self.peak_rss_mb

    @property
    def sweep_rows(self):
        """The batch sweep by batch size, each row with its median milliseconds per image."""
        rows = sorted((dict(row) for row in self.batch_sweep or []), key=lambda r: r["batch_size"])
        for row in rows:
            p50 = (row.get("latency_ms") or {}).get("p50")
            row["per_image_ms"] = p50 / row["batch_size"] if p50 is not None else None
        return rows

    @property
    def stability_state(self):
        if self.stable is None:
            return Stability.UNCHECKED
        return Stability.STABLE if self.stable else Stability.UNSTABLE

    @property
    def stability_label(self):
        return Stability.label(self.stability_state)

    @property
    def stability_color(self):
        return Stability.color(self.stability_state)

    @property
    def stability_reasons(self):
        return (self.stability or {}).get("reasons") or []

    @property
    def cv_core(self):
        """std / mean of the runs at or below p99, which the stability verdict judges."""
        return (self.stability or {}).get("cv_core")

    @property
    def job_url(self):
        """The page of the job that measured the run (from its id: the job is not read)."""
        return job_url(self.job_id)

    @property
    def details_url(self):
        """The run's details (percentiles, stability, conditions), which a page loads when
        they are opened."""
        return url_with_id("benchmark_run_details", self.pk)

    def gate(self):
        """Judge the run against its device class's budget (see benchmarks/gates.py)."""
        return budget_verdict(self)


NO_SAMPLES = (
    "no samples stored for this run (measured before samples were kept): run the benchmark again"
)


class LatencySamples(models.Model):
    """The per-query latencies of one run's single-stream measurement, kept compactly.

    At most SAMPLES_KEPT float32 milliseconds (evenly thinned in measured order by the
    worker), in a table of their own so that no list of runs loads them by accident.
    """

    run = models.OneToOneField(
        BenchmarkRun, on_delete=models.CASCADE, primary_key=True, related_name="latency_samples"
    )
    data = models.BinaryField(help_text="little-endian float32 milliseconds, measured order")
    count = models.PositiveIntegerField(help_text="samples stored")
    measured = models.PositiveIntegerField(help_text="runs measured (count or more)")

    def __str__(self):
        return f"{self.count} of {self.measured} samples of run {self.run_id}"

    def samples_ms(self):
        """Return the stored latencies in ms as a float64 numpy array, in measured order."""
        return np.frombuffer(bytes(self.data), dtype="<f4").astype(np.float64)

    @classmethod
    def read(cls, block, iterations):
        """Return unsaved samples from a result's latency_samples block (None when absent).

        Raise ResultRejected, saying what is wrong, for anything the protocol does not allow:
        the job then fails and nothing is stored.
        """
        if block is None:
            return None
        try:
            data, count, measured = sample_fields(block, iterations)
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise ResultRejected(f"latency_samples refused: {exc}") from None
        return cls(data=data, count=count, measured=measured)
