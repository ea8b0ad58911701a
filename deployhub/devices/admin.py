from django.contrib import admin

from deployhub.devices.models import Device, DeviceClass


@admin.register(DeviceClass)
class DeviceClassAdmin(admin.ModelAdmin):
    list_display = [
        "slug",
        "name",
        "team",
        "serving_pattern",
        "frame_budget_ms",
        "throughput_target_ips",
        "batch_latency_ceiling_ms",
    ]
    list_filter = ["team"]


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ["name", "device_class", "last_heartbeat_at", "draining"]
    readonly_fields = ["token_hint", "fingerprint", "last_heartbeat_at"]
    exclude = ["token_hash"]
