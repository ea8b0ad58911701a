from django.contrib import admin

from deployhub.parity.models import ParityRun


@admin.register(ParityRun)
class ParityRunAdmin(admin.ModelAdmin):
    list_display = ["model_version", "job", "samples", "passed", "max_abs_error", "created_at"]
    list_filter = ["passed"]
