"""Models and versions a user may see: the one place other apps get them from."""

from django.shortcuts import get_object_or_404

from deployhub.registry.models import Model, ModelVersion
from deployhub.teams.access import teams_of


def get_model_for_user(request, pk):
    """Return the model with this pk in one of the user's teams, or raise Http404."""
    return get_object_or_404(Model, pk=pk, team__in=teams_of(request.user))


def get_version_for_user(request, pk):
    """Return the version with this pk in one of the user's teams, or raise Http404."""
    queryset = ModelVersion.objects.select_related("model__team", "parent")
    return get_object_or_404(queryset, pk=pk, model__team__in=teams_of(request.user))
