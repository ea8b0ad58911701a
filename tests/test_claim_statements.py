"""The hand-written statements of every device call (a device by its token, a claim's take)
give what the ORM gives, on PostgreSQL and on SQLite (make run's database)."""

import json
from datetime import datetime, timedelta

import pytest

from tests.claim_statements import LEASE, observe
from tests.conftest import hub_started_with, run_on_sqlite


def check(seen, vendor):
    ids = seen["ids"]
    # The device, its class and its team: every field as the ORM reads it (JSON, datetimes,
    # booleans), and the caller's address is not locked out.
    found = seen["by_token"]
    assert found.pop("lockout") is None
    assert found == seen["orm"]
    assert found["device"]["fingerprint"] == {"cpu": {"avx2": True}}
    assert found["class"]["backends"] == ["onnxruntime"] and found["team"]["id"] == ids["team"]
    assert seen["unknown_token"] is None
    # A locked-out address: the end of its lockout, a datetime, for that address only.
    assert seen["lockout"] == {"type": "datetime", "value": seen["locked_until"]}
    assert seen["lockout_elsewhere"] is None

    take = seen["take"]
    returned, stored = take["returned"], take["stored"]
    assert returned == stored  # what the claim answers is what the row holds
    assert stored["state"] == "running" and stored["device_id"] == ids["device"]
    assert stored["message"] == "claimed by edge-1"
    assert returned["progress"] == 0 and isinstance(returned["progress"], float)
    assert stored["log"].startswith("x") and stored["log"].endswith(
        " hub: attempt 1 claimed by device edge-1\n"
    )
    started, lease = (
        datetime.fromisoformat(stored[name]) for name in ("started_at", "lease_expires_at")
    )
    before, after = (datetime.fromisoformat(take[name]) for name in ("before", "after"))
    # The database's time of the statement, on this machine's clock (SQLite: to the ms).
    assert before - timedelta(milliseconds=1) <= started <= after
    assert before + LEASE <= lease <= after + LEASE
    # Nothing taken twice, for a stale attempt or by another class's device.
    assert take["again"] is False and take["stale_attempt"] is False
    assert take["other_class"] is False and take["no_such_job"] is False
    second = take["second_attempt"]
    assert second["attempt"] == 2 and second["state"] == "running"
    assert second["started_at"] == stored["started_at"]  # the first attempt's start stays
    assert second["log"].endswith("attempt 2 claimed by device edge-1\n")
    full = take["full_log"]  # a full log keeps its newest characters
    assert full["length"] == full["limit"]
    assert full["tail"].endswith("attempt 1 claimed by device edge-1\n")

    # Authenticated and taken in one statement: on PostgreSQL, and only when sure to be granted.
    for_token = seen["for_token"]
    taken = for_token.pop("taken")
    prepared = for_token.pop("prepared_runs")
    assert [refusal for refusal, granted in for_token.items() if granted] == []
    if vendor != "postgresql":
        assert taken is None  # the caller authenticates, then takes
        assert prepared is None
        return
    # Planned once on this connection, then run prepared: a refusal's run counts too.
    assert prepared == 9
    assert taken["returned"] == taken["stored"] and taken["device"] == taken["orm"]
    stored = taken["stored"]
    assert stored["state"] == "running" and stored["device_id"] == ids["device"]
    assert stored["message"] == "claimed by edge-1" and stored["started_at"]
    assert stored["log"].endswith(" hub: attempt 1 claimed by device edge-1\n")


@pytest.mark.django_db
def test_they_give_what_the_orm_gives_on_postgresql():
    check(json.loads(json.dumps(observe(), default=str)), "postgresql")


def test_they_give_what_the_orm_gives_on_sqlite(tmp_path):
    seen = run_on_sqlite("tests.claim_statements", tmp_path)
    check(seen["returning"], "sqlite")
    check(seen["no_returning"], "sqlite")


def post_claim(client, job, authorization):
    """A device's claim of the job's first attempt, with this Authorization header."""
    return client.post(
        f"/api/v1/jobs/{job.pk}/claim",
        json.dumps({"attempt": 1}),
        content_type="application/json",
        HTTP_AUTHORIZATION=authorization,
    )


@pytest.mark.django_db
def test_a_claim_without_the_bearer_scheme_takes_nothing(client, demo_team, alice, make_device):
    from deployhub.jobs.actions import submit_job
    from deployhub.jobs.models import JobKind

    device, token = make_device()
    job = submit_job(
        team=demo_team, kind=JobKind.NOOP, device_class=device.device_class, user=alice
    )
    # The token alone: docs/protocol.md says "Bearer <token>".
    response = post_claim(client, job, token)
    assert response.status_code == 401 and "Bearer" in response.json()["error"]
    job.refresh_from_db()
    assert job.state == "queued" and job.device is None


@pytest.mark.django_db
def test_a_claim_with_a_made_up_token_is_refused_before_its_body_is_read(client, job):
    body = json.dumps({"attempt": 1, "padding": "x" * 6_000_000})  # over the 5 MB read limit
    response = client.post(
        f"/api/v1/jobs/{job.pk}/claim",
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION="Bearer dht_" + "z" * 43,
    )
    assert response.status_code == 401  # not 400 or 413: the token is checked first


def hub_settings(**env):
    """Whether deployhub/settings.py prepares statements in this environment, and the
    database OPTIONS it gives psycopg."""
    code = (
        "from django.conf import settings as s; print(json.dumps({'prepared': "
        "s.DEPLOYHUB_PREPARED_STATEMENTS, 'options': s.DATABASES['default']['OPTIONS']}))"
    )
    result = hub_started_with(code, **env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_an_operator_can_turn_prepared_statements_off():
    postgres = "postgres://deployhub@db.example:5432/deployhub"
    assert hub_settings(DATABASE_URL=postgres)["prepared"] is True
    # Behind a PgBouncer older than 1.22 in transaction pooling mode (README).
    assert hub_settings(DATABASE_URL=postgres, DATABASE_PREPARED_STATEMENTS="false") == {
        "prepared": False,
        "options": {},  # and psycopg is never asked to prepare: no prepare_threshold
    }


@pytest.mark.django_db
def test_django_s_own_queries_are_neither_prepared_nor_counted(demo_team, make_device):
    from django.db import connection

    from deployhub.jobs.models import Job, JobKind

    device, token = make_device()
    job = Job.objects.create(team=demo_team, kind=JobKind.NOOP, device_class=device.device_class)
    lease = datetime.now().astimezone() + LEASE
    assert Job.objects.take_for_token(job.pk, token, "192.0.2.11", 1, lease_expires_at=lease)
    for _ in range(8):  # more than psycopg's threshold of 5, had the connection one
        Job.objects.filter(pk=job.pk).update(log="x" * 1000)
        list(Job.objects.filter(pk=job.pk))
    psycopg = connection.connection
    # psycopg keeps a count of each query's text where prepare_threshold is set: with
    # Django's values in the text, that was a job's whole log in each of 100 keys.
    assert psycopg.prepare_threshold is None
    assert psycopg._prepared._counts == {} and len(psycopg._prepared._names) == 1  # the claim


@pytest.mark.django_db
def test_with_prepared_statements_off_a_claim_is_granted_and_nothing_is_prepared(
    demo_team, make_device
):
    from django.test import override_settings

    from deployhub.jobs.models import Job, JobKind
    from tests.claim_statements import prepared_runs

    device, token = make_device()
    job = Job.objects.create(team=demo_team, kind=JobKind.NOOP, device_class=device.device_class)
    runs = prepared_runs()
    with override_settings(DEPLOYHUB_PREPARED_STATEMENTS=False):
        lease = datetime.now().astimezone() + LEASE
        taken = Job.objects.take_for_token(job.pk, token, "192.0.2.10", 1, lease_expires_at=lease)
    assert prepared_runs() == runs
    claimed, by = taken
    assert claimed.state == "running" and by.pk == device.pk


@pytest.mark.django_db
def test_a_prepared_statements_database_error_is_djangos_so_an_outage_is_a_503():
    from django.db import ProgrammingError, connection

    from deployhub.core.handwritten import prepared_cursor

    with pytest.raises(ProgrammingError, match="no_such_table"):
        with prepared_cursor(connection) as cursor:
            cursor.execute("SELECT * FROM no_such_table WHERE id = %(id)s", {"id": 1})
    assert connection.connection.prepare_threshold is None  # Django's queries: still never


@pytest.mark.django_db(transaction=True)  # each claim's own transaction, as in the hub
def test_a_claim_prepared_before_a_column_changed_type_is_still_granted(
    client, demo_team, alice, make_device
):
    from django.db import connection

    from deployhub.jobs.actions import submit_job
    from deployhub.jobs.models import JobKind
    from tests.claim_statements import prepared_runs

    device, token = make_device()

    def claim():
        job = submit_job(
            team=demo_team, kind=JobKind.NOOP, device_class=device.device_class, user=alice
        )
        response = post_claim(client, job, f"Bearer {token}")
        job.refresh_from_db()
        return response.status_code, job.state

    def message_type(length):
        with connection.cursor() as cursor:  # as a migration would, while the hub runs
            cursor.execute(f"ALTER TABLE jobs_job ALTER COLUMN message TYPE varchar({length})")

    runs = prepared_runs()
    assert claim() == (200, "running") and prepared_runs() == runs + 1
    message_type(250)
    try:
        # PostgreSQL refuses the prepared plan ("cached plan must not change result type"):
        # the claim goes the long way, and its rollback ends the connection's prepared
        # statements, so the next claim is prepared again.
        assert claim() == (200, "running") and prepared_runs() == 0
        assert claim() == (200, "running") and prepared_runs() == 1
    finally:
        message_type(200)


@pytest.mark.django_db(transaction=True)  # the take runs in autocommit, as in the hub
def test_an_ask_for_work_prepared_before_a_column_changed_type_still_takes_its_job(
    client, demo_team, alice, make_device
):
    from django.db import connection

    from deployhub.jobs.actions import submit_job
    from deployhub.jobs.models import JobKind
    from tests.api_calls import call

    device, token = make_device()

    def ask():
        job = submit_job(
            team=demo_team, kind=JobKind.NOOP, device_class=device.device_class, user=alice
        )
        answer = call(client, token, "device/work", {"wait": 0})
        job.refresh_from_db()
        return answer.status_code, answer.json()["job"]["id"] == job.pk, job.state

    def message_type(length):
        with connection.cursor() as cursor:  # as a migration would, while the hub runs
            cursor.execute(f"ALTER TABLE jobs_job ALTER COLUMN message TYPE varchar({length})")

    assert ask() == (200, True, "running")
    message_type(250)
    try:
        assert ask() == (200, True, "running")  # refused once, prepared again, taken
        assert ask() == (200, True, "running")
    finally:
        message_type(200)
