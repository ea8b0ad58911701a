"""What engines adds to the version page (registered in apps.py): the engine store, the
compile form, preflight per device class and the latest auto runs. And the engine page's
parts that apps above engines draw (releases: the engine's releases and the propose form).
"""

from deployhub.engines.actions import compatibility_matrix
from deployhub.engines.forms import CompileForm
from deployhub.engines.models import Engine
from deployhub.engines.preflight import preflight_grid


def version_part(version):
    classes = version.team.device_classes.all()
    built_for = classes.filter(engines__model_version=version).distinct()
    return {
        "engines": Engine.objects.for_version(version),
        "matrices": [(dc, compatibility_matrix(version, dc)) for dc in built_for],
        "compile_form": CompileForm(team=version.team),
        "auto_runs": version.auto_runs.select_related("device_class")[:5],
        "preflight": [(dc, preflight_grid(version, dc)) for dc in classes],
    }


def job_part(job):
    """The auto run a compare job timed builds for, if any (the job page)."""
    return {"compared_in": job.auto_runs_compared.first()}


_engine_parts = []


def contribute_to_engine_page(template, provider=None):
    """Draw template on every engine page, below its release gates, with provider(engine)."""
    if not any(part[0] == template for part in _engine_parts):
        _engine_parts.append((template, provider))


def engine_context(engine):
    """Return the context the contributed parts read, and the templates to include."""
    context = {"engine_sections": [template for template, _ in _engine_parts]}
    for _, provider in _engine_parts:
        if provider is not None:
            context.update(provider(engine))
    return context
