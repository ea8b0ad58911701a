"""State changes of devices that both the pages and API v1 make.

Each checks who may act, changes state, and writes the audit event.
"""

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
