"""Compiled engines, content-addressed and tied to the toolchain that built them."""

from django.db import models
from django.urls import reverse

from deployhub.choices import ChoiceSet


class EngineStatus(ChoiceSet):
    VALID = "valid"
    STALE = "stale"
    REVOKED = "revoked"
    CHOICES = (
        (VALID, "Valid", "green"),
        (STALE, "Stale", "orange"),
        (REVOKED, "Revoked", "red"),
    )


class EngineQuerySet(models.QuerySet):
    def for_version(self, version):
        return self.filter(model_version=version).select_related("device_class", "built_on")


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
            models.UniqueConstraint(
                fields=["model_version", "backend", "config_digest", "compat_key"],
                name="engine_unique_per_toolchain",
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
