"""The team's audit trail: every Event, filtered by actor, verb, object and date, as pages or a
streamed CSV.

Events are append-only (teams/models.py refuses update and delete); nothing here
changes one. The filters live in the URL, so a view of the trail can be shared.
"""

import csv
import datetime
import json

from django import forms

from deployhub.teams.models import Event

CSV_COLUMNS = ["time", "actor", "verb", "object", "object_id", "before", "after", "data"]
# Events a page of the trail shows (newest first; the CSV has every one), and read at once
# while the CSV streams.
PAGE_SIZE = 100
CSV_CHUNK = 500


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
    """Yield the events as CSV lines, a header then one row each, newest first.

    Streamed, and read from the database a chunk at a time: a trail of any length is
    never held whole in the hub's memory, nor waited for before the first line.
    """
    writer = csv.writer(_Line())
    yield writer.writerow(CSV_COLUMNS)
    for event in events.iterator(chunk_size=CSV_CHUNK):
        yield writer.writerow(_row(event))


class _Line:
    """A file for csv.writer whose write returns the line instead of keeping it."""

    def write(self, line):
        return line


def _row(event):
    """The event's CSV row: its before and after in columns of their own, the rest as JSON."""
    data = dict(event.data)
    before, after = data.pop("before", ""), data.pop("after", "")
    return [
        event.created_at.astimezone(datetime.UTC).isoformat(),
        event.actor,
        event.verb,
        event.target_type,
        event.target_id,
        _cell(before),
        _cell(after),
        json.dumps(data) if data else "",
    ]


def _cell(value):
    """A before/after value in one CSV cell: text as it is, structures as JSON."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)
