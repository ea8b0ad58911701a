"""Models and their immutable versions."""

from django.conf import settings
from django.db import models
from django.urls import reverse


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
    """Store under a server-generated name; the user's filename is kept only as data."""
    return f"models/{instance.sha256[:2]}/{instance.sha256}.onnx"


class ModelVersion(models.Model):
    """One immutable file of a model, with what validation found in it."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    file = models.FileField(upload_to=version_upload_path, max_length=255)
    original_filename = models.CharField(max_length=255, blank=True)
    sha256 = models.CharField(max_length=64, db_index=True)
    size = models.BigIntegerField()
    format = models.CharField(max_length=20, default="onnx")
    ir_version = models.PositiveIntegerField(null=True)
    opset = models.PositiveIntegerField(null=True)
    producer = models.CharField(max_length=200, blank=True)
    inputs = models.JSONField(default=list)
    outputs = models.JSONField(default=list)
    contract = models.JSONField(default=dict, blank=True)
    preprocessing = models.JSONField(default=dict, blank=True)
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

    def get_absolute_url(self):
        return reverse("version_detail", args=[self.pk])

    @property
    def team(self):
        return self.model.team
