"""Pages for models, their versions and datasets."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import IntegrityError, transaction
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from deployhub.benchmarks.actions import BenchmarkRefused, submit_benchmark
from deployhub.benchmarks.forms import BenchmarkForm
from deployhub.benchmarks.models import BenchmarkRun
from deployhub.engines.actions import compatibility_matrix
from deployhub.engines.forms import CompileForm
from deployhub.engines.models import Engine
from deployhub.engines.preflight import preflight_grid
from deployhub.registry.access import get_model_for_user, get_version_for_user
from deployhub.registry.contract import contract_warnings
from deployhub.registry.datasets import DatasetError
from deployhub.registry.diff import diff_versions
from deployhub.registry.exports import ConversionRefused, submit_convert, submit_export
from deployhub.registry.forms import (
    DatasetForm,
    DeriveVersionForm,
    EditNotesForm,
    GoldenSetForm,
    NewModelForm,
    VersionUploadForm,
)
from deployhub.registry.golden import GoldenError, create_golden_set
from deployhub.registry.inspect import InvalidModel
from deployhub.registry.models import Model, VersionFormat
from deployhub.registry.uploads import (
    DuplicateVersion,
    create_dataset,
    create_version,
    derive_version,
)
from deployhub.teams.access import current_team, require_role
from deployhub.teams.models import Event, Role
from workers.backends.registry import BACKENDS
from workers.preprocessing import generate_code


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
        form.add_error("file", str(exc))
        return None
    if version.format == VersionFormat.PT2:
        _queue_export(request, version, data["export_on"])
    return version


def _queue_export(request, version, device_class):
    device_class = device_class or version.team.device_classes.first()
    if device_class is None:
        messages.warning(request, "No device class to export on: register one, then export.")
        return
    job = submit_export(version, device_class, request.user)
    messages.info(request, f"Export to ONNX queued on {device_class} as job #{job.pk}.")


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
    models = team.models.prefetch_related("versions").order_by("name")
    status = 400 if form.errors else 200
    return render(request, "registry/models.html", {"models": models, "form": form}, status=status)


def _create_model(request, team, form):
    """Create a model and its first version together, or nothing (the form says why)."""
    data = form.cleaned_data
    try:
        with transaction.atomic():
            model = Model.objects.create(
                team=team,
                name=data["name"],
                description=data["description"],
                created_by=request.user,
            )
            if _upload(request, model, form) is None:
                raise InvalidModel("refused")  # rolls the model back; the form has the reason
    except IntegrityError:
        form.add_error("name", f"{team} already has a model named {data['name']!r}.")
        return None
    except InvalidModel:
        return None
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
    return render(
        request, "registry/model_detail.html", context, status=400 if form.errors else 200
    )


@login_required
def version_detail(request, pk):
    version = get_version_for_user(request, pk)
    return render(request, "registry/version_detail.html", _version_context(version))


def version_page(request, version, status=200, **extra):
    """Render the version page with what a refused action hands back (a form, an error)."""
    context = _version_context(version, **extra)
    return render(request, "registry/version_detail.html", context, status=status)


def _version_context(version, **forms):
    previous = version.previous()
    gpu_backends = {name for name, backend in BACKENDS.items() if backend.needs_gpu}
    gpu_classes = [c for c in version.team.device_classes.all() if set(c.backends) & gpu_backends]
    return {
        "version": version,
        "model": version.model,
        "benchmark_form": BenchmarkForm(team=version.team, version=version),
        "derive_form": DeriveVersionForm(
            initial={"preprocessing": version.preprocessing, "contract": version.contract}
        ),
        "notes_form": EditNotesForm(
            initial={"notes": version.notes, "tags": ", ".join(version.tags)}
        ),
        "dataset_form": DatasetForm(),
        "golden_form": GoldenSetForm(),
        **forms,
        "benchmarks": BenchmarkRun.objects.for_version(version),
        "jobs": version.jobs.select_related("device_class", "device")[:20],
        "code": generate_code(version.preprocessing, title=str(version))
        if version.preprocessing
        else "",
        "gpu_warnings": contract_warnings(version.contract, version.inputs, gpu=True)
        if gpu_classes and version.contract
        else [],
        "previous": previous,
        "diff": diff_versions(previous, version) if previous else [],
        "children": version.children.all(),
        "datasets": version.model.datasets.all(),
        "golden_sets": version.golden_sets.all(),
        "engines": Engine.objects.for_version(version),
        "matrices": _matrices(version),
        "compile_form": CompileForm(team=version.team),
        "auto_runs": version.auto_runs.select_related("device_class")[:5],
        "preflight": [
            (dc, preflight_grid(version, dc)) for dc in version.team.device_classes.all()
        ],
    }


def _matrices(version):
    """Return (device class, compatibility rows) for each class that has engines of the version."""
    classes = version.team.device_classes.filter(engines__model_version=version).distinct()
    return [(device_class, compatibility_matrix(version, device_class)) for device_class in classes]


@login_required
def version_results(request, pk):
    """Return the results table alone, so the page can refresh it when a job finishes."""
    version = get_version_for_user(request, pk)
    benchmarks = BenchmarkRun.objects.for_version(version)
    return render(request, "registry/_results.html", {"benchmarks": benchmarks})


@login_required
@require_POST
def version_benchmark(request, pk):
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    form = BenchmarkForm(request.POST, team=version.team, version=version)
    if not form.is_valid():
        messages.error(request, "Benchmark not queued: see the form below.")
        context = _version_context(version, benchmark_form=form)
        return render(request, "registry/version_detail.html", context, status=400)
    try:
        job = submit_benchmark(form, request.user, version)
    except BenchmarkRefused as exc:
        messages.error(request, str(exc))
        return redirect(version)
    messages.success(request, f"Benchmark queued as job #{job.pk}.")
    return redirect(f"{version.get_absolute_url()}#job-{job.pk}")


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
    context = _version_context(version, derive_form=form)
    return render(request, "registry/version_detail.html", context, status=400)


@login_required
@require_POST
def version_notes(request, pk):
    """Change a version's notes and tags: the only things about a version that may change."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    form = EditNotesForm(request.POST)
    if form.is_valid():
        version.notes, version.tags = form.cleaned_data["notes"], form.cleaned_data["tags"]
        version.save(update_fields=["notes", "tags"])
        Event.record(version.team, request.user, "version.notes", version)
        messages.success(request, "Notes and tags saved.")
    return redirect(version)


def team_class(team, pk):
    """Return the team's device class with this id (as a form posts it); None for anything else."""
    return team.device_classes.filter(pk=pk).first() if str(pk or "").isdigit() else None


@login_required
@require_POST
def version_export(request, pk):
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    device_class = team_class(version.team, request.POST.get("device_class"))
    _queue_export(request, version, device_class)
    return redirect(version)


@login_required
@require_POST
def version_convert(request, pk):
    """Queue the conversion of an ONNX version to another opset (a derived child version)."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    device_class = team_class(version.team, request.POST.get("device_class"))
    try:
        job = submit_convert(version, device_class, request.user, request.POST.get("opset"))
    except ConversionRefused as exc:
        messages.error(request, f"Not converted: {exc}")
        return redirect(f"{version.get_absolute_url()}#lineage")
    opset = job.params["convert_to_opset"]
    messages.info(
        request, f"Conversion to opset {opset} queued on {job.device_class} as job #{job.pk}."
    )
    return redirect(f"{version.get_absolute_url()}#lineage")


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
    context = _version_context(version, dataset_form=form)
    return render(request, "registry/version_detail.html", context, status=400)


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
    context = _version_context(version, golden_form=form)
    return render(request, "registry/version_detail.html", context, status=400)
