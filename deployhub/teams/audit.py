"""The team's audit trail: every Event, filtered by actor, verb, object and date, as a page or CSV.

Events are append-only (teams/models.py refuses update and delete); nothing here
changes one. The filters live in the URL, so a view of the trail can be shared.
"""

import csv
import datetime
import io
import json

from django import forms

from deployhub.teams.models import Event

CSV_COLUMNS = ["time", "actor", "verb", "object", "object_id", "before", "after", "data"]


class AuditFilter(forms.Form):
    actor = forms.CharField(required=False, max_length=150)
    verb = forms.CharField(required=False, max_length=60, help_text="e.g. release. or job.failed")
    object = forms.CharField(
        required=False, max_length=60, label="Object type", help_text="e.g. release, job"
    )
    object_id = forms.IntegerField(required=False, min_value=1, label="Object id")
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))


def filtered_events(team, params):
    """Return (the team's events matching the filters in params, the bound filter form): none
    when a filter is invalid, never the whole trail as if nothing had been asked."""
    form = AuditFilter(params)
    events = Event.objects.filter(team=team)
    if not form.is_valid():
        return events.none(), form
    data = form.cleaned_data
    if data["actor"]:
        events = events.filter(actor=data["actor"])
    if data["verb"]:
        events = events.filter(verb__startswith=data["verb"])
    if data["object"]:
        events = events.filter(target_type=data["object"])
    if data["object_id"]:
        events = events.filter(target_id=data["object_id"])
    if data["since"]:
        events = events.filter(created_at__date__gte=data["since"])
    if data["until"]:
        events = events.filter(created_at__date__lte=data["until"])
    return events, form


def events_csv(events):
    """Return the events as CSV text, one row each, newest first."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for event in events:
        data = dict(event.data)
        before, after = data.pop("before", ""), data.pop("after", "")
        writer.writerow(
            [
                event.created_at.astimezone(datetime.UTC).isoformat(),
                event.actor,
                event.verb,
                event.target_type,
                event.target_id,
                _cell(before),
                _cell(after),
                json.dumps(data) if data else "",
            ]
        )
    return out.getvalue()


def _cell(value):
    """A before/after value in one CSV cell: text as it is, structures as JSON."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)
