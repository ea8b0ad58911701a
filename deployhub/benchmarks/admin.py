from django.contrib import admin

from deployhub.benchmarks.models import BenchmarkRun


@admin.register(BenchmarkRun)
class BenchmarkRunAdmin(admin.ModelAdmin):
    """Runs are measurements, the evidence releases are judged by: staff may read and delete
    them, never edit or make them up (a model's results JSON is kept while its runs are
    only added and deleted: benchmarks/exports.py)."""

    list_display = [
        "model_version",
        "device",
        "backend",
        "scenario",
        "batch_size",
        "latency_p50_ms",
        "latency_p99_ms",
        "throughput_ips",
        "stable",
        "created_at",
    ]
    list_filter = ["device_class", "backend", "scenario", "stable"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
