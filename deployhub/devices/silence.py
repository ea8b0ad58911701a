"""Devices that fell silent: told once per silence, and again when they are back.

A device whose last heartbeat is older than its class's silent_after_minutes becomes a
device.silent event (the audit trail, and so the team's webhooks) and an email to the
team's admins, once: silence_reported_at says it was told. Its next heartbeat clears
that, with a device.back event and email. The hub worker's reaper looks every few
seconds (jobs/tasks.py). A revoked device is never reported, nor one that never spoke.
"""

from datetime import timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from deployhub.devices.models import Device
from deployhub.teams.models import Event, Role

ACTOR = "reaper"


def silent_devices(now):
    """The devices past their class's silence threshold and not yet reported: one query.

    It reads the offline devices not yet reported (a few: those that stopped within
    their class's threshold) and keeps those past it: the threshold is per class, and
    SQLite multiplies no interval by a column.
    """
    offline = now - timedelta(seconds=settings.DEPLOYHUB_OFFLINE_AFTER)
    candidates = Device.objects.filter(
        revoked_at__isnull=True, silence_reported_at__isnull=True, last_heartbeat_at__lt=offline
    ).select_related("device_class__team")
    return [device for device in candidates if now - device.last_heartbeat_at > _threshold(device)]


def _threshold(device):
    return timedelta(minutes=device.device_class.silent_after_minutes)


def report_silent_devices(now=None):
    """Report each device that fell silent since the last look; return those reported."""
    now = now or timezone.now()
    return [device for device in silent_devices(now) if _report_silent(device, now)]


def _report_silent(device, now):
    """Mark the device reported, and tell its team, unless it spoke (or was told) meanwhile."""
    with transaction.atomic():
        unchanged = Device.objects.filter(
            pk=device.pk,
            revoked_at__isnull=True,
            silence_reported_at__isnull=True,
            last_heartbeat_at=device.last_heartbeat_at,
        )
        if not unchanged.update(silence_reported_at=now):
            return False
        device.silence_reported_at = now
        minutes = device.device_class.silent_after_minutes
        Event.record(
            device.team,
            ACTOR,
            "device.silent",
            device,
            device_class=device.device_class.slug,
            last_heartbeat_at=device.last_heartbeat_at.isoformat(),
            silent_after_minutes=minutes,
            before="heard from",
            after="silent",
        )
        _email_admins(
            device,
            f"[DeployHub] {device} ({device.device_class}) is silent",
            f"No heartbeat from {device} of class {device.device_class} since "
            f"{device.last_heartbeat_at:%Y-%m-%d %H:%M} UTC: over the class's {minutes} "
            "minutes. Its jobs wait for another device of the class, or for it.",
        )
    return True


def report_back(device):
    """Clear a reported silence on the device's heartbeat, and tell its team it is back."""
    with transaction.atomic():
        silent_since = device.silence_reported_at
        reported = Device.objects.filter(pk=device.pk, silence_reported_at__isnull=False)
        if not reported.update(silence_reported_at=None):
            device.silence_reported_at = None
            return False
        device.silence_reported_at = None
        Event.record(
            device.team,
            f"device:{device}",
            "device.back",
            device,
            device_class=device.device_class.slug,
            silent_since=silent_since.isoformat() if silent_since else None,
            before="silent",
            after="heard from",
        )
        _email_admins(
            device,
            f"[DeployHub] {device} ({device.device_class}) is back",
            f"{device} of class {device.device_class} sent a heartbeat again.",
        )
    return True


def _email_admins(device, subject, text):
    """Email the team's admins (those with an address) once the transaction commits."""
    admins = device.team.memberships.filter(role__gte=Role.ADMIN).select_related("user")
    to = [membership.user.email for membership in admins if membership.user.email]
    link = settings.DEPLOYHUB_PUBLIC_URL.rstrip("/") + reverse("device_detail", args=[device.pk])
    if to:
        body = f"{text}\n\n{link}\n"
        transaction.on_commit(lambda: send_mail(subject, body, None, to, fail_silently=True))
