"""The hand-written statements of every device call (a device by its token, a claim's take)
give what the ORM gives, on PostgreSQL and on SQLite (make run's database)."""

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta

import pytest

from tests.claim_statements import LEASE, observe
from tests.conftest import ROOT


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
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'deployhub.sqlite3'}",
        "DEPLOYHUB_VAR_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "deployhub.settings",
    }
    result = subprocess.run(
        [sys.executable, "-m", "tests.claim_statements"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout)
    check(seen["returning"], "sqlite")
    check(seen["no_returning"], "sqlite")


@pytest.mark.django_db
def test_a_claim_without_the_bearer_scheme_takes_nothing(client, demo_team, alice, make_device):
    from deployhub.jobs.actions import submit_job
    from deployhub.jobs.models import JobKind

    device, token = make_device()
    job = submit_job(
        team=demo_team, kind=JobKind.NOOP, device_class=device.device_class, user=alice
    )
    response = client.post(
        f"/api/v1/jobs/{job.pk}/claim",
        json.dumps({"attempt": 1}),
        content_type="application/json",
        HTTP_AUTHORIZATION=token,  # the token alone: docs/protocol.md says "Bearer <token>"
    )
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


def database_options(**env):
    """The database OPTIONS deployhub/settings.py gives for this environment."""
    code = "from django.conf import settings; print(json.dumps(settings.DATABASES['default']))"
    result = subprocess.run(
        [sys.executable, "-c", f"import json, django; django.setup(); {code}"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "deployhub.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout).get("OPTIONS", {})


def test_only_postgresql_prepares_and_an_operator_can_turn_it_off(tmp_path):
    postgres = "postgres://deployhub@db.example:5432/deployhub"
    assert database_options(DATABASE_URL=postgres)["prepare_threshold"] > 0
    # Behind a PgBouncer older than 1.21 in transaction pooling mode (README).
    off = database_options(DATABASE_URL=postgres, DATABASE_PREPARED_STATEMENTS="false")
    assert "prepare_threshold" not in off
    sqlite = database_options(
        DATABASE_URL=f"sqlite:///{tmp_path / 'hub.sqlite3'}", DEPLOYHUB_VAR_DIR=str(tmp_path)
    )
    assert "prepare_threshold" not in sqlite


@pytest.mark.django_db
def test_with_prepared_statements_off_a_claim_is_granted_and_nothing_is_prepared(
    demo_team, make_device
):
    from django.db import connection

    from deployhub.jobs.models import Job, JobKind
    from tests.claim_statements import prepared_runs

    device, token = make_device()
    job = Job.objects.create(team=demo_team, kind=JobKind.NOOP, device_class=device.device_class)
    options = connection.settings_dict["OPTIONS"]
    threshold = options.pop("prepare_threshold")  # as DATABASE_PREPARED_STATEMENTS=false sets
    try:
        runs = prepared_runs()
        lease = datetime.now().astimezone() + LEASE
        taken = Job.objects.take_for_token(job.pk, token, "192.0.2.10", 1, lease_expires_at=lease)
        assert prepared_runs() == runs
    finally:
        options["prepare_threshold"] = threshold
    claimed, by = taken
    assert claimed.state == "running" and by.pk == device.pk


@pytest.mark.django_db
def test_a_prepared_statements_database_error_is_djangos_so_an_outage_is_a_503():
    from django.db import ProgrammingError, connection

    from deployhub.handwritten import prepared_cursor

    with pytest.raises(ProgrammingError, match="no_such_table"):
        with prepared_cursor(connection) as cursor:
            cursor.execute("SELECT * FROM no_such_table WHERE id = %(id)s", {"id": 1})
