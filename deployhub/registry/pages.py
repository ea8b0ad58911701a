"""The version page, assembled from what each app contributes, so registry imports none of them.

Registry draws the version's own facts (file, spec, contract, lineage, datasets,
golden sets). Each app above it adds its part in its AppConfig.ready() with
version_sections.contribute(template, provider, slot=...): provider(version) returns
the context its template reads, and the template is drawn in a slot of
registry/version_detail.html, in the order the apps are installed (parity in
"checks", after the preprocessing; conversions' forms in "lineage"; benchmarks
then engines in "work"; the jobs table in "activity", at the end). A refused
action re-renders the page with its bound form through
version_page(..., <name>_form=form), which wins over the provider's empty one.
The model page and the models list take parts the same way (model_sections:
figures draws the model's home there; models_list_sections: demo's sample button).
"""

import json

from django.shortcuts import render

from deployhub.core.sections import Sections
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
from workers.backends.known import BACKENDS
from workers.checks.preprocessing import generate_code

version_sections = Sections("sections", slots=("checks", "lineage", "work", "activity"))
model_sections = Sections("model_sections")  # provider(model, request)
models_list_sections = Sections("models_list_sections")


def version_context(version, **forms):
    """Return the version page's context: registry's part, each app's part, then `forms`."""
    context = {**_registry_part(version), **version_sections.context(version)}
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
