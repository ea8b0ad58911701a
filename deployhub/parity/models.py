"""Preprocessing parity runs: does a version's spec reproduce what its training pipeline fed?"""

import math

from django.conf import settings
from django.db import models

from deployhub.core.choices import ChoiceSet
from deployhub.jobs.errors import ResultRejected
from deployhub.jobs.kinds import FileInput
from deployhub.jobs.models import JobState
from workers.kinds import PARITY_INPUT


class ParityVerdict(ChoiceSet):
    PASSED = "passed"
    FAILED = "failed"
    CHECKING = "checking"
    ERROR = "error"
    CHOICES = (
        (PASSED, "Passed", "green"),
        (FAILED, "Failed", "red"),
        (CHECKING, "Checking", "blue"),
        (ERROR, "Did not run", "orange"),
    )


def pack_upload_path(instance, filename):
    """Store a pack under its content address; the user's file name is only data."""
    return f"parity/{instance.sha256[:2]}/{instance.sha256}.zip"


class ParityRunQuerySet(models.QuerySet):
    def for_version(self, version):
        return self.filter(model_version=version).select_related("job__device_class", "created_by")

    def completed(self):
        """Runs whose worker reported a comparison (passed or failed)."""
        return self.filter(passed__isnull=False)


class ParityRun(models.Model):
    """A parity pack checked on a worker against a version's spec, and what the check found."""

    model_version = models.ForeignKey(
        "registry.ModelVersion", on_delete=models.CASCADE, related_name="parity_runs"
    )
    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="parity")
    file = models.FileField(upload_to=pack_upload_path, max_length=255)
    original_filename = models.CharField(max_length=255, blank=True)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    samples = models.PositiveIntegerField()
    sample_names = models.JSONField(default=list)
    tolerance = models.FloatField(
        null=True, blank=True, help_text="The tolerance asked for; empty: the default."
    )
    passed = models.BooleanField(null=True)
    tolerance_used = models.FloatField(null=True)
    max_abs_error = models.FloatField(null=True)
    cause = models.TextField(
        blank=True, help_text="The diagnosis sentence, when a suspect matched."
    )
    summary = models.TextField(blank=True)
    per_sample = models.JSONField(default=list, blank=True)
    diagnosis = models.JSONField(default=list, blank=True)
    result = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ParityRunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"parity #{self.pk} of {self.model_version}"

    def get_absolute_url(self):
        return f"{self.model_version.get_absolute_url()}#parity-{self.pk}"

    @property
    def team(self):
        return self.model_version.team

    @property
    def verdict(self):
        if self.passed is not None:
            return ParityVerdict.PASSED if self.passed else ParityVerdict.FAILED
        if self.job.state in (JobState.QUEUED, JobState.RUNNING):
            return ParityVerdict.CHECKING
        return ParityVerdict.ERROR

    @property
    def verdict_color(self):
        return ParityVerdict.color(self.verdict)

    @property
    def verdict_label(self):
        return ParityVerdict.label(self.verdict)

    @property
    def matches(self):
        """The diagnosis entries whose variant of the spec reproduced training."""
        return [entry for entry in self.diagnosis if entry.get("matches")]

    @classmethod
    def record(cls, job, result):
        """Store a worker's parity result on the job's run; raise ValueError if it is malformed."""
        run = cls.objects.select_for_update().filter(job=job).first()
        if run is None:
            raise ResultRejected("This parity job has no parity run to record its result on.")
        try:
            fields = _parsed(result)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed parity result: {exc!r}") from exc
        if fields["samples"] != run.samples:
            raise ResultRejected(
                f"The worker compared {fields['samples']} samples; the pack holds {run.samples}."
            )
        for name, value in fields.items():
            setattr(run, name, value)
        run.result = result
        run.save()
        return run


def _parsed(result):
    """Return the ParityRun fields of a worker's result, checking their types."""
    if not isinstance(result["passed"], bool):
        raise TypeError("passed must be true or false")
    return {
        "passed": result["passed"],
        "samples": int(result["samples"]),
        "tolerance_used": _number(result["tolerance"]),
        "max_abs_error": _optional_number(result.get("max_abs_error")),
        "cause": str(result.get("cause") or ""),
        "summary": str(result.get("summary") or ""),
        "per_sample": [_sample(row) for row in result["per_sample"]],
        "diagnosis": [_diagnosis(entry) for entry in result["diagnosis"]],
    }


def _number(value):
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return float(value)


def _optional_number(value):
    return None if value is None else _number(value)


def _sample(row):
    return {
        "name": str(row["name"]),
        "shape": list(row.get("shape") or []),
        "expected_shape": list(row.get("expected_shape") or []),
        "max_abs_error": _optional_number(row.get("max_abs_error")),
        "suspect_max_abs_error": _optional_number(row.get("suspect_max_abs_error")),
    }


def _diagnosis(entry):
    if not isinstance(entry["matches"], bool):
        raise TypeError("a diagnosis entry's matches must be true or false")
    return {
        "suspect": str(entry["suspect"]),
        "matches": entry["matches"],
        "max_abs_error": _optional_number(entry.get("max_abs_error")),
        "tolerance": _optional_number(entry.get("tolerance")),
        "message": str(entry["message"]),
    }


def parity_run_of(job):
    """Return the parity run a parity job checks, if any."""
    return ParityRun.objects.filter(job=job).first()


def pack_input(job, device=None):
    """A parity job's pack: the zip of images and the tensors the training pipeline made."""
    run = parity_run_of(job)
    return (
        {PARITY_INPUT: FileInput(run.file.name, run.sha256, run.size, "parity.zip")} if run else {}
    )
