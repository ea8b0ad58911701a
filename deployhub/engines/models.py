"""Compiled engines, content-addressed and tied to the toolchain that built them."""

from django.conf import settings
from django.db import models
from django.db.models import F, Prefetch, Window
from django.db.models.functions import RowNumber
from django.urls import reverse
from django.utils.functional import cached_property

from deployhub.core import accuracy
from deployhub.core.choices import ChoiceSet
from deployhub.jobs.models import JobState


class EngineStatus(ChoiceSet):
    """Valid; stale (a device of the class changed and no longer runs it); revoked; or
    corrupt: its stored file no longer hashes to its sha256, found when the hub served it."""

    VALID = "valid"
    STALE = "stale"
    REVOKED = "revoked"
    CORRUPT = "corrupt"
    CHOICES = (
        (VALID, "Valid", "green"),
        (STALE, "Stale", "orange"),
        (REVOKED, "Revoked", "red"),
        (CORRUPT, "Corrupt", "purple"),
    )
    # The hub never hands these over, nor offers them as a build to run.
    UNSERVED = (REVOKED, CORRUPT)


NEWEST = ("-created_at", "-pk")


def _newest_per(runs, *fields):
    """The newest of the runs for each value of fields (a window: SQLite and PostgreSQL)."""
    order = [F(name[1:]).desc() if name.startswith("-") else F(name) for name in NEWEST]
    rank = Window(RowNumber(), partition_by=[F(name) for name in fields], order_by=order)
    return runs.annotate(newest_rank=rank).filter(newest_rank=1)


class EngineQuerySet(models.QuerySet):
    def for_version(self, version):
        return self.filter(model_version=version).select_related("device_class", "built_on")

    def with_gate_runs(self):
        """Load, newest first, the runs the release gates and flags read (engines/gates.py):
        three queries for a page of engines instead of several per engine.

        Only the runs a gate can read come: the newest evaluation of each engine, its newest
        check of each golden set and its newest benchmark on each class (the performance
        gate judges the newest on the engine's own class). A version's page read all its
        500 runs, with their sweeps and hosts, to judge 36 engines.
        """
        from deployhub.benchmarks.models import BenchmarkRun
        from deployhub.evaluation.models import AccuracyRun, GoldenRun

        runs = {
            "accuracy": _newest_per(AccuracyRun.objects.all(), "engine_id"),
            "golden_runs": _newest_per(
                GoldenRun.objects.select_related("golden_set"), "engine_id", "golden_set_id"
            ),
            "benchmarks": _newest_per(
                BenchmarkRun.objects.select_related("device_class"), "engine_id", "device_class_id"
            ),
        }
        return self.prefetch_related(
            *(
                Prefetch(name, queryset=query.order_by(*NEWEST), to_attr=f"newest_{name}")
                for name, query in runs.items()
            )
        )

    def runnable_by(self, device_class):
        """Engines built on the class, or on a class it trusts (a device's bytes stay on its
        class unless an admin said otherwise)."""
        return self.filter(
            device_class__in=device_class.builder_classes(), device_class__team=device_class.team_id
        )


class Engine(models.Model):
    """A compiled artifact of a model version for one backend, build config and toolchain."""

    model_version = models.ForeignKey(
        "registry.ModelVersion", on_delete=models.CASCADE, related_name="engines"
    )
    device_class = models.ForeignKey(
        "devices.DeviceClass", on_delete=models.CASCADE, related_name="engines"
    )
    backend = models.CharField(max_length=40)
    build_config = models.JSONField(default=dict)
    config_digest = models.CharField(max_length=64)
    compat_key = models.CharField(max_length=120)
    compat_fields = models.JSONField(default=dict)
    file = models.FileField(max_length=255)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    signature = models.CharField(max_length=128)
    fingerprint = models.JSONField(default=dict)
    tool_versions = models.JSONField(default=dict)
    build_seconds = models.FloatField(null=True)
    build_log = models.TextField(blank=True)
    graph_report = models.JSONField(
        default=dict, blank=True, help_text="Nodes and operators before and after the build."
    )
    built_on = models.ForeignKey(
        "devices.Device", null=True, on_delete=models.SET_NULL, related_name="engines_built"
    )
    job = models.ForeignKey("jobs.Job", null=True, on_delete=models.SET_NULL, related_name="+")
    status = models.CharField(
        max_length=20, choices=EngineStatus.choices(), default=EngineStatus.VALID
    )
    status_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = EngineQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # A corrupt engine is kept for its history and releases; building it again stores
            # a new one beside it.
            models.UniqueConstraint(
                fields=["model_version", "backend", "config_digest", "compat_key", "device_class"],
                condition=~models.Q(status="corrupt"),
                name="engine_unique_per_toolchain_and_class",
            )
        ]

    def __str__(self):
        return f"{self.backend} engine #{self.pk} of {self.model_version}"

    def get_absolute_url(self):
        return reverse("engine_detail", args=[self.pk])

    @property
    def team(self):
        return self.device_class.team

    @property
    def status_color(self):
        return EngineStatus.color(self.status)

    @cached_property
    def release_gates(self):
        """The engine's release gates on its class (deployhub/engines/gates.py)."""
        from deployhub.engines.gates import release_gates

        return release_gates(self)

    @property
    def open_gates(self):
        """How many of its release gates passed or have nothing to check."""
        return sum(gate.open for gate in self.release_gates)

    @property
    def quantised_nothing(self):
        """True for an int8 build whose graph has no quantised node: it runs in float, as fp32.

        Builds record "quantized_nodes" in their graph report (workers/backends/graph_report.py).
        """
        return (self.graph_report or {}).get("quantized_nodes") == 0

    @cached_property
    def accuracy_flags(self):
        """Say why the engine is not to be trusted, one reason each; [] when nothing is wrong.

        Its latest accuracy run outside its class's tolerance (AccuracyRun.tolerance_breach),
        or the latest check on any golden set of its version that failed. Every page that
        lists engines shows these (templates/engines/_flags.html).
        """
        from deployhub.engines.gates import newest
        from deployhub.registry.models import latest_per

        flags = []
        latest = next(iter(newest(self, "accuracy")), None)
        if latest and (breach := latest.tolerance_breach(self.device_class)):
            flags.append(f"outside the accuracy tolerance: {breach}")
        golden = latest_per(newest(self, "golden_runs"), "golden_set_id")
        return flags + [run.reason for run in golden if not run.passed]


class TimingCache(models.Model):
    """A TensorRT timing cache, handed to the next build on a matching device of the class."""

    device_class = models.ForeignKey(
        "devices.DeviceClass", on_delete=models.CASCADE, related_name="timing_caches"
    )
    compat_key = models.CharField(max_length=120)
    file = models.FileField(max_length=255)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["device_class", "compat_key"], name="one_timing_cache_per_key"
            )
        ]

    def __str__(self):
        return f"timing cache of {self.device_class} ({self.compat_key[:20]}…)"


class CalibrationCache(models.Model):
    """TensorRT INT8 scales for one model, dataset and TensorRT version, reused by later builds.

    The key is tensorrt_plan.calibration_fields made a compat key: the scales do
    not depend on the GPU, so the devices of that TensorRT version share them, within
    the class whose device computed them (and the classes that trust it): a device
    must not feed scales to another class's builds.
    """

    model_version = models.ForeignKey(
        "registry.ModelVersion", on_delete=models.CASCADE, related_name="calibration_caches"
    )
    device_class = models.ForeignKey(
        "devices.DeviceClass",
        null=True,
        on_delete=models.CASCADE,
        related_name="calibration_caches",
        help_text="The class whose device computed the scales (empty: from before classes kept "
        "their own, never served).",
    )
    dataset = models.ForeignKey("registry.Dataset", null=True, on_delete=models.SET_NULL)
    key = models.CharField(max_length=120)
    tensorrt_version = models.CharField(max_length=40)
    file = models.FileField(max_length=255)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["device_class", "key"], name="one_calibration_cache_per_class_and_key"
            )
        ]

    def __str__(self):
        return f"calibration cache of {self.model_version} (TensorRT {self.tensorrt_version})"


class AutoRunState(ChoiceSet):
    RUNNING = "running"
    DONE = "done"
    CHOICES = ((RUNNING, "Running", "blue"), (DONE, "Done", "green"))


class AutoOutcome(ChoiceSet):
    """What an auto run came to, derived from its builds: pages show this, not the bare state."""

    RUNNING = "running"
    RECOMMENDED = "recommended"
    OFF_GATE = "recommended_off_gate"
    NOTHING_ELIGIBLE = "nothing_eligible"
    ALL_FAILED = "all_failed"
    NOTHING_TRIED = "nothing_tried"
    CHOICES = (
        (RUNNING, "Running", "blue"),
        (RECOMMENDED, "Recommended a build", "green"),
        (OFF_GATE, "Recommended; the gate is not met", "orange"),
        (NOTHING_ELIGIBLE, "Nothing to recommend", "red"),
        (ALL_FAILED, "All builds failed", "red"),
        (NOTHING_TRIED, "No build could be tried", "red"),
    )


class AutoRun(models.Model):
    """Auto mode: a grid of builds of one version on one class, measured and ranked."""

    model_version = models.ForeignKey(
        "registry.ModelVersion", on_delete=models.CASCADE, related_name="auto_runs"
    )
    device_class = models.ForeignKey(
        "devices.DeviceClass", on_delete=models.CASCADE, related_name="auto_runs"
    )
    dataset = models.ForeignKey("registry.Dataset", null=True, on_delete=models.SET_NULL)
    state = models.CharField(
        max_length=20, choices=AutoRunState.choices(), default=AutoRunState.RUNNING
    )
    recommended = models.ForeignKey(
        "AutoBuild", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    summary = models.TextField(blank=True)
    compare_job = models.ForeignKey(
        "jobs.Job",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="auto_runs_compared",
        help_text="The side-by-side benchmark of the fastest eligible builds, if there was one.",
    )
    convert_job = models.ForeignKey(
        "jobs.Job",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The conversion of a source whose opset every backend found too old.",
    )
    converted_from = models.ForeignKey(
        "registry.ModelVersion",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="auto_runs_converted",
        help_text="The version the run was asked for, when it builds that version's conversion.",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"auto mode #{self.pk} for {self.model_version} on {self.device_class}"

    def get_absolute_url(self):
        return reverse("auto_run_detail", args=[self.pk])

    @property
    def task(self):
        """The task the builds are judged in: the version's declaration (a classifier's if none)."""
        return self.model_version.task.get("task") or accuracy.CLASSIFICATION

    @property
    def tolerance_text(self):
        """The class's tolerance for the version's task, in words (deployhub/core/accuracy.py)."""
        return accuracy.describe_tolerance(self.task, self.device_class.tolerance_for(self.task))

    @property
    def team(self):
        return self.device_class.team

    @property
    def state_color(self):
        return AutoRunState.color(self.state)

    @cached_property
    def outcome(self):
        """Return the AutoOutcome: recommended (meeting the gate or not), or why nothing was."""
        if self.state == AutoRunState.RUNNING:
            return AutoOutcome.RUNNING
        if self.recommended is not None:
            met = self.recommended.meets_budget
            return AutoOutcome.RECOMMENDED if met else AutoOutcome.OFF_GATE
        tried = self.tried_builds
        if not tried:
            return AutoOutcome.NOTHING_TRIED
        if all(build.error for build in tried):
            return AutoOutcome.ALL_FAILED
        return AutoOutcome.NOTHING_ELIGIBLE

    @property
    def outcome_label(self):
        """The outcome's label; a run whose builds all failed says how many did."""
        tried = len(self.tried_builds) if self.outcome == AutoOutcome.ALL_FAILED else 0
        if tried > 1:
            return f"All {tried} builds failed"
        return "The only build failed" if tried else AutoOutcome.label(self.outcome)

    @property
    def outcome_color(self):
        return AutoOutcome.color(self.outcome)

    @property
    def tried_builds(self):
        """The builds that were not skipped: a compile was asked for or the store had one."""
        return [build for build in self.builds.all() if not build.skipped]

    @property
    def failed_builds(self):
        return [build for build in self.tried_builds if build.error]


class AutoBuild(models.Model):
    """One build of an auto run: compiled, benchmarked and evaluated, or skipped with a reason."""

    auto_run = models.ForeignKey(AutoRun, on_delete=models.CASCADE, related_name="builds")
    backend = models.CharField(max_length=40)
    precision = models.CharField(max_length=10)
    build_config = models.JSONField(default=dict)
    skipped = models.TextField(blank=True, help_text="Why this build was not tried.")
    error = models.TextField(blank=True)
    compile_job = models.ForeignKey(
        "jobs.Job", null=True, on_delete=models.SET_NULL, related_name="+"
    )
    engine = models.ForeignKey(Engine, null=True, on_delete=models.SET_NULL, related_name="+")
    benchmark_job = models.ForeignKey(
        "jobs.Job", null=True, on_delete=models.SET_NULL, related_name="+"
    )
    evaluate_job = models.ForeignKey(
        "jobs.Job", null=True, on_delete=models.SET_NULL, related_name="+"
    )
    finished = models.BooleanField(default=False)
    pareto = models.BooleanField(default=False)
    meets_budget = models.BooleanField(null=True)
    within_tolerance = models.BooleanField(null=True)
    side_by_side_ms = models.FloatField(
        null=True,
        blank=True,
        help_text="Milliseconds per image in the run's side-by-side benchmark (its best round).",
    )

    class Meta:
        ordering = ["auto_run", "id"]

    def __str__(self):
        return f"{self.backend} {self.precision}"

    @property
    def benchmark(self):
        job = self.benchmark_job
        return getattr(job, "benchmark", None) if job else None

    @property
    def accuracy(self):
        job = self.evaluate_job
        return getattr(job, "accuracy", None) if job else None

    @property
    def golden(self):
        """The golden-pairs check of this build's evaluation, if it had one."""
        job = self.evaluate_job
        return getattr(job, "golden_run", None) if job else None

    @property
    def failed_jobs(self):
        """Return the build's jobs that ended without success, in the order they ran."""
        jobs = (self.compile_job, self.benchmark_job, self.evaluate_job)
        return [job for job in jobs if job and job.is_final and job.state != JobState.SUCCEEDED]

    @property
    def failed_job(self):
        return next(iter(self.failed_jobs), None)

    @property
    def failure_label(self):
        """Say how the build failed: the worker's failure category, else which job ended how."""
        if not self.error:
            return ""
        job = self.failed_job
        if job is None:
            return "Build failed"
        return job.failure_label or f"{job.get_kind_display()} {job.get_state_display().lower()}"

    @property
    def recommendation_note(self):
        """Say why the recommended build is not a clean pass of the gate; '' when it is one."""
        if self.meets_budget:
            return ""
        if self.meets_budget is False:
            return "fastest, misses the budget"
        benchmark = self.benchmark
        if benchmark is not None and benchmark.stable is False:
            return "fastest; unstable run"
        return "fastest; the gate could not judge it"
