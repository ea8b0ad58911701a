"""What a job's dispatch costs the hub: the message goes out first, a claim takes few queries,
and database connections outlive a request (make bench times it: bench/dispatch.py)."""

import os
import subprocess
import sys
from unittest import mock

from django.db import connection
from django.test.utils import CaptureQueriesContext

from deployhub.jobs.actions import submit_job
from deployhub.jobs.models import JobKind, JobState
from deployhub.teams.models import Event, Webhook, WebhookDelivery
from tests.api_calls import call
from tests.conftest import ROOT

# The claim's queries: the job taken in one statement that authenticates the device too (with
# its address's lockout), the audit event, and that event's webhooks (after commit).
CLAIM_QUERIES = 3


def test_it_sends_a_jobs_message_before_other_work_on_commit(
    demo_team, alice, device_class, django_capture_on_commit_callbacks
):
    Webhook.objects.create(team=demo_team, url="https://ci.example.com/hook")
    queries_before_send = []
    with CaptureQueriesContext(connection) as queries:
        send = mock.patch(
            "deployhub.celery.app.send_task",
            side_effect=lambda *a, **k: queries_before_send.append(len(queries)),
        )
        with send, django_capture_on_commit_callbacks(execute=True) as callbacks:
            submit_job(team=demo_team, kind=JobKind.NOOP, device_class=device_class, user=alice)
            committed = len(queries)
    # The job's message first (then the webhook's delivery): no query between commit and send.
    assert callbacks and queries_before_send[0] == committed
    assert WebhookDelivery.objects.filter(event__verb="job.queued").count() == 1


def test_it_claims_a_job_in_a_few_queries(
    client, demo_team, alice, device_class, make_device, django_capture_on_commit_callbacks
):
    device, token = make_device()
    job = submit_job(team=demo_team, kind=JobKind.NOOP, device_class=device_class, user=alice)
    client.get("/healthz")  # the URLconf loaded first: the claim comes well within a second
    device.record_heartbeat()  # a device that beat a moment ago: the claim changes no heartbeat
    with CaptureQueriesContext(connection) as queries:
        with django_capture_on_commit_callbacks(execute=True):
            response = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    assert response.status_code == 200
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.device == device
    sql = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(sql) == CLAIM_QUERIES, "\n".join(sql)
    # The job is taken by an UPDATE of its row alone, which finds the device by its unique
    # token hash, with no locked read before it: a class's claims never queue behind each other.
    assert sql[0].startswith('UPDATE "jobs_job"') and "RETURNING" in sql[0]
    assert "token_hash" in sql[0] and "ORDER BY" not in sql[0]
    assert not any("FOR UPDATE" in statement for statement in sql)


def test_a_claim_the_long_way_reads_the_device_then_takes_the_job(
    client, demo_team, alice, device_class, make_device, django_capture_on_commit_callbacks
):
    """Any database but PostgreSQL (and a claim sure to be refused) goes this way."""
    from deployhub.jobs.models import JobManager

    device, token = make_device()
    job = submit_job(team=demo_team, kind=JobKind.NOOP, device_class=device_class, user=alice)
    device.record_heartbeat()
    with mock.patch.object(JobManager, "take_for_token", return_value=None):
        with CaptureQueriesContext(connection) as queries:
            with django_capture_on_commit_callbacks(execute=True):
                response = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    assert response.status_code == 200 and response.json()["attempt"] == 1
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.device == device
    sql = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(sql) == CLAIM_QUERIES + 1, "\n".join(sql)  # the device's lookup, first
    assert "token_hash" in sql[0] and sql[1].startswith('UPDATE "jobs_job"')
    assert job.team.events.filter(verb="job.claimed", actor=f"device:{device}").count() == 1


def test_it_keeps_database_connections_between_requests(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "DJANGO_"))}
    env.update(DEPLOYHUB_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="deployhub.settings")
    code = (
        "import django; django.setup()\n"
        "from django.core.signals import request_finished, request_started\n"
        "from django.db import connection\n"
        "connection.ensure_connection(); first = connection.connection\n"
        "request_finished.send(sender=None); request_started.send(sender=None)\n"
        "connection.ensure_connection(); print(connection.connection is first)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.stdout.strip() == "True", done.stderr


def test_an_ask_for_work_takes_records_and_tells_webhooks_in_one_statement(
    client, demo_team, alice, device_class, make_device, django_capture_on_commit_callbacks
):
    """HTTPS mode on PostgreSQL: the oldest queued job is taken, its claim's event written and
    the team's webhooks looked up by one statement; the event is in the trail as any other."""
    Webhook.objects.create(team=demo_team, url="https://ci.example.com/hook", events=["job.c"])
    device, token = make_device()
    call(client, token, "device/work", {"wait": 0})  # now an HTTPS device
    job = submit_job(team=demo_team, kind=JobKind.NOOP, device_class=device_class, user=alice)
    with CaptureQueriesContext(connection) as queries:
        with django_capture_on_commit_callbacks(execute=True):
            answer = call(client, token, "device/work", {"wait": 0}).json()
    assert answer["job"]["id"] == job.pk
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.device == device
    assert job.log.endswith(f"attempt 1 claimed by device {device.name}\n")
    [take] = [q["sql"] for q in queries.captured_queries if "jobs_job" in q["sql"]]
    assert "SKIP LOCKED" in take and "teams_event" in take
    [event] = Event.objects.filter(verb="job.claimed", target_id=job.pk)
    assert event.actor == f"device:{device.name}" and event.team == demo_team
    assert event.data == {"attempt": 1, "before": "queued", "after": "running"}
    [delivery] = WebhookDelivery.objects.filter(event__verb="job.claimed")
    assert delivery.event == event
