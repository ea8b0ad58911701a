"""Outgoing webhooks: events POSTed, signed, to a real local receiver; failures retried."""

import hashlib
import hmac
import html
import ipaddress
import json
import secrets
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deployhub.teams.models import DeliveryState, Event, Webhook, WebhookDelivery
from deployhub.teams.webhooks import WebhookForm
from tests.conftest import PASSWORD, ROOT, hub_started_with

pytestmark = pytest.mark.django_db


class Receiver:
    """A local HTTP server that keeps each request and answers from a script of statuses."""

    def __init__(self, host="127.0.0.1", port=0):
        self.requests = []
        self.statuses = []  # answered in order; 200 once they run out
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((self.path, dict(self.headers), body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", receiver.url("/elsewhere"))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path="/hook"):
        host, port = self.server.server_address
        return f"http://{host}:{port}{path}"


@pytest.fixture
def receiver(settings):
    """A receiver on loopback, which webhooks may not reach by default: these tests open it."""
    settings.DEPLOYHUB_WEBHOOK_OPEN_NETWORKS = ["127.0.0.0/8"]
    server = Receiver()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def eager_hub():
    """Run hub tasks in the test's thread, as they are queued (their countdown is not waited)."""
    from deployhub.celery import app

    app.conf.task_always_eager, app.conf.task_eager_propagates = True, True
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = False, False


@pytest.fixture
def quick_retries(settings):
    settings.DEPLOYHUB_WEBHOOK_RETRY_DELAYS = [1, 2, 3, 4]


def record_committed(capture, team, actor, verb, target, **data):
    """Record an event and run what its commit sets off (the queued deliveries, eagerly)."""
    with capture(execute=True):
        return Event.record(team, actor, verb, target, **data)


@pytest.mark.parametrize(
    "url",
    ["ftp://example.com/hook", "file:///etc/passwd", "javascript:alert(1)", "http://", "hook"],
)
def test_it_refuses_a_url_that_is_not_http_or_https_with_a_host(url):
    form = WebhookForm({"url": url, "events": ""})

    assert not form.is_valid()
    assert "Enter an http:// or https:// URL with a host" in form.errors["url"][0]


@pytest.mark.parametrize(
    "url, said",
    [
        ("http://%00/", "'%00' is not a host name or an IP address."),
        ("http://ci.example.com:0/hook", "A port is from 1 to 65535, not 0."),
        ("http://ci.example.com:99999/hook", "A port is from 1 to 65535, not 99999."),
        # urlsplit's host is example.com; a browser's, evil.example
        ("http://evil.example\\@example.com/", "A URL cannot hold '\\\\'"),
        ("http://ci.example.com/a hook", "A URL cannot hold ' '"),
        ("http://a@b@example.com/", "Enter an http:// or https:// URL with a host"),
        ("http://[fe80::1%25eth0]/", "is not an IPv6 address"),
        ("http://ci.example.com:+80/", "Enter an http:// or https:// URL with a host"),
    ],
)
def test_it_refuses_a_url_it_cannot_read_strictly_saying_why(client, demo_team, alice, url, said):
    client.login(username="alice", password=PASSWORD)

    response = client.post("/team/settings/", {"action": "add_webhook", "url": url, "events": ""})

    assert response.status_code == 400 and said in html.unescape(response.content.decode())
    assert not Webhook.objects.exists() and not Event.objects.filter(verb="webhook.created")


def test_it_accepts_http_and_https_urls_and_reads_the_prefixes():
    form = WebhookForm({"url": "https://ci.example.com/h?x=1", "events": "release., job.failed"})

    assert form.is_valid()
    assert form.cleaned_data["events"] == ["release.", "job.failed"]
    assert WebhookForm({"url": "http://10.0.0.2:8080/", "events": ""}).is_valid()
    assert not WebhookForm({"url": "http://x.example/", "events": "Release!"}).is_valid()
    for url in ("http://ci_server:8080/h", "https://[2001:db8::1]:8443/", "http://CI.example./"):
        assert WebhookForm({"url": url, "events": ""}).is_valid(), url


def test_an_admin_adds_a_webhook_sees_its_secret_once_and_deletes_it(client, demo_team, alice):
    client.login(username="alice", password=PASSWORD)

    page = client.post(
        "/team/settings/",
        {"action": "add_webhook", "url": "https://ci.example.com/hook", "events": "release."},
    ).content.decode()

    webhook = Webhook.objects.get(team=demo_team)
    assert webhook.events == ["release."] and webhook.created_by == alice
    assert webhook.secret.startswith("whsec_") and webhook.secret in page
    again = client.get("/team/settings/").content.decode()
    assert webhook.secret not in again and webhook.secret_hint in again
    assert "https://ci.example.com/hook" in again and "Add a webhook" in again
    client.post("/team/settings/", {"action": "delete_webhook", "webhook": webhook.pk})
    assert not Webhook.objects.exists()
    verbs = Event.objects.filter(target_type="webhook").values_list("verb", flat=True)
    assert sorted(verbs) == ["webhook.created", "webhook.deleted"]
    assert all("secret" not in e.data for e in Event.objects.filter(target_type="webhook"))


def test_a_bad_url_is_said_on_the_page_and_adds_nothing(client, demo_team, alice):
    client.login(username="alice", password=PASSWORD)

    response = client.post(
        "/team/settings/", {"action": "add_webhook", "url": "ftp://example.com/", "events": ""}
    )

    assert response.status_code == 400
    assert "Enter an http:// or https:// URL with a host" in response.content.decode()
    assert not Webhook.objects.exists()


def test_deleting_another_teams_webhook_is_a_404_and_deletes_nothing(client, alice, charlie):
    theirs = Webhook.objects.create(team=charlie.memberships.get().team, url="https://c.example/")
    client.login(username="alice", password=PASSWORD)

    response = client.post("/team/settings/", {"action": "delete_webhook", "webhook": theirs.pk})

    assert response.status_code == 404 and "Webhook deleted." not in response.content.decode()
    assert Webhook.objects.filter(pk=theirs.pk).exists()
    assert not Event.objects.filter(verb="webhook.deleted").exists()


def test_a_non_admin_cannot_add_or_delete_a_webhook(client, demo_team, alice, bob):
    webhook = Webhook.objects.create(team=demo_team, url="https://ci.example.com/hook")
    client.login(username="bob", password=PASSWORD)

    add = {"action": "add_webhook", "url": "https://evil.example.com/", "events": ""}
    assert client.post("/team/settings/", add).status_code == 403
    delete = {"action": "delete_webhook", "webhook": webhook.pk}
    assert client.post("/team/settings/", delete).status_code == 403
    assert list(Webhook.objects.values_list("url", flat=True)) == ["https://ci.example.com/hook"]
    assert "Add a webhook" not in client.get("/team/settings/").content.decode()


def test_a_delivery_is_signed_and_carries_the_event(
    receiver, eager_hub, demo_team, alice, django_capture_on_commit_callbacks
):
    webhook = Webhook.objects.create(team=demo_team, url=receiver.url(), events=["release."])

    event = record_committed(
        django_capture_on_commit_callbacks, demo_team, alice, "release.proposed", demo_team, n=1
    )

    [(path, headers, body)] = receiver.requests
    timestamp = headers["X-DeployHub-Timestamp"]
    expected = hmac.new(webhook.secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    assert path == "/hook"
    assert headers["X-DeployHub-Signature"] == f"sha256={expected.hexdigest()}"
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {
        "id": event.pk,
        "team": "demo",
        "actor": "alice",
        "verb": "release.proposed",
        "target_type": "team",
        "target_id": demo_team.pk,
        "data": {"n": 1},
        "created_at": event.created_at.isoformat(),
    }
    delivery = WebhookDelivery.objects.get()
    assert delivery.state == DeliveryState.SUCCEEDED and delivery.status_code == 200
    assert delivery.event == event and delivery.attempt == 1
    assert delivery.duration_ms is not None and delivery.delivered_at is not None


def test_only_events_matching_a_prefix_are_delivered(
    receiver, eager_hub, demo_team, alice, charlie, django_capture_on_commit_callbacks
):
    Webhook.objects.create(team=demo_team, url=receiver.url("/releases"), events=["release."])
    Webhook.objects.create(team=demo_team, url=receiver.url("/failures"), events=["job.failed"])
    Webhook.objects.create(team=demo_team, url=receiver.url("/all"))
    Webhook.objects.create(team=demo_team, url=receiver.url("/paused"), active=False)
    acme = charlie.memberships.get().team

    for team, verb in [
        (demo_team, "release.approved"),
        (demo_team, "job.failed"),
        (demo_team, "job.queued"),
        (acme, "release.approved"),  # another team's event
    ]:
        record_committed(django_capture_on_commit_callbacks, team, alice, verb, team)

    got = sorted((path, json.loads(body)["verb"]) for path, _, body in receiver.requests)
    assert got == [
        ("/all", "job.failed"),
        ("/all", "job.queued"),
        ("/all", "release.approved"),
        ("/failures", "job.failed"),
        ("/releases", "release.approved"),
    ]


def test_a_failing_receiver_is_retried_with_backoff_and_each_attempt_recorded(
    receiver, eager_hub, quick_retries, demo_team, alice, django_capture_on_commit_callbacks
):
    Webhook.objects.create(team=demo_team, url=receiver.url(), events=["job."])
    receiver.statuses = [500, 500, 500, 500, 500, 500]

    record_committed(django_capture_on_commit_callbacks, demo_team, alice, "job.failed", demo_team)

    assert len(receiver.requests) == 5  # five attempts, then it gives up
    attempts = WebhookDelivery.objects.order_by("attempt")
    assert [(d.attempt, d.state, d.status_code) for d in attempts] == [
        (n, DeliveryState.FAILED, 500) for n in range(1, 6)
    ]
    assert "500" in attempts[0].error
    first = attempts[0].created_at
    delays = [round((d.next_attempt_at - first).total_seconds()) for d in attempts[1:]]
    assert delays == [1, 2, 3, 4]


def test_a_receiver_that_recovers_gets_the_event_on_a_later_attempt(
    receiver, eager_hub, quick_retries, demo_team, alice, django_capture_on_commit_callbacks
):
    Webhook.objects.create(team=demo_team, url=receiver.url())
    receiver.statuses = [503, 500]

    record_committed(django_capture_on_commit_callbacks, demo_team, alice, "job.failed", demo_team)

    states = WebhookDelivery.objects.order_by("attempt").values_list("state", "status_code")
    assert list(states) == [("failed", 503), ("failed", 500), ("succeeded", 200)]
    assert len({body for _, _, body in receiver.requests}) == 1  # the same event each time


def test_a_redirect_is_not_followed_and_counts_as_a_failure(
    receiver, eager_hub, settings, demo_team, alice, django_capture_on_commit_callbacks
):
    settings.DEPLOYHUB_WEBHOOK_RETRY_DELAYS = []  # one attempt
    Webhook.objects.create(team=demo_team, url=receiver.url())
    receiver.statuses = [302]

    record_committed(django_capture_on_commit_callbacks, demo_team, alice, "job.failed", demo_team)

    assert [path for path, _, _ in receiver.requests] == ["/hook"]  # never /elsewhere
    delivery = WebhookDelivery.objects.get()
    assert delivery.state == DeliveryState.FAILED and delivery.status_code == 302


def test_an_unreachable_receiver_is_a_failed_attempt(
    eager_hub, settings, demo_team, alice, django_capture_on_commit_callbacks
):
    settings.DEPLOYHUB_WEBHOOK_RETRY_DELAYS = []
    settings.DEPLOYHUB_WEBHOOK_OPEN_NETWORKS = ["127.0.0.0/8"]  # to be refused there
    Webhook.objects.create(team=demo_team, url="http://127.0.0.1:9/hook")  # discard: refused

    record_committed(django_capture_on_commit_callbacks, demo_team, alice, "job.failed", demo_team)

    delivery = WebhookDelivery.objects.get()
    assert delivery.state == DeliveryState.FAILED and delivery.status_code is None
    assert delivery.error.startswith("Not delivered")


def test_an_event_queues_its_delivery_on_the_hub_queue(
    broker, settings, demo_team, alice, django_capture_on_commit_callbacks
):
    broker.delete(settings.CELERY_HUB_QUEUE)
    Webhook.objects.create(team=demo_team, url="https://ci.example.com/hook")

    record_committed(django_capture_on_commit_callbacks, demo_team, alice, "job.failed", demo_team)

    [message] = [json.loads(m) for m in broker.lrange(settings.CELERY_HUB_QUEUE, 0, -1)]
    broker.delete(settings.CELERY_HUB_QUEUE)
    assert message["headers"]["task"] == "deployhub.teams.deliver_webhook"
    assert message["headers"]["argsrepr"] == repr([WebhookDelivery.objects.get().pk])


def test_the_settings_page_shows_the_delivery_log(client, demo_team, alice):
    webhook = Webhook.objects.create(team=demo_team, url="https://ci.example.com/hook")
    event = Event.record(demo_team, alice, "release.promoted", demo_team)
    WebhookDelivery.objects.create(
        webhook=webhook, event=event, state=DeliveryState.FAILED, status_code=502, duration_ms=37
    )
    client.login(username="alice", password=PASSWORD)

    page = client.get("/team/settings/").content.decode()

    assert "release.promoted" in page and "502" in page and "37 ms" in page and "Failed" in page


def test_only_an_admin_sees_the_webhooks_and_their_deliveries(client, demo_team, alice, bob):
    webhook = Webhook.objects.create(team=demo_team, url="https://ci.example.com/hook?key=s3")
    event = Event.record(demo_team, alice, "release.promoted", demo_team)
    WebhookDelivery.objects.create(webhook=webhook, event=event, error="401 bad key s3")
    client.login(username="bob", password=PASSWORD)

    page = client.get("/team/settings/").content.decode()

    assert "ci.example.com" not in page and "bad key" not in page
    assert "Only an admin sees the team's webhooks" in page


def test_the_hub_worker_knows_the_delivery_task():
    check = (
        "import django; django.setup(); from deployhub.celery import app;"
        "app.loader.import_default_modules();"
        "assert 'deployhub.teams.deliver_webhook' in app.tasks"
    )
    subprocess.run([sys.executable, "-c", check], cwd=ROOT, check=True, timeout=60)


def test_a_bad_port_a_bad_id_and_secrets_in_the_url_are_handled(client, demo_team, alice):
    from django.core.exceptions import ValidationError

    from deployhub.teams.models import validate_webhook_url

    with pytest.raises(ValidationError):
        validate_webhook_url("https://ci.example.com:99999/hook")
    client.login(username="alice", password=PASSWORD)
    response = client.post("/team/settings/", {"action": "delete_webhook", "webhook": "abc"})
    assert response.status_code == 404
    client.post(
        "/team/settings/",
        {"action": "add_webhook", "url": "https://user:pw@hooks.example.com/x?token=s3cret"},
    )
    created = Event.objects.filter(verb="webhook.created").values_list("data__url", flat=True)
    assert list(created) == ["https://hooks.example.com/x"]


def test_a_lost_attempt_is_sent_by_the_sweep_and_a_dead_senders_is_retried(
    receiver, eager_hub, quick_retries, demo_team, alice, django_capture_on_commit_callbacks
):
    from datetime import timedelta

    from django.utils import timezone

    from deployhub.teams.webhooks import sweep_deliveries

    webhook = Webhook.objects.create(team=demo_team, url=receiver.url())
    event = Event.record(demo_team, alice, "release.promoted", demo_team)
    long_ago = timezone.now() - timedelta(minutes=10)
    lost = WebhookDelivery.objects.create(webhook=webhook, event=event, next_attempt_at=long_ago)
    stuck = WebhookDelivery.objects.create(
        webhook=webhook,
        event=event,
        state=DeliveryState.SENDING,
        next_attempt_at=long_ago,
        sending_since=long_ago,
    )
    not_due = WebhookDelivery.objects.create(
        webhook=webhook, event=event, next_attempt_at=timezone.now()
    )

    with django_capture_on_commit_callbacks(execute=True):
        resent, given_up = sweep_deliveries()

    assert set(resent) == {lost.pk} and given_up == [stuck.pk]
    for delivery in (lost, stuck, not_due):
        delivery.refresh_from_db()
    assert lost.state == DeliveryState.SUCCEEDED and len(receiver.requests) >= 1
    assert stuck.state == DeliveryState.FAILED and "stopped while sending" in stuck.error
    assert WebhookDelivery.objects.filter(attempt=2).exists()  # the dead sender's retry
    assert not_due.state == DeliveryState.PENDING  # its own message is still on its way


def test_a_send_the_sweep_gave_up_on_does_not_overwrite_it_or_retry_twice(
    eager_hub, quick_retries, demo_team, alice, monkeypatch, django_capture_on_commit_callbacks
):
    from datetime import timedelta

    from django.utils import timezone

    from deployhub.teams import webhooks

    webhook = Webhook.objects.create(team=demo_team, url="https://ci.example.com/hook")
    event = Event.record(demo_team, alice, "release.promoted", demo_team)
    delivery = WebhookDelivery.objects.create(
        webhook=webhook, event=event, next_attempt_at=timezone.now()
    )

    def slow_post(webhook, event):  # the sweep runs, much later, while this POST hangs
        assert webhooks.sweep_deliveries(now=timezone.now() + timedelta(minutes=10))[1]
        return 200, "", 5

    monkeypatch.setattr(webhooks, "post", slow_post)
    monkeypatch.setattr(webhooks, "send_delivery", lambda *args, **kwargs: None)
    webhooks.attempt_delivery(delivery.pk)

    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.FAILED and "stopped while sending" in delivery.error
    assert WebhookDelivery.objects.filter(attempt=2).count() == 1  # the sweep's retry only


def test_an_attempt_that_just_began_sending_is_not_given_up(demo_team, alice):
    from django.utils import timezone

    from deployhub.teams.webhooks import sweep_deliveries

    webhook = Webhook.objects.create(team=demo_team, url="https://ci.example.com/hook")
    event = Event.record(demo_team, alice, "release.promoted", demo_team)
    WebhookDelivery.objects.create(
        webhook=webhook, event=event, state=DeliveryState.SENDING, sending_since=timezone.now()
    )

    assert sweep_deliveries() == ([], [])


# Webhooks never reach the hub's own host or a cloud's metadata service (teams/addresses.py).

LOOPBACK, METADATA, THIS_NETWORK = "is loopback", "is a cloud metadata service", '"this network"'
BLOCKED_URLS = [
    ("http://127.0.0.1:8080/hook", LOOPBACK),
    ("http://localhost/hook", LOOPBACK),
    ("http://LOCALHOST./hook", LOOPBACK),
    ("http://[::1]:5432/", LOOPBACK),
    ("http://169.254.169.254/latest/meta-data/", METADATA),
    ("http://0.0.0.0:6379/", THIS_NETWORK),
    # 127.0.0.1 as the resolver also reads it, and carried by IPv6 addresses
    *((url, LOOPBACK) for url in ("http://127.1/", "http://2130706433/", "http://0x7f.1/")),
    ("http://127.0.0.1./", LOOPBACK),
    ("http://0/", THIS_NETWORK),
    ("http://[::ffff:127.0.0.1]/hook", LOOPBACK),
    ("http://[::127.0.0.1]/", LOOPBACK),
    ("http://[2002:7f00:1::]/", LOOPBACK),
    ("http://[64:ff9b::a9fe:a9fe]/", METADATA),
]


@pytest.mark.parametrize("url, rule", BLOCKED_URLS)
def test_a_webhook_to_the_hubs_own_host_or_a_metadata_service_is_refused_on_the_page(
    client, demo_team, alice, url, rule
):
    client.login(username="alice", password=PASSWORD)

    response = client.post("/team/settings/", {"action": "add_webhook", "url": url, "events": ""})

    assert response.status_code == 400
    page = html.unescape(response.content.decode())
    assert rule in page and "which webhooks never reach" in page
    assert not Webhook.objects.exists() and not Event.objects.filter(verb="webhook.created")


def test_private_networks_stay_open_unless_the_setting_closes_them(settings):
    assert WebhookForm({"url": "http://10.0.0.2:8080/", "events": ""}).is_valid()
    assert WebhookForm({"url": "http://[fd12::1]/", "events": ""}).is_valid()

    settings.DEPLOYHUB_WEBHOOK_BLOCKED_NETWORKS = [
        *settings.DEPLOYHUB_WEBHOOK_BLOCKED_NETWORKS,
        "10.0.0.0/8",
    ]

    form = WebhookForm({"url": "http://10.0.0.2:8080/", "events": ""})
    assert not form.is_valid() and "10.0.0.0/8" in form.errors["url"][0]


def blocked_networks_with(**env):
    """The blocked networks a hub started with this environment has."""
    code = "from django.conf import settings; print(','.join(settings.{}))".format(
        "DEPLOYHUB_WEBHOOK_BLOCKED_NETWORKS"
    )
    started = hub_started_with(code, **env)
    return started.returncode, started.stdout.strip().split(","), started.stderr


@pytest.mark.parametrize("value", ["10.0.0.0/8,192.168.0.0/16", "", " "])
def test_the_setting_adds_networks_and_an_empty_one_keeps_the_defaults(value):
    """Following the docs (adding private networks) must not open loopback or metadata."""
    code, networks, _ = blocked_networks_with(DEPLOYHUB_WEBHOOK_BLOCKED_NETWORKS=value)

    assert code == 0
    assert {"127.0.0.0/8", "169.254.0.0/16", "::1/128"} <= set(networks)
    assert ("10.0.0.0/8" in networks) == ("10.0.0.0" in value)


def test_an_unclosed_ipv6_bracket_is_a_form_error_not_a_500(client, demo_team, alice):
    client.login(username="alice", password=PASSWORD)

    add = {"action": "add_webhook", "url": "http://[::1", "events": ""}
    response = client.post("/team/settings/", add)

    assert response.status_code == 400 and not Webhook.objects.exists()


@pytest.fixture
def loopback_receiver():
    """A receiver on loopback, left closed to webhooks (the default)."""
    server = Receiver()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.mark.parametrize("host", ["localhost", "2130706433", "127.1"])  # all 127.0.0.1
def test_a_host_name_that_resolves_to_a_blocked_address_is_not_sent_to(
    loopback_receiver,
    eager_hub,
    settings,
    demo_team,
    alice,
    django_capture_on_commit_callbacks,
    host,
):
    """Saved before this check, or a name: its addresses are checked when it is sent."""
    settings.DEPLOYHUB_WEBHOOK_RETRY_DELAYS = []
    port = loopback_receiver.server.server_address[1]
    Webhook.objects.create(team=demo_team, url=f"http://{host}:{port}/hook")

    record_committed(django_capture_on_commit_callbacks, demo_team, alice, "job.failed", demo_team)

    assert loopback_receiver.requests == []
    delivery = WebhookDelivery.objects.get()
    assert delivery.state == DeliveryState.FAILED and delivery.status_code is None
    assert "127.0.0.1" in delivery.error and "is loopback" in delivery.error


def test_a_name_is_sent_to_the_address_that_was_checked_not_where_it_resolves_next(
    eager_hub, settings, monkeypatch, demo_team, alice, django_capture_on_commit_callbacks
):
    """A name that resolves to an open address, then to a blocked one (DNS rebinding)."""
    import socket

    settings.DEPLOYHUB_WEBHOOK_RETRY_DELAYS = []
    settings.DEPLOYHUB_WEBHOOK_OPEN_NETWORKS = ["127.0.0.2/32"]  # the rest of loopback blocked
    opened = Receiver("127.0.0.2")
    port = opened.server.server_address[1]
    closed = Receiver("127.0.0.1", port)  # the same port on the blocked address
    for server in (opened, closed):
        server.thread.start()
    answers = iter(["127.0.0.2"] + ["127.0.0.1"] * 5)
    real = socket.getaddrinfo

    def rebinding(host, *args, **kwargs):
        return real(next(answers) if host == "rebind.test" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    Webhook.objects.create(team=demo_team, url=f"http://rebind.test:{port}/hook")
    try:
        record_committed(
            django_capture_on_commit_callbacks, demo_team, alice, "job.failed", demo_team
        )
    finally:
        for server in (opened, closed):
            server.server.shutdown()
            server.server.server_close()

    assert WebhookDelivery.objects.get().state == DeliveryState.SUCCEEDED
    [(_, headers, _)] = opened.requests
    assert headers["Host"] == f"rebind.test:{port}"
    assert closed.requests == []


def test_a_mistyped_network_stops_the_hub_at_start_naming_it():
    code, _, stderr = blocked_networks_with(DEPLOYHUB_WEBHOOK_OPEN_NETWORKS="10.0.0.0/33")

    assert code != 0 and "10.0.0.0/33" in stderr


def test_each_address_of_a_name_is_tried_in_turn(
    receiver, eager_hub, settings, monkeypatch, demo_team, alice, django_capture_on_commit_callbacks
):
    """A dual-stack receiver whose first address does not answer still gets its events."""
    import socket

    settings.DEPLOYHUB_WEBHOOK_RETRY_DELAYS = []
    port = receiver.server.server_address[1]
    real = socket.getaddrinfo

    def two_addresses(host, *args, **kwargs):
        if host != "dual.test":
            return real(host, *args, **kwargs)
        return [*real("127.0.0.3", *args, **kwargs), *real("127.0.0.1", *args, **kwargs)]

    monkeypatch.setattr(socket, "getaddrinfo", two_addresses)
    Webhook.objects.create(team=demo_team, url=f"http://dual.test:{port}/hook")

    record_committed(django_capture_on_commit_callbacks, demo_team, alice, "job.failed", demo_team)

    assert WebhookDelivery.objects.get().state == DeliveryState.SUCCEEDED
    assert len(receiver.requests) == 1


@pytest.mark.parametrize(
    "url",
    [
        *("ftp://example.com/hook", "http://example.com:99999/", "http:///x", "https://:443/x"),
        *("http://evil.invalid\\@example.invalid/", "http://%00/", "http://example.com:0/"),
    ],
)
def test_a_stored_url_the_form_would_refuse_is_a_failed_attempt_not_a_crash(
    eager_hub, settings, demo_team, alice, django_capture_on_commit_callbacks, url
):
    settings.DEPLOYHUB_WEBHOOK_RETRY_DELAYS = []
    Webhook.objects.create(team=demo_team, url=url)  # saved without the form's check

    record_committed(django_capture_on_commit_callbacks, demo_team, alice, "job.failed", demo_team)

    delivery = WebhookDelivery.objects.get()
    assert delivery.state == DeliveryState.FAILED and "is not an http" in delivery.error


def test_opening_one_network_opens_nothing_else(settings):
    """A relay on 127.0.0.1 opened: localhost may still be ::1, and 169.254.169.254 inside an
    IPv6 address stays closed."""
    settings.DEPLOYHUB_WEBHOOK_OPEN_NETWORKS = ["127.0.0.0/8"]

    assert WebhookForm({"url": "http://127.0.0.1:8080/hook", "events": ""}).is_valid()
    form = WebhookForm({"url": "http://localhost:8080/hook", "events": ""})
    assert not form.is_valid() and "(::1) is loopback" in form.errors["url"][0]
    form = WebhookForm({"url": "http://[::ffff:169.254.169.254]/", "events": ""})
    assert not form.is_valid() and "whatever the settings" in form.errors["url"][0]

    settings.DEPLOYHUB_WEBHOOK_OPEN_NETWORKS = ["127.0.0.1/32", "::1/128"]
    assert WebhookForm({"url": "http://localhost:8080/hook", "events": ""}).is_valid()


def test_an_attempt_over_many_addresses_that_never_answer_keeps_to_its_timeout(
    eager_hub, settings, monkeypatch, demo_team, alice, django_capture_on_commit_callbacks
):
    """A name can resolve to dozens of addresses: together they get one attempt's time."""
    import socket
    import time

    from deployhub.teams import webhooks

    settings.DEPLOYHUB_WEBHOOK_RETRY_DELAYS = []
    monkeypatch.setattr(webhooks, "TIMEOUT_SECONDS", 1)
    real = socket.getaddrinfo

    def many(host, *args, **kwargs):
        if host != "many.test":
            return real(host, *args, **kwargs)
        return [info for n in range(10, 40) for info in real(f"10.9.9.{n}", *args, **kwargs)]

    def silent(address, timeout, *args):
        time.sleep(min(timeout, 0.3))
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "getaddrinfo", many)
    monkeypatch.setattr(socket, "create_connection", silent)
    Webhook.objects.create(team=demo_team, url="http://many.test/hook")

    record_committed(django_capture_on_commit_callbacks, demo_team, alice, "job.failed", demo_team)

    delivery = WebhookDelivery.objects.get()
    assert delivery.state == DeliveryState.FAILED and delivery.duration_ms < 1500


# Every address a webhook's host resolves to, checked where the connection is made: a test
# resolver names each forbidden range, and any connection the sender opens goes to a real
# listener on loopback that counts them, so nothing leaves the machine and none is missed.

FORBIDDEN = {
    "loopback.test": ("127.0.0.1", "is loopback"),
    "loopback-far.test": ("127.254.3.4", "is loopback"),
    "ip6-loopback.test": ("::1", "is loopback"),
    "metadata.test": ("169.254.169.254", "is a cloud metadata service"),
    "aws6-metadata.test": ("fd00:ec2::254", "is a cloud metadata service"),
    "alibaba-metadata.test": ("100.100.100.200", "is a cloud metadata service"),
    "link-local.test": ("169.254.7.7", "is link-local"),
    "ip6-link-local.test": ("fe80::1", "is link-local"),
    "this-network.test": ("0.0.0.0", '"this network"'),
    "mapped-loopback.test": ("::ffff:127.0.0.1", "which carries 127.0.0.1, is loopback"),
    "mapped-metadata.test": ("::ffff:169.254.169.254", "is a cloud metadata service"),
    "nat64-metadata.test": ("64:ff9b::a9fe:a9fe", "is a cloud metadata service"),
    "6to4-loopback.test": ("2002:7f00:1::", "which carries 127.0.0.1, is loopback"),
    "ten.test": ("10.1.2.3", "private network 10.0.0.0/8"),
    "seventeen.test": ("172.16.5.4", "private network 172.16.0.0/12"),
    "home.test": ("192.168.1.1", "private network 192.168.0.0/16"),
    "cgnat.test": ("100.64.0.1", "private network 100.64.0.0/10"),
    "ula.test": ("fd12::1", "private network fc00::/7"),
    "mapped-ten.test": ("::ffff:10.0.0.1", "private network 10.0.0.0/8"),
}
ALWAYS_REFUSED = [name for name, (_, rule) in FORBIDDEN.items() if "private" not in rule]
NOT_LOOPBACK = [name for name in ALWAYS_REFUSED if "loopback" not in FORBIDDEN[name][1]]


class CountingListener(Receiver):
    """A receiver on loopback that also counts the connections it accepts."""

    def __init__(self):
        super().__init__()
        self.connections = 0
        accept = self.server.get_request

        def counted():
            self.connections += 1
            return accept()

        self.server.get_request = counted


@pytest.fixture
def listener():
    server = CountingListener()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def test_resolver(monkeypatch, listener):
    """Names under .test resolve to FORBIDDEN's addresses (and private.test to 10.20.30.40);
    each connection the sender opens is recorded and made to the listener instead."""
    import socket

    names = {name: address for name, (address, _) in FORBIDDEN.items()}
    names["private.test"] = "10.20.30.40"
    real_resolve, real_connect, asked = socket.getaddrinfo, socket.create_connection, []

    def resolve(host, port, *args, **kwargs):
        if not str(host).endswith(".test"):
            return real_resolve(host, port, *args, **kwargs)
        address = names[host]
        if ":" in address:
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    def connect(address, *args, **kwargs):
        asked.append(address[0])
        return real_connect(listener.server.server_address, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setattr(socket, "create_connection", connect)
    return asked


def delivered_to(capture, team, actor, host, settings, port=8080):
    """Send one event to a webhook at the host, with no retries; return its attempt."""
    settings.DEPLOYHUB_WEBHOOK_RETRY_DELAYS = []
    Webhook.objects.create(team=team, url=f"http://{host}:{port}/hook")
    record_committed(capture, team, actor, "job.failed", team)
    return WebhookDelivery.objects.get()


@pytest.mark.parametrize("name", FORBIDDEN)
def test_a_name_resolving_to_a_forbidden_range_is_never_connected_to(
    test_resolver, listener, eager_hub, settings, demo_team, alice,
    django_capture_on_commit_callbacks, name,
):  # fmt: skip
    """Production's defaults: private networks refused too. The attempt says which rule."""
    settings.DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE = False
    address, rule = FORBIDDEN[name]
    address = str(ipaddress.ip_address(address))  # as Python writes it

    delivery = delivered_to(django_capture_on_commit_callbacks, demo_team, alice, name, settings)

    assert test_resolver == [] and listener.connections == 0 and listener.requests == []
    assert delivery.state == DeliveryState.FAILED and delivery.status_code is None
    assert f"Refused: {name} ({address})" in delivery.error and rule in delivery.error
    if "private" in rule:
        assert "DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE is on (it is off" in delivery.error


@pytest.mark.parametrize(
    "name, production",
    [*((name, True) for name in ALWAYS_REFUSED), *((name, False) for name in NOT_LOOPBACK)],
)
def test_allowing_private_networks_still_refuses_loopback_link_local_and_metadata(
    test_resolver, listener, eager_hub, settings, demo_team, alice,
    django_capture_on_commit_callbacks, name, production,
):  # fmt: skip
    """Whatever the settings; only the embedded run may open loopback (the next tests)."""
    settings.PRODUCTION = production
    settings.DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE = True
    settings.DEPLOYHUB_WEBHOOK_OPEN_NETWORKS = ["0.0.0.0/0", "::/0"]  # opens no always-closed kind

    delivery = delivered_to(django_capture_on_commit_callbacks, demo_team, alice, name, settings)

    assert test_resolver == [] and listener.connections == 0
    assert delivery.state == DeliveryState.FAILED and "never reach" in delivery.error


@pytest.mark.parametrize("allowed", [True, False])
def test_a_private_receiver_is_reached_only_when_the_operator_allows_it(
    test_resolver, listener, eager_hub, settings, demo_team, alice,
    django_capture_on_commit_callbacks, allowed,
):  # fmt: skip
    settings.DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE = allowed

    capture = django_capture_on_commit_callbacks
    delivery = delivered_to(capture, demo_team, alice, "private.test", settings)

    assert (delivery.state == DeliveryState.SUCCEEDED) is allowed
    assert test_resolver == (["10.20.30.40"] if allowed else [])
    assert len(listener.requests) == listener.connections == int(allowed)


def test_an_open_network_reaches_one_private_subnet_while_the_rest_stay_refused(settings):
    settings.DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE = False
    settings.DEPLOYHUB_WEBHOOK_OPEN_NETWORKS = ["10.20.0.0/16"]

    assert WebhookForm({"url": "http://10.20.30.40/hook", "events": ""}).is_valid()
    form = WebhookForm({"url": "http://10.21.0.1/hook", "events": ""})
    assert not form.is_valid() and "private network 10.0.0.0/8" in form.errors["url"][0]


def test_a_redirect_to_a_forbidden_address_is_not_followed(
    test_resolver, listener, eager_hub, settings, demo_team, alice,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    """The receiver (a private one, allowed) redirects to the metadata service."""
    settings.DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE = True
    listener.statuses = [302]  # with this Location:
    listener.url = lambda path: "http://169.254.169.254/latest/meta-data/"

    capture = django_capture_on_commit_callbacks
    delivery = delivered_to(capture, demo_team, alice, "private.test", settings)

    assert test_resolver == ["10.20.30.40"] and listener.connections == 1
    assert [path for path, _, _ in listener.requests] == ["/hook"]
    assert delivery.state == DeliveryState.FAILED and delivery.status_code == 302
    assert "a redirect: webhooks follow none" in delivery.error


@pytest.mark.parametrize("production", [False, True])
def test_loopback_opens_for_a_local_receiver_in_the_embedded_run_only(
    receiver, eager_hub, settings, demo_team, alice, django_capture_on_commit_callbacks,
    production,
):  # fmt: skip
    """receiver opens 127.0.0.0/8 with DEPLOYHUB_WEBHOOK_OPEN_NETWORKS; production ignores it."""
    settings.PRODUCTION = production
    port = receiver.server.server_address[1]

    capture = django_capture_on_commit_callbacks
    delivery = delivered_to(capture, demo_team, alice, "127.0.0.1", settings, port)

    assert (delivery.state == DeliveryState.SUCCEEDED) is not production
    assert len(receiver.requests) == int(not production)
    if production:
        assert "in production nothing does" in delivery.error


@pytest.mark.parametrize(
    "env, allowed",
    [
        ({"DEPLOYHUB_ENV": "embedded"}, "True"),
        ({"DEPLOYHUB_ENV": "production"}, "False"),
        ({"DEPLOYHUB_ENV": "production", "DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE": "true"}, "True"),
        ({"DEPLOYHUB_ENV": "embedded", "DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE": "false"}, "False"),
    ],
)
def test_private_networks_are_refused_by_default_in_production_and_allowed_embedded(env, allowed):
    key = "k" + secrets.token_urlsafe(60)
    code = "from django.conf import settings; print(settings.DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE)"
    started = hub_started_with(code, SECRET_KEY=key, ALLOWED_HOSTS="hub.example.com", **env)

    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == allowed


def test_the_settings_page_says_where_webhooks_may_go(client, settings, demo_team, alice):
    settings.DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE = False
    client.login(username="alice", password=PASSWORD)

    page = html.unescape(client.get("/team/settings/").content.decode())
    refused = client.post(
        "/team/settings/", {"action": "add_webhook", "url": "http://192.168.1.20/", "events": ""}
    )

    assert "Always refused: loopback, a cloud metadata service, link-local" in page
    assert "Private networks (10.0.0.0/8, " in page and "refused (DEPLOYHUB_WEBHOOK_ALLOW_" in page
    assert refused.status_code == 400 and not Webhook.objects.exists()
    said = html.unescape(refused.content.decode())
    assert "192.168.1.20 is in the private network 192.168.0.0/16" in said
