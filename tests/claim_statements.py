"""What the hand-written statements of a device call give, on the database Django points at.

tests/test_claim_statements.py checks it on PostgreSQL (in the test's database) and on
SQLite, as `make run` has it: `python -m tests.claim_statements` in a process whose
DATABASE_URL names a fresh SQLite file migrates it, observes, and prints JSON.
"""

import json
import sys
import uuid
from datetime import timedelta

from django.conf import settings
from django.db.models import Model
from django.utils import timezone

LEASE = timedelta(minutes=5)


def fields(instance):
    """A model instance's concrete fields, as JSON can carry them."""
    return {
        field.attname: _plain(getattr(instance, field.attname))
        for field in instance._meta.concrete_fields
    }


def _plain(value):
    if isinstance(value, Model):
        return value.pk
    return value.isoformat() if hasattr(value, "isoformat") else value


def observe():
    """Register a device, look it up by token and claim jobs with it; return what was seen."""
    from deployhub.devices.models import Device, DeviceClass
    from deployhub.jobs.models import Job, JobKind, JobState
    from deployhub.teams.models import Team, TokenFailures

    TokenFailures.objects.all().delete()  # a database of this test's own: no lockouts yet
    suffix = uuid.uuid4().hex[:8]
    team = Team.objects.create(name=f"Statements {suffix}", slug=f"statements-{suffix}")
    device_class = DeviceClass.objects.create(
        team=team, slug=f"statements-{suffix}", name="Statements", backends=["onnxruntime"]
    )
    device = Device(device_class=device_class, name="edge-1", fingerprint={"cpu": {"avx2": True}})
    token = device.issue_token()
    device.save()
    device.record_heartbeat()
    seen = {"ids": {"device": device.pk, "class": device_class.pk, "team": team.pk}}

    found = Device.objects.by_token(token, address="192.0.2.7")
    stored = Device.objects.select_related("device_class__team").get(pk=device.pk)
    seen["by_token"] = {
        "device": fields(found),
        "class": fields(found.device_class),
        "team": fields(found.device_class.team),
        "lockout": found.token_lockout,
    }
    seen["orm"] = {
        "device": fields(stored),
        "class": fields(stored.device_class),
        "team": fields(stored.device_class.team),
    }
    seen["unknown_token"] = Device.objects.by_token("dht_" + "x" * 40, address="192.0.2.7")
    locked_until = timezone.now() + timedelta(minutes=15)
    TokenFailures.objects.create(
        address="192.0.2.7",
        failures=10,
        window_started_at=timezone.now(),
        locked_until=locked_until,
    )
    lockout = Device.objects.by_token(token, address="192.0.2.7").token_lockout
    seen["lockout"] = {"type": type(lockout).__name__, "value": _plain(lockout)}
    seen["locked_until"] = locked_until.isoformat()
    seen["lockout_elsewhere"] = Device.objects.by_token(token, address="192.0.2.8").token_lockout

    def take(job, attempt=1):
        lease = timezone.now() + LEASE
        return Job.objects.take(job.pk, found, attempt, lease_expires_at=lease)

    job = Job.objects.create(team=team, kind=JobKind.NOOP, device_class=device_class, log="x")
    before = timezone.now()
    taken = take(job)
    after = timezone.now()
    seen["take"] = {
        "returned": fields(taken),
        "stored": fields(Job.objects.get(pk=job.pk)),
        "before": before.isoformat(),
        "after": after.isoformat(),
        "again": take(job) is not None,
        "stale_attempt": take(Job.objects.create(**_job(team, device_class)), attempt=2)
        is not None,
    }
    other_class = DeviceClass.objects.create(team=team, slug=f"other-{suffix}", name="Other")
    seen["take"]["other_class"] = take(Job.objects.create(**_job(team, other_class))) is not None
    # Lease lost, queued again as attempt 2: the claim keeps the first attempt's start.
    Job.objects.filter(pk=job.pk).update(state=JobState.QUEUED, attempt=2, device=None)
    seen["take"]["second_attempt"] = fields(take(job, attempt=2))
    limit = settings.DEPLOYHUB_MAX_LOG_CHARS
    full = Job.objects.create(**_job(team, device_class), log="y" * limit)
    log = take(full).log
    seen["take"]["full_log"] = {"length": len(log), "tail": log[-60:], "limit": limit}
    seen["take"]["no_such_job"] = take(Job(pk=2**63)) is not None  # SQLite's integers end
    seen["for_token"] = _take_for_token(token, device, other_class)
    return seen


def _take_for_token(token, device, other_class):
    """What the claim that authenticates its device too takes (PostgreSQL only)."""
    from deployhub.devices.models import Device, DeviceClass
    from deployhub.jobs.models import Job, JobState
    from deployhub.teams.models import Team

    def take(job, address="192.0.2.9", token=token, attempt=1):
        lease = timezone.now() + LEASE
        return Job.objects.take_for_token(job.pk, token, address, attempt, lease_expires_at=lease)

    team, device_class = device.device_class.team, device.device_class
    runs_before = prepared_runs()
    queued = Job.objects.create(**_job(team, device_class))
    running = Job.objects.create(**_job(team, device_class), state=JobState.RUNNING)
    other_team = Team.objects.create(name=f"Other {team.slug}", slug=f"other-{team.slug}")
    others = DeviceClass.objects.create(team=other_team, slug=f"x-{team.slug}", name="Theirs")
    seen = {
        "locked_out": take(queued, address="192.0.2.7"),
        "unknown_token": take(queued, token="dht_" + "y" * 40),
        "other_class": take(Job.objects.create(**_job(team, other_class))),
        "stale_attempt": take(queued, attempt=2),
        "not_queued": take(running),
        "other_team": take(Job.objects.create(**_job(other_team, others))),
        # A job whose team is not its class's: no row should be, and none is taken.
        "team_not_the_classes": take(Job.objects.create(**_job(other_team, device_class))),
        "no_such_job": take(Job(pk=2**63)),
    }
    Device.objects.filter(pk=device.pk).update(draining=True)
    seen["draining"] = take(queued)
    Device.objects.filter(pk=device.pk).update(draining=False)
    seen = {refusal: taken is not None for refusal, taken in seen.items()}
    taken = take(queued)
    if taken is not None:
        job, found = taken
        stored = Device.objects.select_related("device_class__team").get(pk=device.pk)
        taken = {
            "returned": fields(job),
            "stored": fields(Job.objects.get(pk=queued.pk)),
            "device": [fields(found), fields(found.device_class), fields(found.device_class.team)],
            "orm": [fields(stored), fields(stored.device_class), fields(stored.device_class.team)],
        }
    seen["taken"] = taken
    # Nine statements ran (the job of 2**63 is refused before any); prepared, on PostgreSQL.
    seen["prepared_runs"] = None if runs_before is None else prepared_runs() - runs_before
    return seen


def prepared_runs():
    """How many times this connection ran a claim as a prepared statement (PostgreSQL's
    pg_prepared_statements); None on another database."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(SUM(generic_plans + custom_plans), 0) FROM pg_prepared_statements "
            "WHERE statement LIKE 'UPDATE \"jobs_job\" SET %%'"
        )
        return int(cursor.fetchone()[0])


def _job(team, device_class):
    from deployhub.jobs.models import JobKind

    return {"team": team, "kind": JobKind.NOOP, "device_class": device_class}


if __name__ == "__main__":
    import django
    from django.core.management import call_command

    django.setup()
    from django.db import connection

    call_command("migrate", verbosity=0)
    seen = {"returning": observe()}
    # SQLite before 3.35 has no RETURNING: the claim reads the row it took instead.
    connection.features.can_return_columns_from_insert = False
    seen["no_returning"] = observe()
    json.dump(seen, sys.stdout, default=_plain)
