"""Releases a user may see: the one place pages and the API get them from."""

from django.shortcuts import get_object_or_404

from deployhub.releases.models import Release
from deployhub.teams.access import teams_of


def get_release_for_user(request, pk):
    """Return the release with this pk in one of the user's teams, or raise Http404."""
    queryset = Release.objects.select_related(
        "engine__model_version__model", "device_class__team", "created_by", "replaced"
    )
    return get_object_or_404(queryset, pk=pk, device_class__team__in=teams_of(request.user))


def releases_for_user(user):
    """The releases of the user's teams, newest first, with what a release's answer reads."""
    queryset = Release.objects.select_related(
        "engine__model_version__model", "device_class__team", "created_by", "replaced"
    )
    return queryset.filter(device_class__team__in=teams_of(user)).order_by("-created_at", "-id")
