"""Outgoing webhooks: each event of a team is POSTed, signed, to the team's webhooks that want it.

Every attempt is a WebhookDelivery row sent by a hub task (teams/tasks.py); a failed
one is retried with backoff (DEPLOYHUB_WEBHOOK_RETRY_DELAYS), each attempt kept.
"""

import hashlib
import hmac
import http.client
import json
import logging
import re
import socket
import ssl
import time
from datetime import timedelta
from urllib.parse import urlsplit

from django import forms
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from deployhub.teams.access import as_id, require_role
from deployhub.teams.addresses import BlockedAddress, checked_addresses, rules_in_force
from deployhub.teams.models import (
    DeliveryState,
    Event,
    Role,
    Webhook,
    WebhookDelivery,
    validate_webhook_url,
)
from deployhub.teams.webhook_url import read_webhook_url

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-DeployHub-Signature"
TIMESTAMP_HEADER = "X-DeployHub-Timestamp"
TIMEOUT_SECONDS = 10
# Seconds before each retry: five attempts in all. Tests shrink them with the setting.
DEFAULT_RETRY_DELAYS = (30, 120, 600, 3600)
PREFIX = re.compile(r"^[a-z0-9_.-]+$")


LOST_AFTER_S = 60
STUCK_AFTER_S = 300  # far past one attempt's timeouts
SENDER_LOST = "The hub worker stopped while sending; the attempt was given up and retried."


def retry_delays():
    return list(getattr(settings, "DEPLOYHUB_WEBHOOK_RETRY_DELAYS", DEFAULT_RETRY_DELAYS))


# Queueing: an event, once committed, becomes a first attempt for each matching webhook.


def announce_on_commit(event):
    """Queue the event's deliveries when its transaction commits (Event.save calls this)."""
    transaction.on_commit(lambda: queue_deliveries(event), robust=True)


def queue_deliveries(event):
    """Create and queue a first attempt for each active webhook of the event's team it matches.

    One query when none does (the event is the one just saved, not read back): every
    job claim and completion records an event, and a device waits for that answer.
    """
    for webhook in Webhook.objects.matching(event):
        delivery = WebhookDelivery.objects.create(
            webhook=webhook, event=event, next_attempt_at=timezone.now()
        )
        send_delivery(delivery.pk)


def send_delivery(delivery_id, countdown=0):
    """Put the attempt on the hub queue once the transaction commits."""

    def send():
        from deployhub.celery import app  # noqa: F401  (configures the task's app)
        from deployhub.teams.tasks import deliver_webhook

        try:
            deliver_webhook.apply_async(
                args=[delivery_id], queue=settings.CELERY_HUB_QUEUE, countdown=countdown
            )
        except Exception as exc:  # the broker is down: the attempt stays pending
            logger.warning("could not queue webhook delivery %s: %s", delivery_id, exc)

    transaction.on_commit(send)


def sweep_deliveries(now=None):
    """Resend attempts whose message was lost; fail and retry those whose sender died.

    A pending attempt more than a minute past due lost its message (the broker was down
    when it was queued, or the hub worker restarted); one still sending five minutes after
    it began lost its sender (an attempt times out in seconds). Returns (resent, given up on).
    """
    now = now or timezone.now()
    lost = WebhookDelivery.objects.filter(
        state=DeliveryState.PENDING, next_attempt_at__lt=now - timedelta(seconds=LOST_AFTER_S)
    )
    resent = list(lost.values_list("pk", flat=True))
    WebhookDelivery.objects.filter(pk__in=resent).update(next_attempt_at=now)  # once a minute
    for delivery_id in resent:
        send_delivery(delivery_id)
    stuck = WebhookDelivery.objects.filter(
        state=DeliveryState.SENDING, sending_since__lt=now - timedelta(seconds=STUCK_AFTER_S)
    ).select_related("webhook", "event")
    abandoned = []
    for delivery in stuck:
        moved = WebhookDelivery.objects.filter(pk=delivery.pk, state=DeliveryState.SENDING)
        if moved.update(state=DeliveryState.FAILED, error=SENDER_LOST, delivered_at=now):
            abandoned.append(delivery.pk)
            if delivery.webhook.active:
                retry(delivery)
    return resent, abandoned


# Sending: one attempt, signed, no redirects; a failure queues the next attempt.


def payload(event):
    """Return what a receiver gets for an event."""
    return {
        "id": event.pk,
        "team": event.team.slug,
        "actor": event.actor,
        "verb": event.verb,
        "target_type": event.target_type,
        "target_id": event.target_id,
        "data": event.data,
        "created_at": event.created_at.isoformat(),
    }


def sign(secret, timestamp, body):
    """Return the signature header's value: HMAC-SHA256 of "<timestamp>.<body>"."""
    message = f"{timestamp}.".encode() + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def attempt_delivery(delivery_id):
    """Send a pending attempt once, record its outcome, and queue the next one if it failed."""
    claimed = WebhookDelivery.objects.filter(pk=delivery_id, state=DeliveryState.PENDING)
    # The sweep judges a stuck sender from sending_since.
    if not claimed.update(state=DeliveryState.SENDING, sending_since=timezone.now()):
        return None  # sent already (a redelivered message), or its webhook is gone
    delivery = WebhookDelivery.objects.select_related("webhook", "event__team").get(pk=delivery_id)
    if delivery.webhook.active:
        status_code, error, duration_ms = post(delivery.webhook, delivery.event)
    else:
        status_code, error, duration_ms = None, "The webhook is paused.", None
    delivery.state = DeliveryState.FAILED if error else DeliveryState.SUCCEEDED
    delivery.status_code, delivery.error, delivery.duration_ms = status_code, error, duration_ms
    delivery.delivered_at = timezone.now()
    outcome = {
        "state": delivery.state,
        "status_code": status_code,
        "error": error,
        "duration_ms": duration_ms,
        "delivered_at": delivery.delivered_at,
    }
    sending = WebhookDelivery.objects.filter(pk=delivery_id, state=DeliveryState.SENDING)
    if not sending.update(**outcome):
        return delivery  # the sweep gave this attempt up meanwhile and queued the next one
    if error and delivery.webhook.active:
        retry(delivery)
    return delivery


def retry(delivery):
    """Queue the next attempt after its delay, unless the attempts are used up."""
    delays = retry_delays()
    if delivery.attempt > len(delays):
        return None
    delay = delays[delivery.attempt - 1]
    following = WebhookDelivery.objects.create(
        webhook=delivery.webhook,
        event=delivery.event,
        attempt=delivery.attempt + 1,
        next_attempt_at=timezone.now() + timedelta(seconds=delay),
    )
    send_delivery(following.pk, countdown=delay)
    return following


def post(webhook, event):
    """POST the event to the webhook; return (status code, error or "", duration in ms)."""
    body = json.dumps(payload(event), separators=(",", ":")).encode()
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "DeployHub-Webhooks",
        "X-DeployHub-Event": event.verb,
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: sign(webhook.secret, timestamp, body),
    }
    started = time.monotonic()
    status_code, error = _send(webhook.url, body, headers)
    return status_code, error, round((time.monotonic() - started) * 1000)


def _connection(parts, targets):
    """A connection to the URL's host (parts: read_webhook_url's) that connects only to
    `targets` (checked_addresses'), each in turn as a resolver's addresses are, with the
    host's name kept for the Host header and, over HTTPS, for SNI and the certificate."""
    if parts.scheme == "https":
        context = ssl.create_default_context()
        connection = http.client.HTTPSConnection(
            parts.host, parts.port, timeout=TIMEOUT_SECONDS, context=context
        )
    else:
        connection = http.client.HTTPConnection(parts.host, parts.port, timeout=TIMEOUT_SECONDS)

    def to_a_target(host_port, timeout, *args):
        """Connect to the first target that answers, all of them within one timeout."""
        if not isinstance(timeout, int | float):  # http.client's "no timeout given"
            timeout = TIMEOUT_SECONDS
        deadline, error = time.monotonic() + timeout, None
        for target in targets:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                return socket.create_connection((target, host_port[1]), left, *args)
            except OSError as exc:
                error = exc
        raise error or TimeoutError(f"{parts.host}: no address answered in {timeout} s")

    # connect() opens its socket with this (both classes; HTTPS then wraps it by host name).
    connection._create_connection = to_a_target
    return connection


def _send(url, body, headers):
    """POST once with http.client, which follows no redirect: a 3xx fails like a 5xx, and its
    Location is never connected to. Never to an address a rule refuses (teams/addresses.py):
    the refusal, naming the rule, is the attempt's error."""
    try:
        parts = read_webhook_url(url)
    except ValueError:  # a row saved without the form's check
        return None, f"Not delivered: {url[:200]!r} is not an http:// or https:// URL with a host."
    try:
        targets = checked_addresses(parts.host, parts.port)
    except BlockedAddress as exc:
        return None, f"Not delivered: {exc}"[:500]
    except (OSError, UnicodeError, ValueError) as exc:  # the name does not resolve
        return None, f"Not delivered: {parts.host} does not resolve ({exc!r})."[:500]
    connection = _connection(parts, targets)
    try:
        connection.request("POST", parts.target, body=body, headers=headers)
        response = connection.getresponse()
        response.read(64 * 1024)
    except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, timed out, ...
        return None, f"Not delivered: {exc!r}"[:500]
    finally:
        connection.close()
    if 300 <= response.status < 400:
        answer = f"The receiver answered {response.status} {response.reason}, a redirect: webhooks"
        return response.status, f"{answer} follow none (point the webhook where it leads)."[:500]
    if not 200 <= response.status < 300:
        return response.status, f"The receiver answered {response.status} {response.reason}."[:500]
    return response.status, ""


# The settings page: admins add and delete a team's webhooks.


class WebhookForm(forms.Form):
    url = forms.CharField(
        label="URL", max_length=500, validators=[validate_webhook_url], strip=True
    )
    events = forms.CharField(
        required=False,
        max_length=500,
        help_text="Verb prefixes, separated by commas, e.g. release., job.failed; empty: all.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Where this hub's webhooks may go, as its settings are now.
        rules = " ".join(rules_in_force())
        self.fields["url"].help_text = f"Checked on every address its host resolves to. {rules}"

    def clean_events(self):
        prefixes = [p.strip() for p in self.cleaned_data["events"].split(",") if p.strip()]
        bad = [prefix for prefix in prefixes if len(prefix) > 60 or not PREFIX.match(prefix)]
        if bad:
            raise forms.ValidationError(f"Not a verb prefix: {', '.join(bad)}.")
        return prefixes


def add_webhook(team, user, url, events):
    """Add a webhook to the team (admins) and record it; return it, its secret readable once."""
    require_role(user, team, Role.ADMIN)
    with transaction.atomic():
        webhook = Webhook.objects.create(team=team, url=url, events=events, created_by=user)
        Event.record(
            team,
            user,
            "webhook.created",
            webhook,
            url=shown_url(url),
            events=events,
            before=None,
            after="active",
        )
    return webhook


def delete_webhook(team, user, webhook_id):
    """Delete one of the team's webhooks with its deliveries (admins), and record it."""
    require_role(user, team, Role.ADMIN)
    webhook_id = as_id(webhook_id)
    if webhook_id is None:
        return None
    webhook = Webhook.objects.filter(team=team, pk=webhook_id).first()
    if webhook is None:
        return None
    with transaction.atomic():
        Event.record(
            team,
            user,
            "webhook.deleted",
            webhook,
            url=shown_url(webhook.url),
            events=webhook.events,
            before="active",
            after="deleted",
        )
        webhook.delete()
    return webhook


def webhooks_of(team):
    """Return the team's webhooks, each with its latest delivery attempt (or None)."""
    webhooks = list(Webhook.objects.filter(team=team))
    for webhook in webhooks:
        webhook.last_delivery = webhook.deliveries.first()
    return webhooks


def recent_deliveries(team, limit=50):
    """Return the team's latest delivery attempts, newest first, for the log."""
    deliveries = WebhookDelivery.objects.filter(webhook__team=team)
    return deliveries.select_related("webhook", "event")[:limit]


def shown_url(url):
    """Return the URL without its query and credentials (they are often the receiver's secret)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return f"{parts.scheme}://{netloc}{parts.path}"
