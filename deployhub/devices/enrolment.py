"""Devices that enrol themselves: an enrolment token (EnrolmentToken) makes a device of its
class, or gives a machine enrolled before a fresh device token (docs/protocol.md,
"Enrolment"); and the lines an admin copies onto a new device to install, enrol and run it.
"""

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from deployhub.core import worker_dist
from deployhub.devices.models import Delivery, Device, EnrolmentToken, hash_token
from deployhub.devices.signals import device_revoked
from deployhub.teams.models import Event
from workers.version import parse_user_agent

# What the class page shows in place of an enrolment token it no longer knows.
TOKEN_PLACEHOLDER = "<enrolment token>"


class UnknownEnrolmentToken(Exception):
    """No enrolment token is this secret (HTTP 401, counted as a guess)."""


class EnrolmentRefused(Exception):
    """The enrolment token is revoked, expired or used up (HTTP 403); nothing changed."""


class NameTaken(Exception):
    """Another machine's device of the class has this name (HTTP 409); nothing changed."""


@dataclass
class Enrolment:
    device: Device
    token: str  # the device token, shown once
    created: bool  # False: the machine was enrolled before, and keeps its device


def enrol(secret, name, machine_id, user_agent=""):
    """Make the machine a device of the token's class, or give the device it already is a
    fresh device token (its old one stops working); return the Enrolment.

    The token's row is locked while it is read and its use counted, so two machines
    enrolling at once never take more than its max_devices. Raises UnknownEnrolmentToken,
    EnrolmentRefused or NameTaken, having changed nothing.
    """
    with transaction.atomic():
        record = _locked_token(secret)
        device_class = record.device_class
        # A revoked device stays revoked: its machine enrolling again becomes a new device,
        # counted against the token (only an admin's revoke ends a device for good).
        existing = (
            device_class.devices.filter(machine_id=machine_id, revoked_at__isnull=True)
            .select_for_update()
            .first()
        )
        if refusal := record.refusal(new_device=existing is None):
            raise EnrolmentRefused(refusal)
        device = existing or Device(device_class=device_class, machine_id=machine_id)
        token = _enrolled(device, record, name, user_agent)
        if existing is not None:  # its old token stopped working: so did the job it ran
            why = f"device {existing} enrolled again, and its old token stopped working"
            device_revoked.send(Device, device=existing, user=None, why=why)
        if existing is None:
            record.uses += 1
            record.save(update_fields=["uses"])
        Event.record(
            device_class.team,
            f"enrolment token {record.token_hint}…",
            "device.re_enrolled" if existing else "device.enrolled",
            device,
            enrolment_token=record.pk,
            uses=record.uses,
            worker_version=device.worker_version,
        )
    return Enrolment(device, token, created=existing is None)


def _locked_token(secret):
    """The enrolment token this secret is, its row locked until the transaction ends."""
    found = EnrolmentToken.objects.select_for_update(of=("self",)).select_related(
        "device_class__team"
    )
    record = found.filter(token_hash=hash_token(secret)).first() if secret else None
    if record is None:
        raise UnknownEnrolmentToken("This enrolment token is not valid.")
    return record


def _enrolled(device, record, name, user_agent):
    """Set what enrolment says of the device, save it with a new token and return the token."""
    others = device.device_class.devices.filter(name=name).exclude(pk=device.pk)
    _rename_revoked_same_machine(others, device.machine_id)
    if others.exists():
        raise NameTaken(_name_taken(device.device_class, name))
    device.name = name
    device.enrolled_with = record
    device.delivery = Delivery.HTTPS
    version, protocol = parse_user_agent(user_agent)
    device.worker_version = (version or "")[: Device._meta.get_field("worker_version").max_length]
    device.protocol_version = protocol if protocol is not None and protocol < 2**31 else None
    token = device.issue_token()
    try:
        with transaction.atomic():  # another machine may take the name at the same moment
            device.save()
    except IntegrityError as exc:
        raise NameTaken(_name_taken(device.device_class, name)) from exc
    return token


def _rename_revoked_same_machine(others, machine_id):
    """A revoked device of this machine leaves its name to the machine's new device: it is
    kept, for its history, as "<name>-revoked-<id>"."""
    for old in others.filter(machine_id=machine_id, revoked_at__isnull=False):
        old.name = f"{old.name[:80]}-revoked-{old.pk}"
        old.save(update_fields=["name"])


def _name_taken(device_class, name):
    return (
        f"{device_class} already has a device named {name!r} on another machine: enrol this "
        "one under another name (deployhub-worker enroll --name <name>)."
    )


def token_state(record, now=None):
    """One word for what an enrolment token can do now: usable, revoked, expired or used up."""
    now = now or timezone.now()
    if record.revoked_at is not None:
        return "revoked"
    if record.expires_at is not None and record.expires_at <= now:
        return "expired"
    return "used up" if record.refusal(now) else "usable"


def revoked_refusal(device):
    """What a revoked device's calls are answered (HTTP 401)."""
    return (
        f"This device was revoked at {device.revoked_at:%Y-%m-%d %H:%M} UTC: "
        "enrol it again with a new enrolment token."
    )


def hub_url(request):
    """The address devices reach the hub at: DEPLOYHUB_PUBLIC_URL, unless it names this host's
    loopback (its default), which no other machine reaches: then the page's own address."""
    configured = settings.DEPLOYHUB_PUBLIC_URL.rstrip("/")
    if configured and not _is_loopback(urlsplit(configured).hostname or ""):
        return configured
    return request.build_absolute_uri("/").rstrip("/")


def _is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def setup_lines(base, token=None):
    """The commands that install, enrol and run a worker against the hub at `base`."""
    return [
        worker_dist.install_command(base),
        f"deployhub-worker enroll --hub {base} --token {token or TOKEN_PLACEHOLDER}",
        "deployhub-worker run",
    ]
