"""A device silent past its class's threshold is reported once (audit, webhooks, email) by
the reaper's pass, and its next heartbeat says it is back."""

from datetime import timedelta

import pytest
from django.core import mail
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from deployhub.devices.silence import report_silent_devices
from deployhub.jobs import tasks
from deployhub.teams.models import Event, Webhook, WebhookDelivery
from tests.api_calls import call

pytestmark = pytest.mark.django_db


@pytest.fixture
def hook(demo_team, alice):
    """The team's webhook for device events, and an address for its admin Alice."""
    alice.email = "alice@example.com"
    alice.save()
    return Webhook.objects.create(
        team=demo_team, url="https://ops.example.com/hook", events=["device."]
    )


def last_heard(device, minutes_ago):
    device.last_heartbeat_at = timezone.now() - timedelta(minutes=minutes_ago)
    device.save(update_fields=["last_heartbeat_at"])
    return device


def reaper_pass(capture):
    """Run the hub worker's periodic task once, and what its commits set off."""
    with capture(execute=True):
        tasks.reap()


def events(device, verb):
    return Event.objects.filter(verb=verb, target_type="device", target_id=device.pk)


def deliveries(verb):
    return WebhookDelivery.objects.filter(event__verb=verb)


def test_a_silent_device_is_reported_once_over_two_passes(
    make_device, hook, django_capture_on_commit_callbacks
):
    device, _ = make_device()
    last_heard(device, 11)  # the class's threshold is 10 minutes

    reaper_pass(django_capture_on_commit_callbacks)
    reaper_pass(django_capture_on_commit_callbacks)

    [event] = events(device, "device.silent")
    assert event.actor == "reaper" and event.data["silent_after_minutes"] == 10
    assert deliveries("device.silent").count() == 1
    assert deliveries("device.silent").get().webhook == hook
    [email] = mail.outbox
    assert email.to == ["alice@example.com"] and f"{device.name}" in email.subject
    assert "silent" in email.subject and f"/devices/{device.pk}/" in email.body
    device.refresh_from_db()
    assert device.silence_reported_at is not None


def test_its_heartbeat_says_it_is_back_and_a_new_silence_is_reported_again(
    client, make_device, hook, django_capture_on_commit_callbacks
):
    device, token = make_device()
    last_heard(device, 30)
    reaper_pass(django_capture_on_commit_callbacks)

    with django_capture_on_commit_callbacks(execute=True):
        assert call(client, token, "device/heartbeat", {}).status_code == 200
    reaper_pass(django_capture_on_commit_callbacks)

    device.refresh_from_db()
    assert device.silence_reported_at is None
    [back] = events(device, "device.back")
    assert back.actor == f"device:{device.name}"
    assert deliveries("device.back").count() == 1
    assert [m.subject.split()[-1] for m in mail.outbox] == ["silent", "back"]
    assert events(device, "device.silent").count() == 1

    last_heard(device, 30)
    reaper_pass(django_capture_on_commit_callbacks)
    assert events(device, "device.silent").count() == 2


def test_a_device_within_its_classs_threshold_is_not_reported(
    make_device, device_class, demo_team, hook, django_capture_on_commit_callbacks
):
    quiet = type(device_class).objects.create(
        team=demo_team, slug=f"{device_class.slug}-q", silent_after_minutes=60
    )
    within, _ = make_device()
    patient, _ = make_device(cls=quiet)
    last_heard(within, 9)
    last_heard(patient, 30)

    reaper_pass(django_capture_on_commit_callbacks)

    assert not Event.objects.filter(verb="device.silent").exists()
    assert not mail.outbox


def test_revoked_devices_and_devices_never_heard_from_are_not_reported(
    make_device, hook, django_capture_on_commit_callbacks
):
    revoked, _ = make_device()
    last_heard(revoked, 60)
    revoked.revoked_at = timezone.now()
    revoked.save(update_fields=["revoked_at"])
    make_device()  # registered, never started

    reaper_pass(django_capture_on_commit_callbacks)

    assert not Event.objects.filter(verb="device.silent").exists()


def test_looking_costs_one_query_when_nothing_is_silent(make_device):
    for minutes in (0, 2, 9):
        last_heard(make_device()[0], minutes)

    with CaptureQueriesContext(connection) as captured:
        assert report_silent_devices() == []

    assert len(captured) == 1
