from django import forms

from deployhub.devices.models import DeviceClass


class DeviceClassForm(forms.ModelForm):
    class Meta:
        model = DeviceClass
        fields = [
            "slug",
            "name",
            "description",
            "serving_pattern",
            "frame_budget_ms",
            "throughput_target_ips",
            "memory_limit_mb",
        ]
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}


class DeviceForm(forms.Form):
    name = forms.SlugField(max_length=100, help_text="e.g. jetson-orin-01")
