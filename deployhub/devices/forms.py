from django import forms

from deployhub.devices.models import DeviceClass, ServingPattern

GATE_FIELDS = [
    "serving_pattern",
    "frame_budget_ms",
    "throughput_target_ips",
    "batch_latency_ceiling_ms",
    "memory_limit_mb",
    "accuracy_tolerance",
]


def _positive(value, what):
    if value is not None and value <= 0:
        raise forms.ValidationError(f"{what} must be greater than 0.")
    return value


class DeviceClassEditForm(forms.ModelForm):
    """The serving pattern and budgets of a class (its slug names a queue: it never changes)."""

    class Meta:
        model = DeviceClass
        fields = ["name", "description", *GATE_FIELDS]
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}

    def clean_frame_budget_ms(self):
        return _positive(self.cleaned_data["frame_budget_ms"], "The frame budget")

    def clean_throughput_target_ips(self):
        return _positive(self.cleaned_data["throughput_target_ips"], "The throughput target")

    def clean_batch_latency_ceiling_ms(self):
        return _positive(self.cleaned_data["batch_latency_ceiling_ms"], "The batch latency ceiling")

    def clean_memory_limit_mb(self):
        return _positive(self.cleaned_data["memory_limit_mb"], "The memory limit")

    def clean_accuracy_tolerance(self):
        tolerance = self.cleaned_data["accuracy_tolerance"]
        if tolerance is not None and tolerance < 0:
            raise forms.ValidationError("The accuracy tolerance cannot be negative.")
        return tolerance

    def clean(self):
        data = super().clean()
        batch = data.get("serving_pattern") == ServingPattern.BATCH
        if batch and "throughput_target_ips" in data and not data["throughput_target_ips"]:
            self.add_error(
                "throughput_target_ips",
                "A batch class is judged on throughput: give its target in images/s.",
            )
        return data


class DeviceClassForm(DeviceClassEditForm):
    class Meta(DeviceClassEditForm.Meta):
        fields = ["slug", "name", "description", *GATE_FIELDS]


class DeviceForm(forms.Form):
    name = forms.SlugField(max_length=100, help_text="e.g. jetson-orin-01")


class BudgetForm(forms.Form):
    """The budget calculator: a target frame rate."""

    fps = forms.FloatField(
        min_value=0.01, max_value=100_000, label="Target fps", help_text="Frames per second."
    )


class ThroughputTargetForm(forms.Form):
    """The budget calculator of a batch class: a target sustained throughput."""

    ips = forms.FloatField(
        min_value=0.01,
        max_value=10_000_000,
        label="Target images/s",
        help_text="Sustained throughput: images per second a run achieves.",
    )
