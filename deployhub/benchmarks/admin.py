from django.contrib import admin

from deployhub.benchmarks.models import BenchmarkRun


@admin.register(BenchmarkRun)
class BenchmarkRunAdmin(admin.ModelAdmin):
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
