from django import forms
from django.conf import settings

from deployhub.core import accuracy, json_input
from deployhub.devices.models import DeviceClass, ServingPattern

GATE_FIELDS = [
    "serving_pattern",
    "frame_budget_ms",
    "throughput_target_ips",
    "batch_latency_ceiling_ms",
    "memory_limit_mb",
    "accuracy_tolerance",
    "task_tolerances",
]


def _positive(value, what):
    if value is not None and value <= 0:
        raise forms.ValidationError(f"{what} must be greater than 0.")
    return value


class DeviceClassEditForm(forms.ModelForm):
    """The serving pattern and budgets of a class (its slug names a queue: it never changes)."""

    description = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        required=False,
        max_length=settings.DEPLOYHUB_MAX_TEXT_CHARS,
    )

    class Meta:
        model = DeviceClass
        fields = ["name", "description", *GATE_FIELDS, "trusts_builds_of"]
        widgets = {"trusts_builds_of": forms.CheckboxSelectMultiple}
        labels = {
            "trusts_builds_of": "Runs engines built by",
            "task_tolerances": "Tolerances per task (JSON)",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "trusts_builds_of" in self.fields:  # only the team's other classes
            others = DeviceClass.objects.filter(team=self.instance.team_id).exclude(
                pk=self.instance.pk
            )
            self.fields["trusts_builds_of"].queryset = others

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

    def clean_task_tolerances(self):
        raw = self.data.get("task_tolerances", "")
        try:  # json_input refuses NaN and Infinity, which Django's JSON field lets through
            value = json_input.parse(raw, "task_tolerances") if str(raw).strip() else {}
            return accuracy.checked_overrides(value)
        except (json_input.JSONInputError, ValueError) as exc:
            raise forms.ValidationError(str(exc)) from exc

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
    """A new class: it trusts no other class's builds until an admin edits it."""

    class Meta(DeviceClassEditForm.Meta):
        fields = ["slug", "name", "description", *GATE_FIELDS]


class DeviceForm(forms.Form):
    name = forms.SlugField(max_length=100, help_text="e.g. jetson-orin-01")


class EnrolmentTokenForm(forms.Form):
    """A new enrolment token: how long it lasts, how many devices it enrols, what it is for."""

    expires_in_days = forms.IntegerField(
        min_value=1, max_value=3650, required=False, help_text="Blank: it never expires."
    )
    max_devices = forms.IntegerField(
        min_value=1, max_value=1_000_000, required=False, help_text="Blank: no limit."
    )
    note = forms.CharField(max_length=200, required=False, help_text="e.g. the Berlin rack")


class BudgetForm(forms.Form):
    """The budget calculator, both ways: a target frame rate or a budget per frame (ms)."""

    fps = forms.FloatField(
        min_value=0.01,
        max_value=100_000,
        required=False,
        label="Target fps",
        help_text="Frames per second.",
    )
    ms = forms.FloatField(
        min_value=0.01, max_value=100_000, required=False, label="or budget (ms per frame)"
    )

    def clean(self):
        data = super().clean()
        if not self.errors and not data.get("fps") and not data.get("ms"):
            raise forms.ValidationError("Give a target fps or a budget in ms per frame.")
        return data

    @property
    def budget_ms(self):
        """The budget per frame: the ms given, else 1000 / fps."""
        data = self.cleaned_data
        return data["ms"] or 1000.0 / data["fps"]


class CompareForm(forms.Form):
    """Two builds' throughput side by side: batch × 1000 / latency ms each, and their ratio."""

    batch_a = forms.IntegerField(min_value=1, max_value=4096, initial=8, label="Batch")
    ms_a = forms.FloatField(min_value=0.001, max_value=1e6, initial=25, label="ms per batch")
    batch_b = forms.IntegerField(min_value=1, max_value=4096, initial=1, label="vs batch")
    ms_b = forms.FloatField(min_value=0.001, max_value=1e6, initial=35, label="ms per batch")

    def figures(self):
        """Return (throughput a, throughput b, a / b) in images/s, or None when invalid."""
        if not self.is_valid():
            return None
        data = self.cleaned_data
        a = data["batch_a"] * 1000.0 / data["ms_a"]
        b = data["batch_b"] * 1000.0 / data["ms_b"]
        return {"a": a, "b": b, "ratio": a / b}


class ThroughputTargetForm(forms.Form):
    """The budget calculator of a batch class: a target sustained throughput."""

    ips = forms.FloatField(
        min_value=0.01,
        max_value=10_000_000,
        label="Target images/s",
        help_text="Sustained throughput: images per second a run achieves.",
    )
