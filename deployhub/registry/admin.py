from django.contrib import admin

from deployhub.registry.models import Model, ModelVersion


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "created_at"]
    list_filter = ["team"]


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    """Versions are immutable: only notes can change here."""

    list_display = ["model", "number", "format", "opset", "size", "created_at"]
    readonly_fields = [f.name for f in ModelVersion._meta.fields if f.name != "notes"]
