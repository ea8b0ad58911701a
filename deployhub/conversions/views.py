"""The version page's export and conversion actions: each queues a job that makes a child."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from deployhub.conversions.actions import (
    ConversionRefused,
    conversion_class,
    submit_convert,
    submit_export,
)
from deployhub.devices.access import team_class
from deployhub.registry.access import get_version_for_user
from deployhub.registry.models import VersionFormat
from deployhub.teams.access import require_role
from deployhub.teams.models import Role


def export_uploaded_pt2(sender, request, version, options, **kwargs):
    """Queue the export of a .pt2 just uploaded on the page, on the class its form chose."""
    if version.format == VersionFormat.PT2:
        queue_export(request, version, options.get("export_on"))


def queue_export(request, version, device_class):
    """Queue a .pt2's export on device_class (or the team's first), saying so on the page."""
    device_class = conversion_class(version, device_class)
    if device_class is None:
        messages.warning(request, "No device class to export on: register one, then export.")
        return
    job = submit_export(version, device_class, request.user)
    messages.info(request, f"Export to ONNX queued on {device_class} as job #{job.pk}.")


def chosen_class(request, version):
    """Return the team's device class the form chose, or None when it chose none; raise
    ConversionRefused for one that is not the team's (never fall back to another)."""
    posted = request.POST.get("device_class", "")
    device_class = team_class(version.team, posted)
    if posted and device_class is None:
        raise ConversionRefused(f"{version.team} has no device class {posted[:40]!r}.")
    return device_class


@login_required
@require_POST
def version_export(request, pk):
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    try:
        device_class = chosen_class(request, version)
    except ConversionRefused as exc:
        messages.error(request, f"Not exported: {exc}")
        return redirect(version)
    queue_export(request, version, device_class)
    return redirect(version)


@login_required
@require_POST
def version_convert(request, pk):
    """Queue the conversion of an ONNX version to another opset (a derived child version)."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    try:
        device_class = chosen_class(request, version)
        job = submit_convert(version, device_class, request.user, request.POST.get("opset"))
    except ConversionRefused as exc:
        messages.error(request, f"Not converted: {exc}")
        return redirect(f"{version.get_absolute_url()}#lineage")
    opset = job.params["convert_to_opset"]
    messages.info(
        request, f"Conversion to opset {opset} queued on {job.device_class} as job #{job.pk}."
    )
    return redirect(f"{version.get_absolute_url()}#lineage")
