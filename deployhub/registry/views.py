"""Pages for models and their versions."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import IntegrityError, transaction
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.jobs.actions import submit_job
from deployhub.jobs.models import JobKind
from deployhub.registry.forms import BenchmarkForm, NewModelForm, VersionUploadForm
from deployhub.registry.inspect import InvalidModel
from deployhub.registry.models import Model, ModelVersion
from deployhub.registry.uploads import DuplicateVersion, create_version
from deployhub.teams.access import current_team, require_role, teams_of
from deployhub.teams.models import Role


def _get_model_for_user(request, pk):
    return get_object_or_404(Model, pk=pk, team__in=teams_of(request.user))


def _get_version_for_user(request, pk):
    queryset = ModelVersion.objects.select_related("model__team")
    return get_object_or_404(queryset, pk=pk, model__team__in=teams_of(request.user))


@login_required
def models_list(request):
    team = current_team(request)
    if team is None:
        raise Http404("You are not a member of any team yet.")
    form = NewModelForm()
    if request.method == "POST":
        require_role(request.user, team, Role.ENGINEER)
        form = NewModelForm(request.POST, request.FILES)
        if form.is_valid() and (model := _create_model(request, team, form)):
            messages.success(request, f"Model {model} created with version 1.")
            return redirect(model)
    models = team.models.prefetch_related("versions").order_by("name")
    return render(request, "registry/models.html", {"models": models, "form": form})


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
            create_version(model, data["file"], request.user, notes=data["notes"])
    except IntegrityError:
        form.add_error("name", f"{team} already has a model named {data['name']!r}.")
        return None
    except InvalidModel as exc:
        form.add_error("file", str(exc))
        return None
    return model


@login_required
def model_detail(request, pk):
    model = _get_model_for_user(request, pk)
    form = VersionUploadForm()
    if request.method == "POST":
        require_role(request.user, model.team, Role.ENGINEER)
        form = VersionUploadForm(request.POST, request.FILES)
        if form.is_valid() and (version := _upload_version(request, model, form)):
            messages.success(request, f"Uploaded {version}.")
            return redirect(version)
    return render(request, "registry/model_detail.html", {"model": model, "form": form})


def _upload_version(request, model, form):
    try:
        return create_version(
            model, form.cleaned_data["file"], request.user, notes=form.cleaned_data["notes"]
        )
    except DuplicateVersion as exc:
        form.add_error("file", str(exc))
        form.duplicate = exc.version
    except InvalidModel as exc:
        form.add_error("file", str(exc))
    return None


@login_required
def version_detail(request, pk):
    version = _get_version_for_user(request, pk)
    context = {
        "version": version,
        "model": version.model,
        "benchmark_form": BenchmarkForm(team=version.team),
        "benchmarks": BenchmarkRun.objects.for_version(version),
        "jobs": version.jobs.select_related("device_class", "device")[:20],
    }
    return render(request, "registry/version_detail.html", context)


@login_required
def version_results(request, pk):
    """Return the results table alone, so the page can refresh it when a job finishes."""
    version = _get_version_for_user(request, pk)
    benchmarks = BenchmarkRun.objects.for_version(version)
    return render(request, "registry/_results.html", {"benchmarks": benchmarks})


@login_required
@require_POST
def version_benchmark(request, pk):
    version = _get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    form = BenchmarkForm(request.POST, team=version.team)
    if not form.is_valid():
        messages.error(request, f"Benchmark not queued: {form.errors.as_text()}")
        return redirect(version)
    job = submit_job(
        team=version.team,
        kind=JobKind.BENCHMARK,
        device_class=form.cleaned_data["device_class"],
        user=request.user,
        model_version=version,
        params=form.params(),
    )
    messages.success(request, f"Benchmark queued as job #{job.pk}.")
    return redirect(f"{version.get_absolute_url()}#job-{job.pk}")
