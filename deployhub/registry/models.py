"""Models, their immutable versions, and the datasets that go with them."""

from django.conf import settings
from django.db import models
from django.urls import reverse

from deployhub.core.choices import ChoiceSet


class VersionFormat(ChoiceSet):
    ONNX = "onnx"
    ONNX_ZIP = "onnx-zip"
    PT2 = "pt2"
    CHOICES = (
        (ONNX, "ONNX", "blue"),
        (ONNX_ZIP, "ONNX with external data", "blue"),
        (PT2, "PyTorch export program (.pt2)", "purple"),
    )
    # An ONNX model with external data stays the zip it came in: model and data travel together.
    EXTENSIONS = {ONNX: ".onnx", ONNX_ZIP: ".zip", PT2: ".pt2"}


class DatasetKind(ChoiceSet):
    CALIBRATION = "calibration"
    VALIDATION = "validation"
    CHOICES = (
        (CALIBRATION, "Calibration", "teal"),
        (VALIDATION, "Validation", "green"),
    )


class Model(models.Model):
    """A trained model a team deploys; its files live in its versions."""

    team = models.ForeignKey("teams.Team", on_delete=models.CASCADE, related_name="models")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="model_name_unique_in_team")
        ]

    def __str__(self):
        return self.name

    def get_absolute_url(self):
        return reverse("model_detail", args=[self.pk])

    def latest_version(self):
        return self.versions.order_by("-number").first()

    def next_version_number(self):
        latest = self.latest_version()
        return latest.number + 1 if latest else 1


def version_upload_path(instance, filename):
    """Store under a server-generated, content-addressed name; the user's name is only data."""
    extension = VersionFormat.EXTENSIONS.get(instance.format, ".onnx")
    return f"models/{instance.sha256[:2]}/{instance.sha256}{extension}"


# The task is a declaration about the file, not the file: the team confirms or corrects it.
IMMUTABLE_EXCEPT = {"notes", "tags", "task"}


class ModelVersion(models.Model):
    """One immutable file of a model, with what validation found in it."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    file = models.FileField(upload_to=version_upload_path, max_length=255)
    original_filename = models.CharField(max_length=255, blank=True)
    sha256 = models.CharField(max_length=64, db_index=True)
    size = models.BigIntegerField()
    format = models.CharField(
        max_length=20, choices=VersionFormat.choices(), default=VersionFormat.ONNX
    )
    ir_version = models.PositiveIntegerField(null=True)
    opset = models.PositiveIntegerField(null=True)
    producer = models.CharField(max_length=200, blank=True)
    inputs = models.JSONField(default=list)
    outputs = models.JSONField(default=list)
    graph = models.JSONField(default=dict, blank=True, help_text="Operators, nodes, parameters.")
    external_data = models.JSONField(default=list, blank=True)
    contract = models.JSONField(default=dict, blank=True)
    preprocessing = models.JSONField(default=dict, blank=True)
    task = models.JSONField(
        default=dict,
        blank=True,
        help_text="What the model does and how to read its outputs: {task, params, why, "
        "confirmed} (workers/tasks). Proposed at upload; the team confirms or corrects it.",
    )
    warnings = models.JSONField(default=list, blank=True)
    export_report = models.JSONField(
        default=dict, blank=True, help_text="For a version exported from its parent: how it went."
    )
    tags = models.JSONField(default=list, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    notes = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["model", "number"], name="version_number_unique")
        ]

    def __str__(self):
        return f"{self.model.name} v{self.number}"

    def save(self, *args, **kwargs):
        """Refuse to change a stored version except its notes and tags."""
        if self.pk is not None:
            stored = type(self).objects.filter(pk=self.pk).values().first() or {}
            changed = {
                f.attname
                for f in self._meta.concrete_fields
                if f.attname in stored and stored[f.attname] != getattr(self, f.attname)
            }
            if changed - IMMUTABLE_EXCEPT:
                raise ValueError(
                    f"Versions are immutable: {', '.join(sorted(changed - IMMUTABLE_EXCEPT))} "
                    "cannot change. Upload a new version instead."
                )
        super().save(*args, **kwargs)

    def get_absolute_url(self):
        return reverse("version_detail", args=[self.pk])

    @property
    def download_name(self):
        """Return the name a device saves the file under ("resnet-v3.onnx")."""
        return f"{self.model.name}-v{self.number}{VersionFormat.EXTENSIONS[self.format]}"

    @property
    def team(self):
        return self.model.team

    @property
    def is_onnx(self):
        return self.format in (VersionFormat.ONNX, VersionFormat.ONNX_ZIP)

    def previous(self):
        return self.model.versions.filter(number__lt=self.number).order_by("-number").first()


def dataset_upload_path(instance, filename):
    return f"datasets/{instance.sha256[:2]}/{instance.sha256}.npz"


class Dataset(models.Model):
    """Calibration or validation samples of a model, stored as a checked .npz."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="datasets")
    kind = models.CharField(max_length=20, choices=DatasetKind.choices())
    name = models.CharField(max_length=100)
    file = models.FileField(upload_to=dataset_upload_path, max_length=255)
    original_filename = models.CharField(max_length=255, blank=True)
    source = models.CharField(max_length=20, help_text="npz, or images turned into tensors.")
    source_sha256 = models.CharField(max_length=64, help_text="sha256 of the uploaded file.")
    sha256 = models.CharField(max_length=64, help_text="sha256 of the stored .npz.")
    size = models.BigIntegerField()
    samples = models.PositiveIntegerField()
    input_shape = models.JSONField(default=list)
    input_dtype = models.CharField(max_length=20)
    has_labels = models.BooleanField(default=False)
    classes = models.PositiveIntegerField(null=True, blank=True)
    task = models.CharField(
        max_length=40,
        blank=True,
        help_text="The task its labels are for (classification, detection, ...); empty unlabelled.",
    )
    label_summary = models.CharField(
        max_length=200, blank=True, help_text="What the labels hold: '37 boxes in 5 images'."
    )
    checked_against = models.ForeignKey(
        ModelVersion, null=True, on_delete=models.SET_NULL, related_name="checked_datasets"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model", "kind", "name"]
        constraints = [
            models.UniqueConstraint(fields=["model", "name"], name="dataset_name_unique")
        ]

    def __str__(self):
        return f"{self.name} ({self.get_kind_display().lower()}, {self.samples} samples)"

    @property
    def team(self):
        return self.model.team


class GoldenFormat(ChoiceSet):
    NPZ = "npz"
    ONNX_PB = "onnx-pb"
    CHOICES = (
        (NPZ, ".npz arrays", "blue"),
        (ONNX_PB, "ONNX test data (.pb)", "purple"),
    )
    EXTENSIONS = {NPZ: ".npz", ONNX_PB: ".zip"}


def golden_upload_path(instance, filename):
    extension = GoldenFormat.EXTENSIONS.get(instance.format, ".npz")
    return f"golden/{instance.sha256[:2]}/{instance.sha256}{extension}"


class GoldenSet(models.Model):
    """Inputs and the outputs a version must give for them, within atol and rtol.

    Stored as uploaded (workers/checks/golden.py reads both formats). The default
    tolerances pass a correct FP32 engine and fail a wrong one: see
    deployhub/registry/golden.py.
    """

    model_version = models.ForeignKey(
        ModelVersion, on_delete=models.CASCADE, related_name="golden_sets"
    )
    name = models.CharField(max_length=100)
    file = models.FileField(upload_to=golden_upload_path, max_length=255)
    original_filename = models.CharField(max_length=255, blank=True)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    format = models.CharField(max_length=20, choices=GoldenFormat.choices())
    pairs = models.PositiveIntegerField()
    input_names = models.JSONField(default=list)
    output_names = models.JSONField(default=list, help_text="The outputs the pairs check.")
    atol = models.FloatField(help_text="Absolute tolerance, as in np.isclose.")
    rtol = models.FloatField(help_text="Relative tolerance, as in np.isclose.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model_version", "name"]
        constraints = [
            models.UniqueConstraint(fields=["model_version", "name"], name="golden_set_name_unique")
        ]

    def __str__(self):
        return f"{self.name} ({self.pairs} golden pairs)"

    @property
    def team(self):
        return self.model_version.team

    @property
    def filename(self):
        return f"golden{GoldenFormat.EXTENSIONS[self.format]}"

    def latest_runs(self):
        """Return the newest run of this set on each engine, newest first."""
        return latest_per(self.runs.select_related("engine", "job"), "engine_id")


def latest_per(runs, key):
    """Keep the first run of each value of `key` from runs ordered newest first."""
    seen, kept = set(), []
    for run in runs:
        if getattr(run, key) not in seen:
            seen.add(getattr(run, key))
            kept.append(run)
    return kept
