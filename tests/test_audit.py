"""The team's audit trail: every change listed with filters and CSV; nothing edits or deletes an
event, in the hub or in its database."""

import csv
import io

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.db.models import ProtectedError

from deployhub.releases.models import Release
from deployhub.teams.models import Event, Role, Team, Webhook, WebhookDelivery
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def trail(demo_team, version, alice, bob):
    Event.record(demo_team, alice, "release.proposed", version, before=None, after="draft")
    Event.record(demo_team, bob, "release.review.approve", version, comment="fine")
    Event.record(demo_team, "device:edge-1", "job.failed", version)
    return demo_team


def rows(response):
    return list(csv.DictReader(io.StringIO(response.getvalue().decode())))  # streamed


def test_the_page_lists_the_teams_events_and_filters_them(client, trail, alice, charlie):
    Event.record(charlie.memberships.get().team, charlie, "release.proposed", charlie)
    client.login(username="alice", password=PASSWORD)

    page = client.get("/team/audit/").content.decode()
    assert "release.proposed" in page and "release.review.approve" in page and "job.failed" in page
    assert page.count("release.proposed") == 1  # not the other team's
    by_bob = client.get("/team/audit/", {"actor": "bob"}).content.decode()
    assert "release.review.approve" in by_bob and "job.failed" not in by_bob
    releases = client.get("/team/audit/", {"verb": "release."}).content.decode()
    assert "job.failed" not in releases and "release.proposed" in releases
    one = {"object": "release", "object_id": "7"}
    Event.record(
        trail, alice, "release.submitted", Release(pk=7), before="draft", after="in-review"
    )
    Event.record(
        trail, alice, "release.submitted", Release(pk=8), before="draft", after="in-review"
    )
    of_one = client.get("/team/audit/", one).content.decode()
    assert "release #7" in of_one and "release #8" not in of_one
    assert "draft → in-review" in of_one
    nothing = client.get("/team/audit/", {"until": "2000-01-01"}).content.decode()
    assert "No events match." in nothing


def test_the_csv_carries_the_same_filtered_rows(client, trail, alice):
    client.login(username="alice", password=PASSWORD)

    response = client.get("/team/audit.csv", {"verb": "release."})

    assert response["Content-Disposition"] == 'attachment; filename="demo-audit.csv"'
    got = rows(response)
    assert [row["verb"] for row in got] == ["release.review.approve", "release.proposed"]
    assert got[1]["after"] == "draft" and got[1]["actor"] == "alice"


def test_a_bad_filter_is_said_and_changes_nothing(client, trail, alice):
    client.login(username="alice", password=PASSWORD)
    before = Event.objects.count()

    response = client.get("/team/audit/", {"since": "not-a-date"})

    assert response.status_code == 400 and "Enter a valid date" in response.content.decode()
    assert Event.objects.count() == before


def test_a_bad_filter_shows_no_events_rather_than_the_whole_trail(client, trail, alice):
    client.login(username="alice", password=PASSWORD)
    bad = {"actor": "bob", "since": "abc"}

    page = client.get("/team/audit/", bad)
    csv_file = client.get("/team/audit.csv", bad)

    text = page.content.decode()
    assert page.status_code == 400 and "Enter a valid date" in text
    assert "No events shown: correct the filter above." in text
    assert "release.proposed" not in text and "job.failed" not in text  # nor bob's own
    assert "release.review.approve" not in text
    assert csv_file.status_code == 400 and csv_file["Content-Type"].startswith("text/plain")
    assert "Enter a valid date" in csv_file.content.decode()
    assert "release." not in csv_file.content.decode()


def test_no_path_edits_or_deletes_an_event(client, trail, alice):
    event, before = Event.objects.first(), Event.objects.count()
    with pytest.raises(TypeError, match="append-only"):
        Event.objects.filter(pk=event.pk).update(verb="x")
    with pytest.raises(TypeError, match="append-only"):
        Event.objects.filter(pk=event.pk).delete()
    event.verb = "x"
    with pytest.raises(TypeError, match="append-only"):
        event.save()
    get_user_model().objects.filter(username="alice").update(is_staff=True, is_superuser=True)
    client.login(username="alice", password=PASSWORD)
    change = f"/admin/teams/event/{event.pk}/change/"
    assert client.post(change, {"verb": "x"}).status_code == 403
    assert client.post(f"/admin/teams/event/{event.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.post("/team/audit/", {"verb": "x"}).status_code == 200  # a GET-only view
    assert Event.objects.filter(verb="x").count() == 0 and Event.objects.count() == before


def test_a_single_event_cannot_be_deleted_nor_the_team_that_holds_it(trail):
    event, before = Event.objects.first(), Event.objects.count()

    with pytest.raises(TypeError, match="append-only"):
        event.delete()
    with pytest.raises(ProtectedError):
        trail.delete()

    assert Event.objects.count() == before and Team.objects.filter(pk=trail.pk).exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigger is PostgreSQL's")
def test_the_database_refuses_to_update_or_delete_an_event_whoever_asks(trail):
    event, before = Event.objects.first(), Event.objects.count()
    asks = [
        lambda: Event._base_manager.filter(pk=event.pk).delete(),  # what the model cannot guard
        lambda: Event._base_manager.filter(pk=event.pk).update(verb="x"),
        lambda: raw("DELETE FROM teams_event"),
        lambda: raw("UPDATE teams_event SET actor = 'mallory'"),
    ]
    for ask in asks:
        with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
            ask()

    assert Event.objects.count() == before
    assert not Event.objects.filter(verb="x").exists()
    assert not Event.objects.filter(actor="mallory").exists()


def raw(sql):
    with connection.cursor() as cursor:
        cursor.execute(sql)


def test_a_superuser_cannot_delete_webhook_deliveries_in_the_admin(client, trail, alice):
    webhook = Webhook.objects.create(team=trail, url="https://ci.example.com/hook")
    delivery = WebhookDelivery.objects.create(webhook=webhook, event=Event.objects.first())
    get_user_model().objects.filter(username="alice").update(is_staff=True, is_superuser=True)
    client.login(username="alice", password=PASSWORD)

    one = client.post(f"/admin/teams/webhookdelivery/{delivery.pk}/delete/", {"post": "yes"})
    bulk = client.post(
        "/admin/teams/webhookdelivery/",
        {"action": "delete_selected", "_selected_action": [delivery.pk], "post": "yes"},
    )

    assert one.status_code == 403
    assert bulk.status_code in (200, 302)  # the admin offers no such action
    assert WebhookDelivery.objects.filter(pk=delivery.pk).exists()


def test_only_an_admin_sets_how_many_approvals_a_release_needs(client, demo_team, alice, bob):
    client.login(username="bob", password=PASSWORD)
    assert client.post("/team/settings/", {"approvals_required": 2}).status_code == 403
    client.login(username="alice", password=PASSWORD)
    assert client.post("/team/settings/", {"approvals_required": 0}).status_code == 400

    client.post("/team/settings/", {"approvals_required": 2})

    demo_team.refresh_from_db()
    assert demo_team.approvals_required == 2
    event = Event.objects.get(verb="team.settings")
    assert event.data == {"before": {"approvals_required": 1}, "after": {"approvals_required": 2}}


def test_a_token_is_created_with_its_scope_and_its_life_is_in_the_trail(client, demo_team, alice):
    client.login(username="alice", password=PASSWORD)

    page = client.post("/account/tokens/", {"name": "ci", "scope": "pipeline"}).content.decode()

    token = alice.api_tokens.get()
    assert token.scope == "pipeline" and "<td>pipeline</td>" in page
    client.post(f"/account/tokens/{token.pk}/revoke")
    verbs = list(Event.objects.filter(target_type="apitoken").values_list("verb", "data__scope"))
    assert sorted(verbs) == [("token.created", "pipeline"), ("token.revoked", "pipeline")]


def test_role_changes_are_in_the_trail_however_they_are_made(demo_team, alice, bob):
    membership = bob.memberships.get()
    membership.role = Role.ADMIN
    membership.save()
    membership.save()  # saving the same role again is not a change
    membership.delete()

    events = Event.objects.filter(target_type="membership", data__user="bob").order_by("id")
    assert [(e.verb, e.data["before"], e.data["after"]) for e in events] == [
        ("membership.added", None, "reviewer"),
        ("membership.role_changed", "reviewer", "admin"),
        ("membership.removed", "admin", None),
    ]


def admin_form_data(response):
    """The admin change form's fields as the browser would post them back, unchanged."""
    data = {}
    for name, field in response.context["adminform"].form.fields.items():
        value = response.context["adminform"].form.initial.get(name, field.initial)
        data[name] = "" if value is None else value
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        management = formset.management_form
        for name in management.fields:
            data[f"{formset.prefix}-{name}"] = management[name].value()
        for form in formset.forms:
            for name in form.fields:
                value = form[name].value()
                if value is not None:
                    data[form.add_prefix(name)] = value
    return data


def test_a_role_changed_in_the_admin_names_who_changed_it(client, demo_team, alice, bob):
    alice.is_staff = alice.is_superuser = True
    alice.save()
    client.force_login(alice)
    path = f"/admin/teams/team/{demo_team.pk}/change/"
    data = admin_form_data(client.get(path))
    role_field = next(k for k, v in data.items() if k.endswith("-user") and v == bob.pk)
    data[role_field.replace("-user", "-role")] = Role.ENGINEER

    response = client.post(path, data)

    assert response.status_code == 302, response.content[:2000]
    event = Event.objects.get(verb="membership.role_changed", data__user="bob")
    assert (event.actor, event.data["before"], event.data["after"]) == (
        "alice",
        "reviewer",
        "engineer",
    )
