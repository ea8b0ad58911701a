"""State changes of devices that both the pages and API v1 make.

Each checks who may act, changes state, and writes the audit event.
"""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from deployhub.devices.models import EnrolmentToken
from deployhub.devices.signals import device_revoked
from deployhub.teams.access import require_role
from deployhub.teams.models import Event, Role


def set_draining(device, draining, user):
    """Stop (True) or resume (False) giving the device new jobs; an admin of its team only."""
    require_role(user, device.team, Role.ADMIN)
    before = _taking_jobs(device)
    device.draining = bool(draining)
    device.save(update_fields=["draining"])
    verb = "device.drained" if device.draining else "device.undrained"
    Event.record(device.team, user, verb, device, before=before, after=_taking_jobs(device))
    return device


def _taking_jobs(device):
    return "draining" if device.draining else "taking jobs"


def revoke_device(device, user):
    """Stop the device's token working, and put the job it runs back on the queue; an admin
    of its team only. A device revoked already stays as it was."""
    require_role(user, device.team, Role.ADMIN)
    if device.revoked_at is not None:
        return device
    with transaction.atomic():
        device.revoked_at = timezone.now()
        device.save(update_fields=["revoked_at"])
        Event.record(device.team, user, "device.revoked", device, after="revoked")
        device_revoked.send(type(device), device=device, user=user)
    return device


def create_enrolment_token(device_class, user, expires_in_days=None, max_devices=None, note=""):
    """Make an enrolment token for the class and return (it, its secret: shown once); an
    admin of the class's team only."""
    require_role(user, device_class.team, Role.ADMIN)
    record = EnrolmentToken(
        device_class=device_class, note=note, max_devices=max_devices, created_by=user
    )
    if expires_in_days is not None:
        record.expires_at = timezone.now() + timedelta(days=expires_in_days)
    secret = record.issue()
    with transaction.atomic():
        record.save()
        Event.record(
            device_class.team,
            user,
            "enrolment_token.created",
            record,
            token=record.token_hint,
            device_class=device_class.slug,
            expires_at=record.expires_at.isoformat() if record.expires_at else None,
            max_devices=max_devices,
            note=note,
        )
    return record, secret


def revoke_enrolment_token(record, user):
    """Stop the enrolment token enrolling devices (those it enrolled keep theirs); an admin of
    its class's team only. A token revoked already stays as it was."""
    team = record.device_class.team
    require_role(user, team, Role.ADMIN)
    if record.revoked_at is not None:
        return record
    with transaction.atomic():
        record.revoked_at = timezone.now()
        record.save(update_fields=["revoked_at"])
        Event.record(
            team, user, "enrolment_token.revoked", record, token=record.token_hint, after="revoked"
        )
    return record


def create_device_class(team, user, form):
    """Save a valid DeviceClassForm as a new class of the team and record it; an admin of
    the team only (the page's class form and API v1 both come here)."""
    require_role(user, team, Role.ADMIN)
    form.instance.team = team
    with transaction.atomic():
        device_class = form.save()
        Event.record(team, user, "device_class.created", device_class, after="created")
    return device_class


def change_device_class(device_class, user, form):
    """Save a valid DeviceClassEditForm of the class and record what changed, before and
    after; an admin of its team only."""
    require_role(user, device_class.team, Role.ADMIN)
    with transaction.atomic():
        form.save()
        Event.record(
            device_class.team,
            user,
            "device_class.changed",
            device_class,
            before={name: _recorded(form.initial.get(name)) for name in form.changed_data},
            after={name: _recorded(form.cleaned_data.get(name)) for name in form.changed_data},
        )
    return device_class


def _recorded(value):
    """A form value as the audit trail keeps it: classes by slug, the rest as it is."""
    if hasattr(value, "__iter__") and not isinstance(value, str):
        return sorted(str(item) for item in value)
    return value
