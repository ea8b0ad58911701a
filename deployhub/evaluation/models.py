"""What an evaluation found: how closely an engine reproduces its FP32 source.

AccuracyRun: agreement and the task metric on a dataset. GoldenRun: whether the
engine reproduced a version's golden input/output pairs, output by output. Both
come from one evaluate job (deployhub/evaluation/actions.py).
"""

from django.db import models

from deployhub.core import accuracy
from deployhub.jobs.errors import ResultRejected
from deployhub.registry.models import Dataset, GoldenSet


class AccuracyRunQuerySet(models.QuerySet):
    def for_model(self, model):
        """Accuracy runs of the engines of every version of the model, oldest version first.

        The few engines, versions, classes and datasets are each read once and shared by
        their runs (BenchmarkRunQuerySet.for_model says why).
        """
        runs = self.filter(engine__model_version__model=model).prefetch_related(
            "engine__model_version", "engine__device_class", "dataset"
        )
        return runs.order_by("engine__model_version__number", "created_at")


def _real_samples(result, dataset, max_samples):
    """Return the number of samples an evaluation reports; refuse more than the dataset gave.

    A model with a fixed batch is fed a last batch padded with repeated samples: the
    worker counts only the real ones, and a count above the dataset's would be padding.
    """
    samples = int(result["samples"])
    if dataset is None:
        return samples
    limit = min(dataset.samples, max_samples) if isinstance(max_samples, int) else dataset.samples
    if not 1 <= samples <= limit:
        raise ValueError(
            f"it reports {samples} samples evaluated; the dataset {dataset.name!r} gives "
            f"1 to {limit} real samples (padding does not count)"
        )
    return samples


class AccuracyRun(accuracy.LabelledFigures, models.Model):
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
    top1_agreement = models.FloatField(null=True, help_text="Classification only.")
    task = models.CharField(max_length=40, default="classification")
    agreement = models.FloatField(
        null=True, help_text="The task's headline agreement with the FP32 source (no labels)."
    )
    agreement_metric = models.CharField(max_length=40, blank=True)
    max_abs_error = models.FloatField()
    mean_abs_error = models.FloatField()
    cosine_min = models.FloatField()
    cosine_mean = models.FloatField()
    details = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = AccuracyRunQuerySet.as_manager()

    class Meta:
        db_table = "benchmarks_accuracyrun"  # stored by benchmarks until evaluation had a home
        ordering = ["-created_at"]

    def __str__(self):
        return f"accuracy of {self.engine}: {self.agreement_metric} {self.agreement_value}"

    @classmethod
    def record(cls, job, result):
        """Store a worker's evaluate result for `job`; raise ValueError if it is malformed."""
        try:
            reference, engine = result.get("reference") or {}, result.get("engine") or {}
            dataset = Dataset.objects.filter(pk=job.params.get("dataset")).first()
            task, agreement_metric, agreement = _agreement(result)
            return cls.objects.create(
                job=job,
                engine=job.engine,
                dataset=dataset,
                samples=_real_samples(result, dataset, job.params.get("max_samples")),
                reference_top1=reference.get("top1"),
                reference_top5=reference.get("top5"),
                top1=engine.get("top1"),
                top5=engine.get("top5"),
                top1_agreement=_optional_float(result.get("top1_agreement")),
                task=task,
                agreement=agreement,
                agreement_metric=agreement_metric,
                max_abs_error=float(result["max_abs_error"]),
                mean_abs_error=float(result["mean_abs_error"]),
                cosine_min=float(result["cosine_min"]),
                cosine_mean=float(result["cosine_mean"]),
                details=result,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed evaluate result: {exc!r}") from exc

    @property
    def metric(self):
        """The labelled headline key of the run's task ("top1", "map", "cer")."""
        return self.details.get("metric") or "top1"

    def _labelled(self, which):
        top1 = self.reference_top1 if which == "reference" else self.top1
        return accuracy.labelled_value(self.metric, top1, self.details.get(which))

    @property
    def metric_drop_points(self):
        """Labelled headline lost against the FP32 reference, in points (None without labels).

        Lost means worse: a CER that rose by 0.4 points is a drop of 0.4.
        """
        if not self.labelled:
            return None
        return accuracy.points_lost(self.task, self.reference_value, self.engine_value)

    @property
    def headline(self):
        """The name of the figure the run is judged on ("mAP@0.5:0.95", "detection F1")."""
        return accuracy.headline_name(self.task, self.labelled)

    @property
    def headline_value(self):
        """The engine's value of that figure."""
        return self.engine_value if self.labelled else self.agreement_value

    @property
    def agreement_value(self):
        """The task's headline agreement with the FP32 source (top-1 agreement, F1, cosine)."""
        return self.agreement if self.agreement is not None else self.top1_agreement

    @property
    def score(self):
        """One number, higher is better, to rank builds by (accuracy.score)."""
        return accuracy.score(self.task, after=self.engine_value, agreement=self.agreement_value)

    def tolerance_breach(self, device_class):
        """Say how this run falls outside its class's tolerance for its task; '' when within.

        Labelled: the headline's points lost; else the agreement headline against its bound
        (accuracy.breach). The one definition every page and auto mode use.
        """
        return accuracy.breach(
            self.task,
            device_class.tolerance_for(self.task),
            before=self.reference_value,
            after=self.engine_value,
            agreement=self.agreement_value,
            agreements=self.details.get("agreement"),
        )

    @property
    def within_tolerance(self):
        """Whether the run is within its engine's class's accuracy tolerance."""
        return not self.tolerance_breach(self.engine.device_class)


def _optional_float(value):
    return None if value is None else float(value)


def _agreement(result):
    """Return (task, agreement headline key, its value) of an evaluate result.

    A result from before tasks (a classifier's) has only top1_agreement.
    """
    task = result.get("task") or accuracy.CLASSIFICATION
    key = result.get("agreement_metric") or "top1_agreement"
    value = (result.get("agreement") or {}).get(key, result.get(key))
    return task, key, _optional_float(value)


class GoldenRun(models.Model):
    """Whether an engine reproduced a golden set in an evaluate job, output by output."""

    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="golden_run")
    engine = models.ForeignKey(
        "engines.Engine", on_delete=models.CASCADE, related_name="golden_runs"
    )
    golden_set = models.ForeignKey(GoldenSet, on_delete=models.CASCADE, related_name="runs")
    passed = models.BooleanField()
    reference_passed = models.BooleanField(
        null=True, help_text="Whether the FP32 source reproduced the pairs in the same job."
    )
    pairs = models.PositiveIntegerField()
    atol = models.FloatField()
    rtol = models.FloatField()
    outputs = models.JSONField(default=list, help_text="One report per checked output.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "registry_goldenrun"  # stored by registry until evaluation had a home
        ordering = ["-created_at", "-id"]

    def __str__(self):
        verdict = "reproduced" if self.passed else "not reproduced"
        return f"{self.golden_set.name} on {self.engine}: {verdict}"

    @classmethod
    def record(cls, job, result):
        """Store the `golden` part of an evaluate result; refuse one that does not fit the set."""
        golden_set = GoldenSet.objects.filter(
            pk=(job.params.get("golden") or {}).get("set"), model_version=job.engine.model_version
        ).first()
        if golden_set is None:
            raise ResultRejected("The golden set this job checked no longer exists.")
        try:
            outputs = [_output_report(output) for output in result["outputs"]]
            reference = result.get("reference") or {}
            run = cls(
                job=job,
                engine=job.engine,
                golden_set=golden_set,
                passed=all(output["passed"] for output in outputs),
                reference_passed=reference.get("passed"),
                pairs=int(result["pairs"]),
                atol=float(result["atol"]),
                rtol=float(result["rtol"]),
                outputs=outputs,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultRejected(f"Malformed golden result: {exc!r}") from exc
        reported = sorted(output["name"] for output in outputs)
        if reported != sorted(golden_set.output_names):
            raise ResultRejected(
                f"The golden result reports the outputs {reported}; the set checks "
                f"{sorted(golden_set.output_names)}."
            )
        run.save()
        return run

    @property
    def failing(self):
        """Names of the outputs the engine did not reproduce."""
        return [output["name"] for output in self.outputs if not output["passed"]]

    @property
    def reason(self):
        """Say why the engine fails this golden set ('' when it passed)."""
        if self.passed:
            return ""
        names = ", ".join(self.failing)
        return f"golden set {self.golden_set.name!r} not reproduced: {names}"


# What a golden result reports of each output (workers/checks/golden.py compare_output).
OUTPUT_REPORT = {
    "name": str,
    "passed": bool,
    "elements": int,
    "mismatched": int,
    "mismatched_fraction": float,
    "max_abs_error": float,
    "max_rel_error": float,
    "nonfinite": int,
}


def _output_report(output):
    """Return one output's report with its fields typed; raise KeyError or ValueError."""
    report = {key: kind(output[key]) for key, kind in OUTPUT_REPORT.items()}
    worst = output.get("worst_pair")
    report["worst_pair"] = int(worst) if worst is not None else None
    report["shape_error"] = str(output["shape_error"]) if output.get("shape_error") else ""
    return report
