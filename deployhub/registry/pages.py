"""The version page, assembled from what each app contributes, so registry imports none of them.

Registry draws the version's own facts (file, spec, contract, lineage, datasets,
golden sets). Each app above it adds its part in its AppConfig.ready() with
contribute(provider, slot=..., template=...): provider(version) returns the
context its template reads, and the template is drawn in a slot of
registry/version_detail.html, in the order the apps are installed (parity in
"checks", after the preprocessing; conversions' forms in "lineage"; benchmarks
then engines in "work"; the jobs table in "activity", at the end). A refused
action re-renders the page with its bound form through
version_page(..., <name>_form=form), which wins over the provider's empty one.
The model page takes parts the same way (contribute_to_model_page): figures draws
the model's home there (explorer, best engine per class, exports).
"""

import json

from django.shortcuts import render

from deployhub.registry.contract import contract_warnings
from deployhub.registry.diff import diff_versions
from deployhub.registry.forms import (
    DatasetForm,
    DeriveVersionForm,
    EditNotesForm,
    GoldenSetForm,
    TaskForm,
)
from deployhub.registry.tasks import proposed_task
from deployhub.sections import Sections
from workers.backends.known import BACKENDS
from workers.preprocessing import generate_code

SLOTS = ("checks", "lineage", "work", "activity")
_providers = []
_sections = {slot: [] for slot in SLOTS}


def contribute(provider=None, *, slot=None, template=None, read_first=False):
    """Add provider(version) -> dict to every version page's context, and template to a slot.

    Called from an AppConfig.ready(); calling it again with the same arguments adds nothing.
    read_first: the provider reads before every other part, whatever the apps' order (the
    jobs table: a job it reads unfinished is watched by the page, and one it reads finished
    has its engine, run or gate in every part read after it).
    """
    if provider is not None and provider not in _providers:
        _providers.insert(0 if read_first else len(_providers), provider)
    if template is not None and template not in _sections[slot]:
        _sections[slot].append(template)


_model_parts = []


def contribute_to_model_page(template, provider=None):
    """Draw template on every model page, below its versions, with provider(model, request)."""
    if not any(part[0] == template for part in _model_parts):
        _model_parts.append((template, provider))


def model_context(model, request):
    """Return the context the model page's contributed parts read, and their templates."""
    context = {"model_sections": [template for template, _ in _model_parts]}
    for _, provider in _model_parts:
        if provider is not None:
            context.update(provider(model, request))
    return context


def version_context(version, **forms):
    """Return the version page's context: registry's part, each app's part, then `forms`."""
    context = {**_registry_part(version), "sections": _sections}
    for provider in _providers:
        context.update(provider(version))
    context.update(forms)
    return context


def version_page(request, version, status=200, **forms):
    """Render the version page with what a refused action hands back (a form, an error)."""
    context = version_context(version, **forms)
    return render(request, "registry/version_detail.html", context, status=status)


def _registry_part(version):
    previous = version.previous()
    return {
        "version": version,
        "model": version.model,
        "derive_form": DeriveVersionForm(
            initial={"preprocessing": version.preprocessing, "contract": version.contract}
        ),
        "notes_form": EditNotesForm(
            initial={"notes": version.notes, "tags": ", ".join(version.tags)}
        ),
        "dataset_form": DatasetForm(),
        **_task_part(version),
        "golden_form": GoldenSetForm(),
        "code": generate_code(version.preprocessing, title=str(version))
        if version.preprocessing
        else "",
        "gpu_warnings": _gpu_warnings(version),
        "previous": previous,
        "diff": diff_versions(previous, version) if previous else [],
        "children": version.children.all(),
        "datasets": version.model.datasets.all(),
        "golden_sets": version.golden_sets.all(),
    }


def _task_part(version):
    """The version's task, or for one stored before tasks (judged as a classifier until a
    person declares one) what its outputs suggest, offered in the form and never applied."""
    shown = version.task or proposed_task(
        {"inputs": version.inputs, "outputs": version.outputs, "graph": version.graph}
    )
    initial = {"task": shown.get("task"), "params": json.dumps(shown.get("params", {}), indent=1)}
    return {
        "task": shown,
        "task_declared": bool(version.task),
        "task_form": TaskForm(initial=initial),
    }


def _gpu_warnings(version):
    """What the version's contract leaves out that a GPU build needs, when the team has GPUs."""
    gpu_backends = {name for name, backend in BACKENDS.items() if backend.needs_gpu}
    classes = version.team.device_classes.all()
    if not version.contract or not any(set(c.backends) & gpu_backends for c in classes):
        return []
    return contract_warnings(version.contract, version.inputs, gpu=True)


# The models list's parts that apps above registry draw (demo: the ResNet-18 sample button).
models_list_sections = Sections("models_list_sections")
