from django.contrib import admin

from deployhub.jobs.models import Artifact, Job


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """Jobs change state only through the protocol; the admin shows them."""

    list_display = ["id", "kind", "state", "device_class", "device", "attempt", "created_at"]
    list_filter = ["state", "kind", "device_class"]

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ["name", "job", "attempt", "size", "sha256", "created_at"]
