"""Draining a device: the page and API v1 make the same change through one service."""

import json

import pytest
from django.core.exceptions import PermissionDenied

from deployhub.devices.actions import set_draining
from deployhub.teams.models import Event
from tests.api_calls import token_for
from tests.conftest import PASSWORD


def drain_on_page(client, user, device):
    client.login(username=user.username, password=PASSWORD)
    return client.post(f"/devices/{device.pk}/drain")


def drain_by_api(client, user, device, draining):
    body = json.dumps({"draining": draining})
    url = f"/api/v1/devices/{device.pk}/drain"
    return client.post(url, body, content_type="application/json", **token_for(user))


def events_of(device):
    return list(
        Event.objects.filter(target_type="device", target_id=device.pk)
        .order_by("id")
        .values_list("verb", "actor", "data")
    )


def test_it_drains_and_resumes_a_device_from_its_page(client, alice, make_device):
    device, _ = make_device()
    assert drain_on_page(client, alice, device).status_code == 302
    device.refresh_from_db()
    assert device.draining is True
    assert drain_on_page(client, alice, device).status_code == 302
    device.refresh_from_db()
    assert device.draining is False
    assert events_of(device) == [
        ("device.drained", "alice", {"before": "taking jobs", "after": "draining"}),
        ("device.undrained", "alice", {"before": "draining", "after": "taking jobs"}),
    ]


def test_it_drains_and_resumes_a_device_through_the_api(client, alice, make_device):
    device, _ = make_device()
    assert drain_by_api(client, alice, device, True).json()["draining"] is True
    assert drain_by_api(client, alice, device, False).json()["draining"] is False
    device.refresh_from_db()
    assert device.draining is False
    assert events_of(device) == [
        ("device.drained", "alice", {"before": "taking jobs", "after": "draining"}),
        ("device.undrained", "alice", {"before": "draining", "after": "taking jobs"}),
    ]


def test_the_page_and_the_api_record_the_same_events(client, alice, make_device):
    by_page, _ = make_device("by-page")
    by_api, _ = make_device("by-api")
    drain_on_page(client, alice, by_page)
    drain_by_api(client, alice, by_api, True)
    by_page.refresh_from_db()
    by_api.refresh_from_db()
    assert by_page.draining is by_api.draining is True
    assert (
        events_of(by_page)
        == events_of(by_api)
        == [("device.drained", "alice", {"before": "taking jobs", "after": "draining"})]
    )


def test_only_an_admin_drains_a_device(client, bob, make_device):
    device, _ = make_device()
    assert drain_on_page(client, bob, device).status_code == 403
    assert drain_by_api(client, bob, device, True).status_code == 403
    device.refresh_from_db()
    assert device.draining is False and events_of(device) == []


def test_another_team_cannot_find_the_device(client, charlie, make_device):
    device, _ = make_device()
    assert drain_on_page(client, charlie, device).status_code == 404
    assert drain_by_api(client, charlie, device, True).status_code == 404
    device.refresh_from_db()
    assert device.draining is False and events_of(device) == []


def test_set_draining_refuses_a_reviewer_and_changes_nothing(bob, make_device):
    device, _ = make_device()
    with pytest.raises(PermissionDenied):
        set_draining(device, True, bob)
    device.refresh_from_db()
    assert device.draining is False and events_of(device) == []
