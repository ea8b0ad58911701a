"""API v1 for people and pipelines: the model registry (models, versions, their files, lineage,
datasets, golden sets, task declarations and conversions).

Uploads are multipart (a file field `file` beside form fields); the other bodies are JSON.
Every call here is open to pipeline tokens: they upload, read and convert. Another team's
model or version is 404; reading takes a member, changing anything an engineer.
"""

from typing import Annotated, Any, Literal

from django.conf import settings
from django.core.files.storage import default_storage
from django.shortcuts import get_object_or_404
from django.urls import reverse
from ninja import Field, File, Form, Router, Status, UploadedFile
from ninja.pagination import paginate
from pydantic import WithJsonSchema

from deployhub.api.auth import BadInput, Conflict, field_length, text
from deployhub.api.v1 import ERRORS, PIPELINES, Error, Listed, Page, Schema, Strict, answers
from deployhub.conversions.actions import (
    ConversionRefused,
    conversion_class,
    submit_convert,
    submit_export,
)
from deployhub.core import json_input
from deployhub.core.downloads import file_download
from deployhub.registry.access import get_model_for_user, get_version_for_user
from deployhub.registry.edits import TAG_CHARS, describe_model, edit_notes
from deployhub.registry.golden import create_golden_set
from deployhub.registry.models import Dataset, Model, VersionFormat
from deployhub.registry.tasks import TaskRefused, declare_task
from deployhub.registry.uploads import (
    DuplicateModelName,
    DuplicateVersion,
    create_dataset,
    create_model,
    create_version,
    derive_version,
)
from deployhub.teams.access import require_role, teams_of
from deployhub.teams.models import Role
from workers.tasks import TASKS

# Its django-ninja operations (api/openapi.py mounts it at /api/v1/).
router = Router(tags=["models"])

TEXT = settings.DEPLOYHUB_MAX_TEXT_CHARS
NAME = field_length(Model, "name")


def read_by_the_hub(json_schema, description):
    """A field whose type the schema states and the hub's own check enforces, refusing any
    other value (400) in words that say what it takes, as the version page does."""
    return Annotated[Any, WithJsonSchema({**json_schema, "description": description})]


# A JSON object sent as a form field's text (a multipart upload cannot nest JSON).
JSON_TEXT = {"type": "string", "contentMediaType": "application/json"}


# --- What the calls answer ------------------------------------------------------------------


class VersionOut(Schema):
    id: int
    model: int
    number: int
    url: str = Field(description="The version's page.")
    download: str = Field(description="GET it for the version's file.")
    format: str
    sha256: str
    size: int
    ir_version: int | None
    opset: int | None
    producer: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    graph: dict[str, Any]
    external_data: list[Any]
    contract: dict[str, Any]
    preprocessing: dict[str, Any]
    task: dict[str, Any]
    warnings: list[Any]
    parent: int | None = Field(description="The version this one was derived or exported from.")
    export_report: dict[str, Any]
    notes: str
    tags: list[str]
    created_at: str


class ModelOut(Schema):
    id: int
    name: str
    team: str
    description: str
    url: str = Field(description="The model's page.")


class ModelDetailOut(ModelOut):
    versions: list[VersionOut]


class ModelCreatedOut(ModelOut):
    version: VersionOut


class DatasetOut(Schema):
    id: int
    name: str
    kind: str
    samples: int
    sha256: str
    size: int
    input_shape: list[Any]
    input_dtype: str
    has_labels: bool
    classes: int | None
    task: str
    label_summary: str
    checked_against: int | None
    created_at: str


class GoldenRunOut(Schema):
    engine: int | None
    job: int | None
    passed: bool | None
    failing: Any
    reference_passed: bool | None
    outputs: Any
    created_at: str


class GoldenOut(Schema):
    id: int
    name: str
    version: int
    format: str
    sha256: str
    size: int
    pairs: int
    inputs: list[str]
    outputs: list[str]
    atol: float
    rtol: float
    created_at: str
    runs: list[GoldenRunOut] = Field(description="The newest check of the set on each engine.")


class TaskOut(Schema):
    version: int
    tasks: list[str] = Field(description="Every task a version may declare.")
    task: str | None = None
    params: dict[str, Any] | None = None
    why: str | None = None
    confirmed: bool | None = None


class ConvertedOut(Schema):
    job: int
    state: str
    opset: int
    device_class: str
    url: str


class LinkOut(Schema):
    id: int
    number: int
    format: str
    opset: int | None
    parent: int | None
    url: str
    notes: str
    created_at: str


class LineageOut(Schema):
    version: int
    ancestors: list[LinkOut] = Field(
        description="Its parent, that one's parent, ... (nearest first)."
    )
    children: list[LinkOut] = Field(description="The versions derived or exported from it.")


# --- What the calls take --------------------------------------------------------------------


class VersionForm(Strict):
    """The form fields of a version's upload, beside its file."""

    notes: str = Field("", json_schema_extra={"maxLength": TEXT})
    preprocessing: str = Field(
        "", json_schema_extra=JSON_TEXT, description="The preprocessing spec, as JSON text."
    )
    contract: str = Field(
        "", json_schema_extra=JSON_TEXT, description="The input-shape contract, as JSON text."
    )
    export_on: str | None = Field(
        None, description="A .pt2's device class (slug) to export it to ONNX on."
    )


class ModelForm(VersionForm):
    """A new model's form fields, beside its first version's file."""

    name: str = Field(max_length=NAME)
    description: str = Field("", json_schema_extra={"maxLength": TEXT})
    team: str | None = Field(None, description="Its team's slug; needed when you are in several.")


class DatasetForm(Strict):
    kind: Literal["calibration", "validation"]
    name: str = Field(max_length=field_length(Dataset, "name"))


class GoldenForm(Strict):
    name: str = Field(json_schema_extra={"maxLength": NAME})
    atol: str | None = Field(None, description="Absolute tolerance, a number of 0 or more.")
    rtol: str | None = Field(None, description="Relative tolerance, a number of 0 or more.")


class ModelEdit(Strict):
    description: str = Field(max_length=TEXT)


class VersionEdit(Strict):
    notes: str | None = Field(None, max_length=TEXT)
    tags: list[Annotated[str, Field(max_length=TAG_CHARS)]] | None = Field(
        None, description="Replaces the version's tags (each kept once, sorted)."
    )


class DeriveIn(Strict):
    notes: str = Field("", max_length=TEXT)
    preprocessing: dict[str, Any] | None = Field(
        None, description="The new version's spec ({} for none); left out: this version's."
    )
    contract: dict[str, Any] | None = Field(
        None, description="The new version's contract; left out: this version's."
    )


class TaskIn(Strict):
    task: read_by_the_hub({"type": "string", "enum": sorted(TASKS)}, "Left out: the current.") = (
        None
    )
    params: read_by_the_hub({"type": "object"}, "Left out: the task's current or defaults.") = None


class ConvertIn(Strict):
    opset: read_by_the_hub({"type": "integer"}, "The opset to convert to (17 by default).") = None
    device_class: str | None = Field(None, description="The class to run the conversion on.")


# --- Models ---------------------------------------------------------------------------------


def version_json(version):
    return {
        "id": version.pk,
        "model": version.model_id,
        "number": version.number,
        "url": version.get_absolute_url(),
        "download": reverse("api_version_download", args=[version.pk]),
        "format": version.format,
        "sha256": version.sha256,
        "size": version.size,
        "ir_version": version.ir_version,
        "opset": version.opset,
        "producer": version.producer,
        "inputs": version.inputs,
        "outputs": version.outputs,
        "graph": version.graph,
        "external_data": version.external_data,
        "contract": version.contract,
        "preprocessing": version.preprocessing,
        "task": version.task,
        "warnings": version.warnings,
        "parent": version.parent_id,
        "export_report": version.export_report,
        "notes": version.notes,
        "tags": version.tags,
        "created_at": version.created_at.isoformat(),
    }


def model_json(model, versions=False):
    body = {
        "id": model.pk,
        "name": model.name,
        "team": model.team.slug,
        "description": model.description,
        "url": model.get_absolute_url(),
    }
    if versions:
        body["versions"] = [version_json(v) for v in model.versions.order_by("number")]
    return body


@router.get("models", response=answers(list[ModelOut]), auth=PIPELINES, url_name="api_models")
@paginate(Page)
def models(request):
    """The models of the caller's teams, by name."""
    listed = Model.objects.filter(team__in=teams_of(request.user)).select_related("team")
    return Listed(listed.order_by("name", "pk"), model_json)


@router.post(
    "models",
    response=answers(ModelCreatedOut, status=201, also=(413,)),
    auth=PIPELINES,
    url_name="api_models",
)
def create_model_with_its_file(request, file: File[UploadedFile], fields: Form[ModelForm]):
    """Create a model with its first version (an engineer): multipart with the file as `file`.
    A .pt2 is exported to ONNX on `export_on` (or the team's first class) as it is stored."""
    team = _team(request, fields.team)
    require_role(request.user, team, Role.ENGINEER)
    name = fields.name.strip()
    if not name:
        raise BadInput("A model needs a 'name'.")
    description = _text(fields, "description")
    export_on = _export_on(team, fields.export_on)
    try:
        model, version = create_model(
            team,
            request.user,
            name=name,
            description=description,
            uploaded_file=file,
            **_version_fields(fields),
        )
    except DuplicateModelName as exc:
        raise BadInput(str(exc)) from exc
    _export_pt2(request, version, export_on)
    return Status(201, {**model_json(model), "version": version_json(version)})


def _team(request, slug):
    """Return the caller's team named by slug, or their only team when none is named."""
    teams = teams_of(request.user)
    if slug:
        return get_object_or_404(teams, slug=slug)
    if teams.count() != 1:
        raise BadInput("You are in several teams: say which one with the 'team' field (its slug).")
    return teams.get()


def _text(fields, name):
    """A long text field, refused past DEPLOYHUB_MAX_TEXT_CHARS in the words of every call."""
    return text({name: getattr(fields, name)}, name, "", max_length=TEXT)


def _version_fields(fields):
    return {
        "notes": _text(fields, "notes"),
        "preprocessing": _json_field(fields, "preprocessing"),
        "contract": _json_field(fields, "contract"),
    }


def _json_field(fields, name):
    raw = getattr(fields, name).strip()
    if not raw:
        return None
    try:
        return json_input.parse(raw, name)
    except json_input.JSONInputError as exc:
        raise BadInput(str(exc)) from exc


def _export_on(team, slug):
    """Return the team's class named by 'export_on', or None when none is named; an unknown
    one is refused before anything is stored (never another class in its place)."""
    chosen = team.device_classes.filter(slug=slug).first() if slug else None
    if slug and chosen is None:
        raise BadInput(f"{team} has no device class {slug[:40]!r} to export on.")
    return chosen


def _export_pt2(request, version, chosen):
    """Queue a .pt2's export on the class chosen (or the team's first)."""
    if version.format != VersionFormat.PT2:
        return
    if device_class := conversion_class(version, chosen):
        submit_export(version, device_class, request.user)


@router.get(
    "models/{int:pk}", response=answers(ModelDetailOut), auth=PIPELINES, url_name="api_model"
)
def model_detail(request, pk: int):
    """A model with every version, oldest first."""
    return model_json(get_model_for_user(request, pk), versions=True)


@router.patch(
    "models/{int:pk}", response=answers(ModelDetailOut), auth=PIPELINES, url_name="api_model"
)
def model_edit(request, pk: int, payload: ModelEdit):
    """Change the model's description (an engineer); its name and versions stay."""
    model = get_model_for_user(request, pk)
    require_role(request.user, model.team, Role.ENGINEER)
    describe_model(model, request.user, payload.description)
    return model_json(model, versions=True)


@router.get(
    "models/{int:pk}/versions",
    response=answers(list[VersionOut]),
    auth=PIPELINES,
    url_name="api_model_versions",
)
@paginate(Page)
def model_versions(request, pk: int):
    """The model's versions, oldest first."""
    model = get_model_for_user(request, pk)
    return Listed(model.versions.order_by("number"), version_json)


@router.post(
    "models/{int:pk}/versions",
    response=answers(VersionOut, status=201, also=(409, 413)),
    auth=PIPELINES,
    url_name="api_model_versions",
)
def upload_version(request, pk: int, file: File[UploadedFile], fields: Form[VersionForm]):
    """Upload the model's next version (an engineer): multipart with the file as `file`.
    The same file again is a 409 whose `existing` is the version that has it."""
    model = get_model_for_user(request, pk)
    require_role(request.user, model.team, Role.ENGINEER)
    export_on = _export_on(model.team, fields.export_on)
    try:
        version = create_version(model, file, request.user, **_version_fields(fields))
    except DuplicateVersion as exc:
        raise Conflict(str(exc), existing=version_json(exc.version)) from exc
    _export_pt2(request, version, export_on)
    return Status(201, version_json(version))


# --- Versions -------------------------------------------------------------------------------


@router.get(
    "versions/{int:pk}", response=answers(VersionOut), auth=PIPELINES, url_name="api_version"
)
def version_detail(request, pk: int):
    """A version: what its file holds, its spec, contract, task, parent, notes and tags."""
    return version_json(get_version_for_user(request, pk))


@router.patch(
    "versions/{int:pk}", response=answers(VersionOut), auth=PIPELINES, url_name="api_version"
)
def version_edit(request, pk: int, payload: VersionEdit):
    """Change the version's notes, tags or both (an engineer); the rest of a version never
    changes (another spec or contract: POST versions/<id>/derive)."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    edit_notes(version, request.user, notes=payload.notes, tags=payload.tags)
    return version_json(version)


BINARY = {"type": "string", "format": "binary"}
FILE_ANSWER = {
    "responses": {
        200: {
            "description": "The version's file, as uploaded (.onnx, .zip or .pt2).",
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    }
}


@router.get(
    "versions/{int:pk}/download",
    response={code: Error for code in ERRORS},
    auth=PIPELINES,
    url_name="api_version_download",
    openapi_extra=FILE_ANSWER,
)
def version_download(request, pk: int):
    """The version's file, streamed, under the name it was uploaded as."""
    version = get_version_for_user(request, pk)
    name = version.original_filename or version.download_name
    return file_download(default_storage.open(version.file.name, "rb"), name)


@router.get(
    "versions/{int:pk}/lineage",
    response=answers(LineageOut),
    auth=PIPELINES,
    url_name="api_version_lineage",
)
def version_lineage(request, pk: int):
    """Where the version comes from (its parent, that one's parent, ...) and what was
    derived, converted or exported from it."""
    version = get_version_for_user(request, pk)
    return {
        "version": version.pk,
        "ancestors": [link_json(v) for v in ancestors(version)],
        "children": [link_json(v) for v in version.children.order_by("number")],
    }


def ancestors(version):
    """Return the version's parent, that one's parent and so on, nearest first."""
    chain, seen = [], {version.pk}
    while version.parent_id is not None and version.parent_id not in seen:
        version = version.parent
        seen.add(version.pk)
        chain.append(version)
    return chain


def link_json(version):
    return {
        "id": version.pk,
        "number": version.number,
        "format": version.format,
        "opset": version.opset,
        "parent": version.parent_id,
        "url": reverse("api_version", args=[version.pk]),
        "notes": version.notes,
        "created_at": version.created_at.isoformat(),
    }


@router.post(
    "versions/{int:pk}/derive",
    response=answers(VersionOut, status=201),
    auth=PIPELINES,
    url_name="api_version_derive",
)
def version_derive(request, pk: int, payload: DeriveIn):
    """Make a new version of the same file with another spec or contract (an engineer): the
    fields left out are this version's. Nothing changed is a 400."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    given = payload.model_fields_set
    child = derive_version(
        version,
        request.user,
        notes=payload.notes,
        preprocessing=payload.preprocessing if "preprocessing" in given else version.preprocessing,
        contract=payload.contract if "contract" in given else version.contract,
    )
    return Status(201, version_json(child))


# --- Datasets and golden sets ---------------------------------------------------------------


def dataset_json(dataset):
    return {
        "id": dataset.pk,
        "name": dataset.name,
        "kind": dataset.kind,
        "samples": dataset.samples,
        "sha256": dataset.sha256,
        "size": dataset.size,
        "input_shape": dataset.input_shape,
        "input_dtype": dataset.input_dtype,
        "has_labels": dataset.has_labels,
        "classes": dataset.classes,
        "task": dataset.task,
        "label_summary": dataset.label_summary,
        "checked_against": dataset.checked_against_id,
        "created_at": dataset.created_at.isoformat(),
    }


@router.get(
    "versions/{int:pk}/datasets",
    response=answers(list[DatasetOut]),
    auth=PIPELINES,
    url_name="api_version_datasets",
)
@paginate(Page)
def version_datasets(request, pk: int):
    """The calibration and validation datasets of the version's model, by kind and name."""
    version = get_version_for_user(request, pk)
    return Listed(version.model.datasets.order_by("kind", "name"), dataset_json)


@router.post(
    "versions/{int:pk}/datasets",
    response=answers(DatasetOut, status=201, also=(413,)),
    auth=PIPELINES,
    url_name="api_version_datasets",
)
def attach_dataset(request, pk: int, file: File[UploadedFile], fields: Form[DatasetForm]):
    """Attach a calibration or validation dataset to the version's model (an engineer),
    checked against this version: multipart with the .npz or .zip of images as `file`."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    name = fields.name.strip()
    if not name:
        raise BadInput("Send 'kind' (calibration or validation), 'name' and a file 'file'.")
    dataset = create_dataset(version, file, request.user, kind=fields.kind, name=name)
    return Status(201, dataset_json(dataset))


def golden_json(golden):
    """Describe a golden set with the newest check of it on each engine."""
    return {
        "id": golden.pk,
        "name": golden.name,
        "version": golden.model_version_id,
        "format": golden.format,
        "sha256": golden.sha256,
        "size": golden.size,
        "pairs": golden.pairs,
        "inputs": golden.input_names,
        "outputs": golden.output_names,
        "atol": golden.atol,
        "rtol": golden.rtol,
        "created_at": golden.created_at.isoformat(),
        "runs": [
            {
                "engine": run.engine_id,
                "job": run.job_id,
                "passed": run.passed,
                "failing": run.failing,
                "reference_passed": run.reference_passed,
                "outputs": run.outputs,
                "created_at": run.created_at.isoformat(),
            }
            for run in golden.latest_runs()
        ],
    }


@router.get(
    "versions/{int:pk}/golden",
    response=answers(list[GoldenOut]),
    auth=PIPELINES,
    url_name="api_version_golden",
)
@paginate(Page)
def version_golden(request, pk: int):
    """The version's golden sets by name, each with its newest check on each engine."""
    version = get_version_for_user(request, pk)
    return Listed(version.golden_sets.order_by("name"), golden_json)


@router.post(
    "versions/{int:pk}/golden",
    response=answers(GoldenOut, status=201, also=(413,)),
    auth=PIPELINES,
    url_name="api_version_golden",
)
def attach_golden(request, pk: int, file: File[UploadedFile], fields: Form[GoldenForm]):
    """Attach golden input/output pairs to the version (an engineer): multipart with the .npz
    or .zip of ONNX test data as `file`."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    golden = create_golden_set(
        version, file, request.user, name=fields.name, atol=fields.atol, rtol=fields.rtol
    )
    return Status(201, golden_json(golden))


# --- Its task and conversions ---------------------------------------------------------------


def _task_json(version):
    return {"version": version.pk, "tasks": sorted(TASKS), **version.task}


@router.get(
    "versions/{int:pk}/task", response=answers(TaskOut), auth=PIPELINES, url_name="api_version_task"
)
def version_task(request, pk: int):
    """What the version does and how its outputs are read (docs/tasks.md)."""
    return _task_json(get_version_for_user(request, pk))


@router.put(
    "versions/{int:pk}/task", response=answers(TaskOut), auth=PIPELINES, url_name="api_version_task"
)
def declare_version_task(request, pk: int, payload: TaskIn):
    """Confirm or correct the version's task (an engineer): {"task", "params"}; params left
    out are the task's defaults, or its current ones when the task stays the same."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    current = version.task.get("task")
    task = payload.task or current
    params = payload.params
    if "params" not in payload.model_fields_set:
        params = version.task.get("params", {}) if task == current else {}
    try:
        declare_task(version, request.user, task, params)
    except TaskRefused as exc:
        raise BadInput(str(exc)) from exc
    return _task_json(version)


@router.post(
    "versions/{int:pk}/task", response=answers(TaskOut), auth=PIPELINES, url_name="api_version_task"
)
def declare_version_task_by_post(request, pk: int, payload: TaskIn):
    """The same as PUT, for clients that only POST."""
    return declare_version_task(request, pk, payload)


@router.post(
    "versions/{int:pk}/convert",
    response=answers(ConvertedOut, status=202),
    auth=PIPELINES,
    url_name="api_version_convert",
)
def version_convert(request, pk: int, payload: ConvertIn):
    """Queue the conversion of an ONNX version to {"opset": N} (17 by default), a child
    version made on a device of `device_class` (or the team's first): 202 and the job."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    slug = payload.device_class
    device_class = version.team.device_classes.filter(slug=slug).first() if slug else None
    if slug and device_class is None:
        raise BadInput(f"{version.team} has no device class {slug!r}.")
    try:
        job = submit_convert(version, device_class, request.user, payload.opset)
    except ConversionRefused as exc:
        raise BadInput(str(exc)) from exc
    return Status(
        202,
        {
            "job": job.pk,
            "state": job.state,
            "opset": job.params["convert_to_opset"],
            "device_class": job.device_class.slug,
            "url": reverse("api_job", args=[job.pk]),
        },
    )
