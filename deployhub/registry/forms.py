"""The registry's forms: uploads with their spec and contract, datasets, golden sets, search."""

import json

from django import forms
from django.db.models import Q

from deployhub.devices.models import DeviceClass
from deployhub.registry.models import DatasetKind, VersionFormat
from workers.golden import DEFAULT_ATOL, DEFAULT_RTOL

JSON_WIDGET = forms.Textarea(attrs={"rows": 6, "class": "code", "spellcheck": "false"})


def team_classes(team):
    return DeviceClass.objects.filter(team=team)


class PrettyJSONField(forms.JSONField):
    """A JSON textarea that shows its value indented."""

    def prepare_value(self, value):
        if isinstance(value, str):
            return value
        return json.dumps(value, indent=2) if value else ""


class SpecFields(forms.Form):
    preprocessing = PrettyJSONField(
        required=False,
        widget=JSON_WIDGET,
        help_text="Preprocessing spec: resize, color_order, scale, mean, std, layout, dtype.",
    )
    contract = PrettyJSONField(
        required=False,
        widget=JSON_WIDGET,
        help_text="Input-shape contract; empty takes the model's own shapes with batch size 1.",
    )


class VersionUploadForm(SpecFields):
    file = forms.FileField(
        help_text=".onnx, a .zip of an ONNX model with its external data, or a torch.export .pt2."
    )
    notes = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    export_on = forms.ModelChoiceField(
        queryset=DeviceClass.objects.none(),
        required=False,
        help_text="For a .pt2: the device class whose worker (with torch) exports it to ONNX.",
    )
    field_order = ["file", "notes", "preprocessing", "contract", "export_on"]

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["export_on"].queryset = team_classes(team)


class NewModelForm(VersionUploadForm):
    name = forms.CharField(max_length=100)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    field_order = ["name", "description", *VersionUploadForm.field_order]


class DeriveVersionForm(SpecFields):
    notes = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)


class EditNotesForm(forms.Form):
    notes = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    tags = forms.CharField(required=False, help_text="Comma-separated.")

    def clean_tags(self):
        tags = [tag.strip() for tag in self.cleaned_data["tags"].split(",") if tag.strip()]
        if any(len(tag) > 40 for tag in tags):
            raise forms.ValidationError("Tags are at most 40 characters.")
        return sorted(set(tags))


class DatasetForm(forms.Form):
    kind = forms.ChoiceField(choices=DatasetKind.choices())
    name = forms.SlugField(max_length=100)
    file = forms.FileField(
        help_text=".npz with one array per model input, named after it, one sample per row "
        "and the same number of rows in each (np.savez(f, image=..., mask=..., labels=...); "
        "a single-input model may call its array 'inputs'), plus 'labels' (one class index "
        "per sample) for validation; each array in its input's dtype family (float inputs "
        "also take integer pixels, bool inputs 0/1). Or, for a single-input model, a .zip of "
        "images with labels.csv (filename,label), preprocessed with this version's spec."
    )


class GoldenSetForm(forms.Form):
    name = forms.SlugField(max_length=100)
    file = forms.FileField(
        help_text=".npz of arrays named by the model's inputs and outputs, each with a leading "
        "pair axis (one pair: x[None]); or a .zip of ONNX test data "
        "(test_data_set_N/input_K.pb, output_K.pb)."
    )
    atol = forms.FloatField(min_value=0, initial=DEFAULT_ATOL, help_text="Absolute tolerance.")
    rtol = forms.FloatField(min_value=0, initial=DEFAULT_RTOL, help_text="Relative tolerance.")


class ModelSearchForm(forms.Form):
    """The Models list's search and filters, read from the URL's query so a view can be shared."""

    q = forms.CharField(required=False, max_length=100, label="Search")
    format = forms.ChoiceField(
        required=False, choices=[("", "any format"), *VersionFormat.choices()]
    )
    tag = forms.CharField(required=False, max_length=40)

    def filter(self, models):
        """Return the models matching the valid criteria (an invalid field filters nothing)."""
        data = self.cleaned_data if self.is_valid() else {}
        if query := data.get("q", "").strip():
            models = models.filter(Q(name__icontains=query) | Q(description__icontains=query))
        if data.get("format"):
            models = models.filter(versions__format=data["format"])
        if tag := data.get("tag", "").strip():
            # The JSON list as text holds the tag quoted; works on SQLite and PostgreSQL alike.
            models = models.filter(versions__tags__icontains=json.dumps(tag))
        return models.distinct()

    @property
    def active(self):
        return self.is_valid() and any(self.cleaned_data.values())
