"""Engines a user may see: the one place other apps get them from."""

from django.shortcuts import get_object_or_404

from deployhub.engines.models import AutoRun, Engine
from deployhub.teams.access import teams_of


def get_engine_for_user(request, pk):
    """Return the engine with this pk in one of the user's teams, or raise Http404."""
    queryset = Engine.objects.select_related("model_version__model", "device_class", "built_on")
    return get_object_or_404(queryset, pk=pk, device_class__team__in=teams_of(request.user))


def get_auto_run_for_user(request, pk):
    """Return the auto run with this pk in one of the user's teams, or raise Http404."""
    queryset = AutoRun.objects.select_related(
        "model_version__model", "device_class", "dataset", "created_by"
    )
    return get_object_or_404(queryset, pk=pk, device_class__team__in=teams_of(request.user))


def engines_for_user(user):
    """The engines of the user's teams, newest first, with the runs their gates read."""
    queryset = Engine.objects.select_related("model_version__model", "device_class", "built_on")
    queryset = queryset.filter(device_class__team__in=teams_of(user)).with_gate_runs()
    return queryset.order_by("-created_at", "-pk")
