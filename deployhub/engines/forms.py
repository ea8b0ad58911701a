import json

from django import forms

from deployhub.registry.forms import PrettyJSONField, team_classes
from workers.backends.known import BACKENDS, DEFAULT_BACKEND


# The config the form offers for each backend: its defaults, spelt out as it builds them.
def default_configs():
    """Return each registered backend's default build config, as the form shows it."""
    return {name: backend.canonical_config({}) for name, backend in BACKENDS.items()}


class CompileForm(forms.Form):
    device_class = forms.ModelChoiceField(queryset=None, empty_label=None)
    backend = forms.ChoiceField(choices=())
    build_config = PrettyJSONField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "class": "code"}),
        help_text="Backend options; the same config on the same toolchain reuses the engine.",
    )

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["device_class"].queryset = team_classes(team)
        self.fields["backend"].choices = [(name, name) for name in sorted(BACKENDS)]
        # The page swaps in a backend's default config when the backend changes.
        defaults = default_configs()
        self.fields["backend"].widget.attrs["data-defaults"] = json.dumps(defaults)
        self.fields["backend"].initial = DEFAULT_BACKEND
        self.fields["build_config"].initial = defaults[DEFAULT_BACKEND]

    def clean_build_config(self):
        config = self.cleaned_data["build_config"] or {}
        if not isinstance(config, dict):
            raise forms.ValidationError("The build config is a JSON object.")
        return config


class EvaluateForm(forms.Form):
    """Evaluate an engine on a dataset of its model, a golden set of its version, or both."""

    dataset = forms.ModelChoiceField(
        queryset=None, required=False, help_text="Compared with the FP32 source, sample by sample."
    )
    golden_set = forms.ModelChoiceField(
        queryset=None, required=False, help_text="Outputs the engine must reproduce."
    )
    max_samples = forms.IntegerField(min_value=1, max_value=100_000, initial=1000)

    def __init__(self, *args, engine, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["dataset"].queryset = engine.model_version.model.datasets.all()
        self.fields["golden_set"].queryset = engine.model_version.golden_sets.all()

    def clean(self):
        data = super().clean()
        if not data.get("dataset") and not data.get("golden_set"):
            raise forms.ValidationError("Choose a dataset, a golden set or both.")
        return data
