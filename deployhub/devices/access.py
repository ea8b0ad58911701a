"""Device classes and devices a user may see: the one place other apps get them from."""

from django.shortcuts import get_object_or_404

from deployhub.devices.models import Device, DeviceClass, EnrolmentToken
from deployhub.teams.access import as_id, teams_of


def get_device_class_for_user(request, pk):
    """Return the device class with this pk in one of the user's teams, or raise Http404."""
    return get_object_or_404(DeviceClass, pk=pk, team__in=teams_of(request.user))


def get_device_class_by_slug_for_user(request, slug):
    """Return the device class with this slug in one of the user's teams, or raise Http404."""
    queryset = DeviceClass.objects.select_related("team")
    return get_object_or_404(queryset, slug=slug, team__in=teams_of(request.user))


def get_enrolment_token_for_user(request, pk):
    """Return the enrolment token with this pk of one of the user's teams' classes, or 404."""
    queryset = EnrolmentToken.objects.select_related("device_class__team", "created_by")
    return get_object_or_404(queryset, pk=pk, device_class__team__in=teams_of(request.user))


def get_device_for_user(request, pk):
    """Return the device with this pk in one of the user's teams, or raise Http404."""
    queryset = Device.objects.select_related("device_class__team")
    return get_object_or_404(queryset, pk=pk, device_class__team__in=teams_of(request.user))


def team_class(team, pk):
    """Return the team's device class with this id (as a form posts it); None for anything else."""
    pk = as_id(pk)
    return team.device_classes.filter(pk=pk).first() if pk is not None else None
