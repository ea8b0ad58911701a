"""Pages for models, their versions and datasets."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.files.storage import default_storage
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from deployhub.core.downloads import file_download
from deployhub.registry.access import get_model_for_user, get_version_for_user
from deployhub.registry.datasets import DatasetError
from deployhub.registry.edits import edit_notes
from deployhub.registry.forms import (
    DatasetForm,
    DeriveVersionForm,
    EditNotesForm,
    GoldenSetForm,
    ModelSearchForm,
    NewModelForm,
    TaskForm,
    VersionUploadForm,
)
from deployhub.registry.golden import GoldenError, create_golden_set
from deployhub.registry.inspect import InvalidModel
from deployhub.registry.models import Model
from deployhub.registry.pages import model_sections, models_list_sections, version_page
from deployhub.registry.signals import version_uploaded
from deployhub.registry.tasks import TaskRefused, declare_task
from deployhub.registry.uploads import (
    ContractRefused,
    DuplicateModelName,
    DuplicateVersion,
    SpecRefused,
    create_dataset,
    create_model,
    create_version,
    derive_version,
)
from deployhub.teams.access import current_team, require_role
from deployhub.teams.models import Role


def _upload(request, model, form):
    """Store the form's file as the model's next version; on refusal, a form error."""
    data = form.cleaned_data
    try:
        version = create_version(
            model,
            data["file"],
            request.user,
            notes=data["notes"],
            preprocessing=data["preprocessing"],
            contract=data["contract"],
        )
    except DuplicateVersion as exc:
        form.add_error("file", str(exc))
        form.duplicate = exc.version
        return None
    except InvalidModel as exc:
        form.add_error(refused_field(exc), str(exc))
        return None
    version_uploaded.send(Model, request=request, version=version, options=data)
    return version


def refused_field(exc):
    """Return the upload form's field a refusal belongs next to."""
    return {SpecRefused: "preprocessing", ContractRefused: "contract"}.get(type(exc), "file")


@login_required
def models_list(request):
    team = current_team(request)
    if team is None:
        raise Http404("You are not a member of any team yet.")
    form = NewModelForm(team=team)
    if request.method == "POST":
        require_role(request.user, team, Role.ENGINEER)
        form = NewModelForm(request.POST, request.FILES, team=team)
        if form.is_valid() and (model := _create_model(request, team, form)):
            messages.success(request, f"Model {model} created with version 1.")
            return redirect(model)
    search = ModelSearchForm(request.GET)
    models = search.filter(team.models.all()).prefetch_related("versions").order_by("name")
    context = {"models": models, "form": form, "search": search, "total": team.models.count()}
    context.update(models_list_sections.context(team))
    return render(request, "registry/models.html", context, status=400 if form.errors else 200)


def _create_model(request, team, form):
    """Create a model and its first version together, or nothing (the form says why)."""
    data = form.cleaned_data
    try:
        model, version = create_model(
            team,
            request.user,
            name=data["name"],
            description=data["description"],
            uploaded_file=data["file"],
            notes=data["notes"],
            preprocessing=data["preprocessing"],
            contract=data["contract"],
        )
    except DuplicateModelName as exc:
        form.add_error("name", str(exc))
        return None
    except InvalidModel as exc:
        form.add_error(refused_field(exc), str(exc))
        return None
    version_uploaded.send(Model, request=request, version=version, options=data)
    return model


@login_required
def model_detail(request, pk):
    model = get_model_for_user(request, pk)
    latest = model.latest_version()
    initial = {"preprocessing": latest.preprocessing, "contract": ""} if latest else {}
    form = VersionUploadForm(team=model.team, initial=initial)
    if request.method == "POST":
        require_role(request.user, model.team, Role.ENGINEER)
        form = VersionUploadForm(request.POST, request.FILES, team=model.team)
        if form.is_valid() and (version := _upload(request, model, form)):
            messages.success(request, f"Uploaded {version}.")
            return redirect(version)
    context = {"model": model, "form": form, "datasets": model.datasets.all()}
    context.update(model_sections.context(model, request))
    return render(
        request, "registry/model_detail.html", context, status=400 if form.errors else 200
    )


@login_required
def version_detail(request, pk):
    version = get_version_for_user(request, pk)
    return version_page(request, version)


@login_required
def version_download(request, pk):
    """Serve a version's file as an attachment, under the name it was uploaded as."""
    version = get_version_for_user(request, pk)
    name = version.original_filename or version.download_name
    return file_download(default_storage.open(version.file.name, "rb"), name)


@login_required
@require_POST
def version_derive(request, pk):
    """Create a new version of the same file with another spec or contract."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    form = DeriveVersionForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            child = derive_version(
                version,
                request.user,
                notes=data["notes"],
                preprocessing=data["preprocessing"],
                contract=data["contract"],
            )
            messages.success(request, f"Created {child} with the new spec and contract.")
            return redirect(child)
        except InvalidModel as exc:
            form.add_error(None, str(exc))
    return version_page(request, version, status=400, derive_form=form)


@login_required
@require_POST
def version_notes(request, pk):
    """Change a version's notes and tags: the only things about a version that may change."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    form = EditNotesForm(request.POST)
    if not form.is_valid():
        said = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in form.errors.items())
        messages.error(request, f"Notes and tags not saved: {said}")
    else:
        data = form.cleaned_data
        edit_notes(version, request.user, notes=data["notes"], tags=data["tags"])
        messages.success(request, "Notes and tags saved.")
    return redirect(version)


@login_required
@require_POST
def version_task(request, pk):
    """Confirm or correct what the version does and how its outputs are read."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    form = TaskForm(request.POST)
    if form.is_valid():
        try:
            declare_task(
                version, request.user, form.cleaned_data["task"], form.cleaned_data["params"]
            )
            messages.success(request, f"{version} is declared a {version.task['task']} model.")
            return redirect(f"{version.get_absolute_url()}#task")
        except TaskRefused as exc:
            form.add_error("params", str(exc))
    return version_page(request, version, status=400, task_form=form)


@login_required
@require_POST
def version_dataset(request, pk):
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    form = DatasetForm(request.POST, request.FILES)
    if form.is_valid():
        data = form.cleaned_data
        try:
            dataset = create_dataset(
                version, data["file"], request.user, kind=data["kind"], name=data["name"]
            )
            messages.success(request, f"Dataset {dataset} attached.")
            return redirect(f"{version.get_absolute_url()}#datasets")
        except (InvalidModel, DatasetError) as exc:
            form.add_error("file", str(exc))
    return version_page(request, version, status=400, dataset_form=form)


@login_required
@require_POST
def version_golden(request, pk):
    """Attach golden input/output pairs to a version."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    form = GoldenSetForm(request.POST, request.FILES)
    if form.is_valid():
        data = form.cleaned_data
        try:
            golden = create_golden_set(
                version,
                data["file"],
                request.user,
                name=data["name"],
                atol=data["atol"],
                rtol=data["rtol"],
            )
            messages.success(request, f"Golden set {golden} attached.")
            return redirect(f"{version.get_absolute_url()}#golden")
        except (InvalidModel, GoldenError) as exc:
            form.add_error("file", str(exc))
    return version_page(request, version, status=400, golden_form=form)
