"""The account page (personal API tokens), the team's audit trail and its settings."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from deployhub.core.downloads import content_disposition
from deployhub.teams import webhooks
from deployhub.teams.access import current_team, require_role, teams_of
from deployhub.teams.audit import PAGE_SIZE, events_csv, filtered_events
from deployhub.teams.models import ApiToken, Event, Role, TokenScope
from deployhub.teams.team_settings import SettingsForm, change_settings, current_settings


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What the token is for, e.g. ci-upload.")
    scope = forms.ChoiceField(choices=TokenScope.choices, initial=TokenScope.FULL)


@login_required
def api_tokens(request):
    form = TokenForm()
    new_token = None
    if request.method == "POST":
        form = TokenForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            record = ApiToken(user=request.user, name=data["name"], scope=data["scope"])
            new_token = record.issue()
            record.save()
            _record_token(request.user, "token.created", record)
            form = TokenForm()
    tokens = request.user.api_tokens.all()
    return render(
        request, "teams/tokens.html", {"tokens": tokens, "form": form, "new_token": new_token}
    )


@login_required
@require_POST
def revoke_token(request, pk):
    record = get_object_or_404(ApiToken, pk=pk, user=request.user)
    _record_token(request.user, "token.revoked", record)
    record.delete()
    messages.success(request, f"Token {record.name} revoked.")
    return redirect("api_tokens")


def _record_token(user, verb, record):
    """Record a token's creation or revocation in each of its user's teams (tokens are personal)."""
    for team in teams_of(user):
        before, after = (None, "active") if verb == "token.created" else ("active", "revoked")
        Event.record(
            team,
            user,
            verb,
            record,
            name=record.name,
            scope=record.scope,
            before=before,
            after=after,
        )


def _team(request):
    team = current_team(request)
    if team is None:
        raise Http404("You are not a member of any team yet.")
    return team


@login_required
def audit(request):
    """Every state change of the team, newest first, with filters in the URL."""
    team = _team(request)
    events, form = filtered_events(team, request.GET)
    page = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    filters = request.GET.copy()
    filters.pop("page", None)  # the links to other pages and the CSV keep the filters only
    context = {"page": page, "filters": filters.urlencode(), "form": form, "team": team}
    return render(request, "teams/audit.html", context, status=400 if form.errors else 200)


@login_required
def audit_csv(request):
    team = _team(request)
    events, form = filtered_events(team, request.GET)
    if form.errors:
        refusal = f"No CSV: a filter is invalid.\n{form.errors.as_text()}\n"
        return HttpResponse(refusal, status=400, content_type="text/plain; charset=utf-8")
    response = StreamingHttpResponse(events_csv(events), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = content_disposition(f"{team.slug}-audit.csv")
    return response


@login_required
def team_settings(request):
    """The team's settings (admins change them): approvals a release needs, and webhooks."""
    team = _team(request)
    form = SettingsForm(initial=current_settings(team))
    webhook_form, new_webhook = webhooks.WebhookForm(), None
    admin = team.role_of(request.user) == Role.ADMIN  # webhook URLs and answers can hold secrets
    if request.method == "POST":
        require_role(request.user, team, Role.ADMIN)
        action = request.POST.get("action", "settings")
        if action == "delete_webhook":
            if webhooks.delete_webhook(team, request.user, request.POST.get("webhook")) is None:
                raise Http404("This team has no such webhook: nothing was deleted.")
            messages.success(request, "Webhook deleted.")
            return redirect("team_settings")
        if action == "add_webhook":
            webhook_form, new_webhook = _add_webhook(request, team)
        else:
            form = SettingsForm(request.POST)
            if form.is_valid():
                change_settings(team, request.user, form)
                messages.success(request, "Settings saved.")
                return redirect("team_settings")
    context = {
        "form": form,
        "team": team,
        "webhook_form": webhook_form,
        "new_webhook": new_webhook,
        "webhooks": webhooks.webhooks_of(team) if admin else [],
        "deliveries": webhooks.recent_deliveries(team) if admin else [],
        "admin": admin,
    }
    status = 400 if form.errors or webhook_form.errors else 200
    return render(request, "teams/settings.html", context, status=status)


def _add_webhook(request, team):
    """Return the form to draw next and the webhook added (its secret shown this once), or None."""
    form = webhooks.WebhookForm(request.POST)
    if not form.is_valid():
        return form, None
    data = form.cleaned_data
    return webhooks.WebhookForm(), webhooks.add_webhook(
        team, request.user, data["url"], data["events"]
    )
