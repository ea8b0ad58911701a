"""The registry's forms: uploads with their spec and contract, datasets, golden sets, search."""

import json

from django import forms
from django.conf import settings
from django.db.models import Q

from deployhub.core import json_input
from deployhub.devices.models import DeviceClass
from deployhub.registry.contract import batch_range_contract
from deployhub.registry.edits import TAG_CHARS, tidy_tags
from deployhub.registry.models import DatasetKind, VersionFormat
from workers.checks.golden import DEFAULT_ATOL, DEFAULT_RTOL
from workers.checks.preprocessing import (
    COLOR_ORDERS,
    DTYPES,
    INTERPOLATIONS,
    LAYOUTS,
    SpecError,
    validate_spec,
)
from workers.tasks import TASKS

# The most a person's free text holds (notes, a description): a longer one is refused, said.
TEXT = settings.DEPLOYHUB_MAX_TEXT_CHARS
JSON_WIDGET = forms.Textarea(attrs={"rows": 6, "class": "code", "spellcheck": "false"})


def team_classes(team):
    return DeviceClass.objects.filter(team=team)


class PrettyJSONField(forms.JSONField):
    """A JSON textarea that shows its value indented, and reads it as the API does: finite
    numbers, bounded nesting, text PostgreSQL can store (deployhub/core/json_input.py)."""

    def to_python(self, value):
        if isinstance(value, str) and value.strip():
            try:
                json_input.parse(value, "This JSON")
            except json_input.JSONInputError as exc:
                raise forms.ValidationError(str(exc), code="invalid") from exc
        return super().to_python(value)

    def bound_data(self, data, initial):
        if isinstance(data, str) and data.strip():
            try:
                json_input.parse(data)
            except json_input.JSONInputError:
                return forms.fields.InvalidJSONInput(data)
        return super().bound_data(data, initial)

    def prepare_value(self, value):
        if isinstance(value, str):
            return value
        return json.dumps(value, indent=2) if value else ""


EXAMPLE_SPEC = {
    "resize": {"height": 256, "width": 256, "interpolation": "bilinear"},
    "center_crop": {"height": 224, "width": 224},
    "color_order": "RGB",
    "scale": 0.00392156862745098,
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "layout": "NCHW",
    "dtype": "float32",
}
EXAMPLE_CONTRACT = batch_range_contract("input", [3, 224, 224], low=1, opt=8, high=32)
# Field by field, what the preprocessing spec takes: (field, meaning, allowed values).
SPEC_SCHEMA = (
    (
        "resize",
        "resize the image first (optional)",
        f"{{height, width, interpolation}}; interpolation one of {', '.join(INTERPOLATIONS)} "
        "(required: libraries disagree on the default)",
    ),
    (
        "center_crop",
        "crop the middle after the resize (optional)",
        "{height, width}, within the resize",
    ),
    ("color_order", "channel order the model expects", f"{' | '.join(COLOR_ORDERS)}; default RGB"),
    ("scale", "multiplies the 0-255 pixels (1/255 gives 0-1)", "a number > 0; default 1"),
    (
        "mean",
        "subtracted per channel after scaling",
        "one number per channel (3, or 1 for GRAY); default 0",
    ),
    ("std", "divides per channel after the mean", "one non-zero number per channel; default 1"),
    ("layout", "axis order of the tensor", f"{' | '.join(LAYOUTS)}; default NCHW"),
    (
        "dtype",
        "element type fed to the model",
        f"{' | '.join(DTYPES)}; uint8 keeps scale 1, mean 0, std 1",
    ),
)
CONTRACT_SCHEMA = (
    ("inputs", "one entry per model input, by its name", "an object: {name: entry}"),
    (
        "shape",
        'the full shape, axis 0 written "batch"',
        'e.g. ["batch", 3, 224, 224]; fixed dims as the model fixes them',
    ),
    (
        "batch",
        "the batch sizes it is built and fed with",
        '{"sizes": [1, 8]} or {"min", "opt", "max"}',
    ),
    (
        "dynamic",
        "a range for every other symbolic axis, by its index",
        '{"2": {"min", "opt", "max"}}; {} when none',
    ),
)


def spec_problems(spec):
    """Return every problem of a preprocessing spec, one per field (empty when it is valid)."""
    if not isinstance(spec, dict):
        return [_problem(spec)]
    color = {"color_order": spec["color_order"]} if "color_order" in spec else {}
    color = color if not _problem(color) else {}
    problems = [_problem({**color, key: value}) for key, value in spec.items()]
    problems = [problem for problem in problems if problem]
    return problems or [problem for problem in [_problem(spec)] if problem]


def _problem(spec):
    try:
        validate_spec(spec)
    except SpecError as exc:
        return str(exc)
    return None


class SpecFields(forms.Form):
    preprocessing = PrettyJSONField(
        required=False,
        widget=forms.Textarea(
            attrs={
                "rows": 6,
                "class": "code",
                "spellcheck": "false",
                "placeholder": json.dumps(EXAMPLE_SPEC, indent=2),
            }
        ),
        help_text="How an image becomes the input tensor; empty: no spec (add one later as a "
        "new version). Fields and allowed values below.",
    )
    contract = PrettyJSONField(
        required=False,
        widget=forms.Textarea(
            attrs={
                "rows": 6,
                "class": "code",
                "spellcheck": "false",
                "placeholder": json.dumps(EXAMPLE_CONTRACT, indent=2),
            }
        ),
        help_text="Input-shape contract; empty takes the model's own shapes with batch size 1 "
        "(a model with open height or width needs one).",
    )
    spec_schema, contract_schema = SPEC_SCHEMA, CONTRACT_SCHEMA
    example_spec = json.dumps(EXAMPLE_SPEC, indent=2)
    example_contract = json.dumps(EXAMPLE_CONTRACT, indent=2)

    def clean_preprocessing(self):
        spec = self.cleaned_data["preprocessing"]
        if spec in (None, "", {}):
            return spec
        if problems := spec_problems(spec):
            raise forms.ValidationError(problems)
        return spec


class VersionUploadForm(SpecFields):
    file = forms.FileField(
        help_text=".onnx, a .zip of an ONNX model with its external data, or a torch.export .pt2."
    )
    notes = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}), required=False, max_length=TEXT
    )
    export_on = forms.ModelChoiceField(
        queryset=DeviceClass.objects.none(),
        required=False,
        help_text="For a .pt2: the device class whose worker (with torch) exports it to ONNX.",
    )
    field_order = ["file", "notes", "preprocessing", "contract", "export_on"]

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        self.team = team
        self.fields["export_on"].queryset = team_classes(team)


class NewModelForm(VersionUploadForm):
    name = forms.CharField(max_length=100)
    description = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}), required=False, max_length=TEXT
    )
    field_order = ["name", "description", *VersionUploadForm.field_order]

    def clean_name(self):
        """Refuse a taken name with the other fields' errors, before the file is validated."""
        name = self.cleaned_data["name"]
        if self.team.models.filter(name=name).exists():
            raise forms.ValidationError(f"{self.team} already has a model named {name!r}.")
        return name


class DeriveVersionForm(SpecFields):
    notes = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}), required=False, max_length=TEXT
    )


class EditNotesForm(forms.Form):
    notes = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), required=False, max_length=TEXT
    )
    tags = forms.CharField(required=False, help_text="Comma-separated.", max_length=TEXT)

    def clean_tags(self):
        tags = tidy_tags(self.cleaned_data["tags"].split(","))
        if any(len(tag) > TAG_CHARS for tag in tags):
            raise forms.ValidationError(f"Tags are at most {TAG_CHARS} characters.")
        return tags


class DatasetForm(forms.Form):
    kind = forms.ChoiceField(choices=DatasetKind.choices())
    name = forms.SlugField(max_length=100)
    file = forms.FileField(
        help_text=".npz with one array per model input, named after it, one sample per row "
        "and the same number of rows in each (np.savez(f, image=..., mask=..., labels=...); "
        "a single-input model may call its array 'inputs'), each in its input's dtype family "
        "(float inputs also take integer pixels, bool inputs 0/1). Or, for a single-input "
        "model, a .zip of images, preprocessed with this version's spec. Labels, needed for "
        "validation, are those of the version's task. Classifier: 'labels' (a class index per "
        "sample), or labels.csv (filename,label). Detection, keypoints, instance segmentation: "
        "label_boxes (x1, y1, x2, y2 in model-input pixels), label_classes, label_sample (and "
        "label_keypoints), or a COCO annotations.json or YOLO labels/<image stem>.txt, mapped "
        "through the resize and crop. Semantic segmentation: label_masks, or "
        "masks/<image stem>.png (class ids, 255 = ignore). Text recognition: label_texts, or "
        "labels.txt (filename, tab, text)."
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


class TaskForm(forms.Form):
    """Confirm or correct what a version does and how to read its outputs (workers/tasks)."""

    task = forms.ChoiceField(choices=[])
    params = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4}),
        required=False,
        help_text='JSON: the head\'s layout and how to read it, e.g. {"head": "anchors_last", '
        '"box_format": "cxcywh", "score_threshold": 0.25, "iou_threshold": 0.45}. '
        "Leave it empty for the task's defaults.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["task"].choices = [(name, task.label) for name, task in TASKS.items()]

    def clean_params(self):
        raw = self.cleaned_data["params"].strip()
        if not raw:
            return {}
        try:
            params = json_input.parse(raw, "params")
        except json_input.JSONInputError as exc:
            raise forms.ValidationError(str(exc)) from exc
        if not isinstance(params, dict):
            raise forms.ValidationError('The params are a JSON object: {"key": value}.')
        return params
