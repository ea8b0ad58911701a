"""API v1: The audit trail, webhooks and team settings.

What the audit and team settings pages show and change, with their rules: any member
reads the trail and the settings; only admins see webhooks (their URLs and answers can
hold secrets), add or delete them, and change the settings. A caller in several teams
names one (?team=<slug>, or "team" in a body); another team's are 404.
"""

import datetime
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import get_object_or_404
from ninja import Query, Router, Status
from ninja.pagination import paginate
from pydantic import Field

from deployhub.api.auth import BIGINT, BadInput
from deployhub.api.forms import check_form
from deployhub.api.v1 import Listed, Page, Schema, Strict, answers
from deployhub.teams import webhooks
from deployhub.teams.access import require_role, teams_of
from deployhub.teams.audit import filtered_events
from deployhub.teams.models import Role, Webhook
from deployhub.teams.team_settings import SettingsForm, change_settings, current_settings

router = Router(tags=["teams"])


def team_named(request, slug=None):
    """Return the caller's team with this slug (404 for any other); with none named, the
    caller's only team (400 when in several, 403 when in none)."""
    teams = teams_of(request.user)
    if slug:
        return get_object_or_404(teams, slug=slug)
    count = teams.count()
    if count == 0:
        raise PermissionDenied("You are in no team yet: ask a team's admin to add you.")
    if count > 1:
        raise BadInput("You are in several teams: say which one with 'team' (its slug).")
    return teams.get()


class TeamQuery(Schema):
    team: str | None = Field(None, max_length=100)


class AuditQuery(TeamQuery):
    actor: str | None = Field(None, max_length=150)
    verb: str | None = Field(None, max_length=60)
    target_type: str | None = Field(None, max_length=60)
    target_id: int | None = Field(None, ge=1, le=BIGINT)
    since: datetime.date | None = None
    until: datetime.date | None = None


class EventOut(Schema):
    id: int
    team: str
    actor: str
    verb: str
    target_type: str
    target_id: int
    data: dict[str, Any]
    created_at: str


class DeliveryOut(Schema):
    id: int
    event: int
    verb: str
    attempt: int
    state: str
    status_code: int | None
    error: str
    created_at: str
    delivered_at: str | None


class WebhookOut(Schema):
    id: int
    team: str
    url: str
    events: list[str]
    active: bool
    secret_hint: str
    created_by: str | None
    created_at: str
    last_delivery: DeliveryOut | None


class WebhookCreatedOut(WebhookOut):
    secret: str


class WebhookIn(Strict):
    team: str | None = Field(None, max_length=100)
    url: str = Field(max_length=500)
    events: list[str] = Field([], max_length=50)


class SettingsOut(Schema):
    team: str
    name: str
    approvals_required: int


class SettingsIn(Strict):
    approvals_required: int


# The page's filter names for the API's: an event's fields are target_type and target_id.
AUDIT_FILTERS = {"object": "target_type", "object_id": "target_id"}


@router.get("audit", response=answers(list[EventOut]), url_name="api_audit")
@paginate(Page)
def audit(request, filters: Query[AuditQuery]):
    """The team's audit trail, newest first, filtered as on the audit page: ?actor=, ?verb=
    (a prefix), ?target_type=, ?target_id=, ?since= and ?until= (dates, inclusive)."""
    team = team_named(request, filters.team)
    asked = filters.model_dump(exclude={"team"}, exclude_none=True)
    renamed = {page: asked.pop(api) for page, api in AUDIT_FILTERS.items() if api in asked}
    events, form = filtered_events(team, {**asked, **renamed})
    if form.errors:
        fields = {name: AUDIT_FILTERS.get(name, name) for name in form.errors}
        problems = "; ".join(f"{fields[name]!r}: {' '.join(e)}" for name, e in form.errors.items())
        raise BadInput(f"No events: {problems}")
    return Listed(events, lambda event: event_json(event, team))


def event_json(event, team):
    return {
        "id": event.pk,
        "team": team.slug,
        "actor": event.actor,
        "verb": event.verb,
        "target_type": event.target_type,
        "target_id": event.target_id,
        "data": event.data,
        "created_at": event.created_at.isoformat(),
    }


def _admin_of(request, slug):
    """The caller's team named (or only team), which only its admins may see webhooks of."""
    team = team_named(request, slug)
    require_role(request.user, team, Role.ADMIN)
    return team


@router.get("webhooks", response=answers(list[WebhookOut]), url_name="api_webhooks")
@paginate(Page)
def webhooks_list(request, filters: Query[TeamQuery]):
    """The team's webhooks, oldest first, each with its latest delivery attempt (admins)."""
    team = _admin_of(request, filters.team)
    listed = Webhook.objects.filter(team=team).select_related("team", "created_by")
    return Listed(listed.order_by("created_at", "id"), webhook_json)


@router.post(
    "webhooks", response=answers(WebhookCreatedOut, status=201), url_name="api_webhooks_add"
)
def webhook_add(request, payload: WebhookIn):
    """Add a webhook to the team (admins), checked as the settings page checks it (URL,
    blocked addresses, verb prefixes); 201 with it and its secret, shown this once."""
    team = _admin_of(request, payload.team)
    if any("," in prefix for prefix in payload.events):
        raise BadInput("'events': each item is one verb prefix, without commas.")
    form = webhooks.WebhookForm({"url": payload.url, "events": ", ".join(payload.events)})
    check_form(form, "Webhook not added")
    data = form.cleaned_data
    webhook = webhooks.add_webhook(team, request.user, data["url"], data["events"])
    return Status(201, {**webhook_json(webhook), "secret": webhook.secret})


@router.delete("webhooks/{int:pk}", response=answers(None, status=204), url_name="api_webhook")
def webhook_delete(request, pk: int):
    """Delete one of the caller's teams' webhooks with its delivery log (admins); 204."""
    webhook = get_object_or_404(Webhook, pk=pk, team__in=teams_of(request.user))
    if webhooks.delete_webhook(webhook.team, request.user, webhook.pk) is None:
        raise Http404  # deleted meanwhile
    return Status(204, None)


def webhook_json(webhook):
    last = webhook.deliveries.select_related("event").first()
    return {
        "id": webhook.pk,
        "team": webhook.team.slug,
        "url": webhook.url,
        "events": webhook.events,
        "active": webhook.active,
        "secret_hint": webhook.secret_hint,
        "created_by": webhook.created_by.username if webhook.created_by else None,
        "created_at": webhook.created_at.isoformat(),
        "last_delivery": delivery_json(last) if last else None,
    }


def delivery_json(delivery):
    return {
        "id": delivery.pk,
        "event": delivery.event_id,
        "verb": delivery.event.verb,
        "attempt": delivery.attempt,
        "state": delivery.state,
        "status_code": delivery.status_code,
        "error": delivery.error,
        "created_at": delivery.created_at.isoformat(),
        "delivered_at": delivery.delivered_at.isoformat() if delivery.delivered_at else None,
    }


@router.get(
    "teams/{slug:slug}/settings", response=answers(SettingsOut), url_name="api_team_settings"
)
def team_settings(request, slug: str):
    """The team's settings, as its settings page shows them (any member)."""
    return settings_json(get_object_or_404(teams_of(request.user), slug=slug))


@router.patch(
    "teams/{slug:slug}/settings",
    response=answers(SettingsOut),
    url_name="api_team_settings_change",
)
def team_settings_change(request, slug: str, payload: SettingsIn):
    """Change the team's settings (admins), checked as the settings page checks them."""
    team = get_object_or_404(teams_of(request.user), slug=slug)
    require_role(request.user, team, Role.ADMIN)
    form = SettingsForm({**current_settings(team), **payload.model_dump()})
    check_form(form, "Settings not saved")
    return settings_json(change_settings(team, request.user, form))


def settings_json(team):
    return {"team": team.slug, "name": team.name, **current_settings(team)}
