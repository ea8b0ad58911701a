"""Role changes in the audit trail, however they are made (the admin, a command, the shell).

A membership created, changed or removed is an Event of its team, with the role
before and after. The actor is the signed-in user of the request that made it (the
admin), or "system" outside a request (a command, the shell).
"""

from django.db.models.signals import post_delete, post_save, pre_save

from deployhub.teams.actor import current_actor
from deployhub.teams.models import Event, Membership, Role


def _label(role):
    return Role(role).label.lower() if role is not None else None


def remember_role(sender, instance, **kwargs):
    """Keep the role as stored before this save, for the event after it."""
    stored = Membership.objects.filter(pk=instance.pk).values_list("role", flat=True).first()
    instance._role_before = stored if instance.pk else None


def record_role(sender, instance, created, **kwargs):
    before = getattr(instance, "_role_before", None)
    if not created and before == instance.role:
        return
    verb = "membership.added" if created else "membership.role_changed"
    Event.record(
        instance.team,
        current_actor(),
        verb,
        instance,
        user=instance.user.get_username(),
        before=_label(before),
        after=_label(instance.role),
    )


def record_removal(sender, instance, **kwargs):
    Event.record(
        instance.team,
        current_actor(),
        "membership.removed",
        instance,
        user=instance.user.get_username(),
        before=_label(instance.role),
        after=None,
    )


def connect():
    pre_save.connect(remember_role, sender=Membership, dispatch_uid="teams.remember_role")
    post_save.connect(record_role, sender=Membership, dispatch_uid="teams.record_role")
    post_delete.connect(record_removal, sender=Membership, dispatch_uid="teams.record_removal")
