"""Benchmark results with the conditions they were measured under."""

from django.db import models

from deployhub.choices import ChoiceSet

PERCENTILES = ("min", "p50", "p90", "p95", "p99", "max", "mean", "std")


class BudgetVerdict(ChoiceSet):
    MEETS = "meets"
    MISSES = "misses"
    CHOICES = ((MEETS, "Meets budget", "green"), (MISSES, "Over budget", "red"))


class BenchmarkRunQuerySet(models.QuerySet):
    def for_version(self, version):
        runs = self.filter(model_version=version).select_related(
            "device", "device_class", "job", "engine"
        )
        return flag_int8_slowdowns(list(runs))


def precision_of(run):
    """Return the precision a run measured: its engine's, else the source model's fp32."""
    return (run.engine.build_config.get("precision") if run.engine else None) or "fp32"


def flag_int8_slowdowns(runs):
    """Mark INT8 runs slower than an FP32 run of the same class and batch (int8_slower_than)."""
    fastest_fp32 = {}
    for run in runs:
        if precision_of(run) in ("fp32", "f32"):
            key = (run.device_class_id, run.batch_size)
            fastest_fp32[key] = min(fastest_fp32.get(key, run.latency_p50_ms), run.latency_p50_ms)
    for run in runs:
        reference = fastest_fp32.get((run.device_class_id, run.batch_size))
        slower = precision_of(run) == "int8" and reference and run.latency_p50_ms > reference
        run.int8_slower_than = reference if slower else None
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
    batch_size = models.PositiveIntegerField()
    warmup_iterations = models.PositiveIntegerField()
    iterations = models.PositiveIntegerField()
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
    peak_rss_mb = models.FloatField(null=True)
    rss_growth_mb = models.FloatField(null=True)
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
        try:
            latency = result["latency_ms"]
            return cls.objects.create(
                job=job,
                model_version=job.model_version,
                device_class=job.device_class,
                device=job.device,
                engine=job.engine,
                backend=str(result["backend"]),
                provider=str(result.get("provider", "")),
                batch_size=int(result["batch_size"]),
                warmup_iterations=int(result["warmup_iterations"]),
                iterations=int(result["iterations"]),
                intra_op_threads=int(result.get("intra_op_threads") or 0),
                throughput_ips=float(result["throughput_ips"]),
                peak_rss_mb=result.get("peak_rss_mb"),
                rss_growth_mb=result.get("rss_growth_mb"),
                fingerprint=result.get("fingerprint") or {},
                **{f"latency_{key}_ms": float(latency[key]) for key in PERCENTILES},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed benchmark result: {exc!r}") from exc

    @property
    def fps(self):
        """Frames per second at the median latency, per image."""
        per_image = self.latency_p50_ms / self.batch_size
        return 1000.0 / per_image if per_image else None

    @property
    def verdict(self):
        budget = self.device_class.frame_budget_ms
        return BudgetVerdict.MEETS if self.latency_p99_ms <= budget else BudgetVerdict.MISSES

    @property
    def verdict_color(self):
        return BudgetVerdict.color(self.verdict)

    @property
    def verdict_label(self):
        return BudgetVerdict.label(self.verdict)


class AccuracyRun(models.Model):
    """How closely an engine reproduces its FP32 source on a dataset, and its task metric."""

    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="accuracy")
    engine = models.ForeignKey("engines.Engine", on_delete=models.CASCADE, related_name="accuracy")
    dataset = models.ForeignKey(
        "registry.Dataset", null=True, on_delete=models.SET_NULL, related_name="accuracy_runs"
    )
    samples = models.PositiveIntegerField()
    reference_top1 = models.FloatField(null=True)
    reference_top5 = models.FloatField(null=True)
    top1 = models.FloatField(null=True)
    top5 = models.FloatField(null=True)
    top1_agreement = models.FloatField()
    max_abs_error = models.FloatField()
    mean_abs_error = models.FloatField()
    cosine_min = models.FloatField()
    cosine_mean = models.FloatField()
    details = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"accuracy of {self.engine}: agreement {self.top1_agreement:.3f}"

    @classmethod
    def record(cls, job, result):
        """Store a worker's evaluate result for `job`; raise ValueError if it is malformed."""
        from deployhub.registry.models import Dataset

        try:
            reference, engine = result.get("reference") or {}, result.get("engine") or {}
            return cls.objects.create(
                job=job,
                engine=job.engine,
                dataset=Dataset.objects.filter(pk=job.params.get("dataset")).first(),
                samples=int(result["samples"]),
                reference_top1=reference.get("top1"),
                reference_top5=reference.get("top5"),
                top1=engine.get("top1"),
                top5=engine.get("top5"),
                top1_agreement=float(result["top1_agreement"]),
                max_abs_error=float(result["max_abs_error"]),
                mean_abs_error=float(result["mean_abs_error"]),
                cosine_min=float(result["cosine_min"]),
                cosine_mean=float(result["cosine_mean"]),
                details=result,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed evaluate result: {exc!r}") from exc

    @property
    def metric_drop_points(self):
        """Top-1 accuracy lost against the FP32 reference, in points (None without labels)."""
        if self.top1 is None or self.reference_top1 is None:
            return None
        return (self.reference_top1 - self.top1) * 100
