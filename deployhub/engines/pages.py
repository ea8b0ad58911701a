"""What engines adds to the version page (registered in apps.py): the engine store, the
compile form, preflight per device class and the latest auto runs. And the engine page's
parts that apps above engines draw (releases: the engine's releases and the propose form).
"""

from django.db.models import Q, prefetch_related_objects

from deployhub.core.sections import Sections
from deployhub.engines.actions import compatibility_matrix
from deployhub.engines.forms import CompileForm
from deployhub.engines.models import AutoRun, Engine
from deployhub.engines.preflight import preflight_grid


def version_part(version):
    # Each class's devices are read once, for its compatibility matrix and its preflight (a
    # query per class and part before).
    classes = list(version.team.device_classes.prefetch_related("devices"))
    engines = version_engines(version)
    built_for = {engine.device_class_id for engine in engines}
    return {
        "engines": engines,
        "matrices": [
            (dc, compatibility_matrix(version, dc, [e for e in engines if e.device_class == dc]))
            for dc in classes
            if dc.pk in built_for
        ],
        "compile_form": CompileForm(team=version.team),
        "has_classes": bool(classes),
        "auto_runs": auto_runs_of(version)[:5],
        "preflight": [(dc, preflight_grid(version, dc)) for dc in classes],
    }


def auto_runs_of(version):
    """The auto runs of a version, newest first, those that build its conversion included."""
    runs = AutoRun.objects.filter(Q(model_version=version) | Q(converted_from=version))
    return runs.select_related("device_class")


def version_engines(version):
    """The version's engines with what their gates and flags read, loaded in a few queries."""
    engines = list(Engine.objects.for_version(version).with_gate_runs())
    prefetch_related_objects([version], "golden_sets")
    for engine in engines:
        engine.model_version = version  # one instance: its parity gate is worked out once
    return engines


def job_part(job):
    """The auto run a compare job timed builds for, if any (the job page)."""
    return {"compared_in": job.auto_runs_compared.first()}


engine_sections = Sections("engine_sections")  # provider(engine), below its release gates
