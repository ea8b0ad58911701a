"""The team's settings (approvals a release needs): the form that checks a change and the
change itself, recorded; the settings page and API v1 both use them."""

from django import forms
from django.db import transaction

from deployhub.teams.access import require_role
from deployhub.teams.models import Event, Role

SETTINGS = ("approvals_required",)


class SettingsForm(forms.Form):
    approvals_required = forms.IntegerField(
        min_value=1,
        max_value=10,
        help_text="Approvals a release needs, from reviewers other than its author.",
    )


def current_settings(team):
    """The team's settings as the form shows them."""
    return {name: getattr(team, name) for name in SETTINGS}


def change_settings(team, user, form):
    """Save a valid SettingsForm as the team's settings and record the change; admins only."""
    require_role(user, team, Role.ADMIN)
    before = current_settings(team)
    for name in SETTINGS:
        setattr(team, name, form.cleaned_data[name])
    with transaction.atomic():
        team.save(update_fields=list(SETTINGS))
        Event.record(team, user, "team.settings", team, before=before, after=current_settings(team))
    return team
