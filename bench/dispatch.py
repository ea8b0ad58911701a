"""Bench rows of job dispatch, the platform's own speed: the hub against bare Celery.

The bench sends both, message after message in turn, over the same loopback Redis:
a no-op hub job (commit → the device worker's claim) and a bare Celery task with the
settings every DeployHub process shares (send → task start, bench/bare_celery.py, in a
prefork pool). Each side pushes its timestamps to a Redis list when it is done, and the
bench waits on it (BLPOP): nothing polls the database while a message is on its way.
The hub's time is split where it goes, from the timestamps the worker (bench/timed_worker.py)
and the job row (sent_at, started_at) have. started_at is the database's clock as it
takes the row (PostgreSQL's CLOCK_TIMESTAMP() in the statement that authenticates the device
and takes the job): the claim counts its statement's run and lookups, and its parsing and
planning where it is not yet prepared on the connection (DATABASE_PREPARED_STATEMENTS).
"""

import json
import os
import statistics
import subprocess
import sys
import time

from bench.bare_celery import QUEUE, STARTS
from bench.rows import note, row
from bench.stack import ROOT, RUN_PYTHON, Stack, percentile, setup_fleet_for
from bench.timed_worker import TIMINGS

MESSAGES, WARMUP = 200, 20
# Targets: the hub's dispatch within these multiples of bare Celery's.
P50_RATIO, P99_RATIO = 2, 3
BARE_WORKER = (
    "-m",
    "celery",
    "-A",
    "bench.bare_celery",
    "worker",
    "-Q",
    QUEUE,
    "-P",
    "prefork",
    "-c",
    "1",
    "-l",
    "WARNING",
    "--without-gossip",
    "--without-mingle",
    "--without-heartbeat",
)


def redis_client():
    import redis

    return redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])


def hub_job(redis, team, user, device_class):
    """Submit one no-op job and wait for it; return its timestamps (wall clock, s)."""
    from django.db import transaction

    from deployhub.jobs.actions import submit_job
    from deployhub.jobs.models import Job, JobKind

    committed = []
    with transaction.atomic():
        transaction.on_commit(lambda: committed.append(time.time()))  # runs before the send
        job = submit_job(team=team, kind=JobKind.NOOP, device_class=device_class, user=user)
    popped = redis.blpop([TIMINGS], timeout=30)
    job = Job.objects.get(pk=job.pk)
    if popped is None or job.state != "succeeded":
        raise SystemExit(f"bench: no-op job {job.pk} ended {job.state}: {job.error}\n{job.log}")
    stamps = json.loads(popped[1])
    if stamps["job"] != job.pk:
        raise SystemExit(f"bench: waited for job {job.pk}, the worker ran {stamps['job']}")
    return {
        "committed": committed[0],
        "sent": job.sent_at.timestamp(),
        "task_started": stamps["task_started"],
        "claim_sent": stamps["claim_sent"],
        "claimed": job.started_at.timestamp(),
        "claim_answered": stamps["claim_answered"],
        "succeeded": job.finished_at.timestamp(),
    }


def bare_task(redis, app):
    """Send one bare task and wait for it; return send → task start in ms."""
    sent = time.time()
    app.send_task("bench.bare", args=[sent], queue=QUEUE)
    popped = redis.blpop([STARTS], timeout=30)
    if popped is None:
        raise SystemExit("bench: the bare Celery task did not start within 30 s")
    sent_at, started = map(float, popped[1].split())
    return (started - sent_at) * 1000


def between(timings, start, end):
    """Return the ms from one timestamp to another of each hub job."""
    return [(t[end] - t[start]) * 1000 for t in timings]


def dispatch_rows(bare, timings):
    """Rows: bare Celery, the hub's dispatch against it, where its time goes, the job's life."""
    claims = between(timings, "committed", "claimed")
    held = between(timings, "committed", "claim_answered")
    lives = between(timings, "committed", "succeeded")
    bare50, bare99 = statistics.median(bare), percentile(bare, 99)
    hub50, hub99 = statistics.median(claims), percentile(claims, 99)
    what = f"{MESSAGES} messages each, in turn, Redis loopback"
    return [
        note(f"bare Celery task, send → task start, p50 ({what}; prefork)", bare50, "ms", "INFO"),
        note("bare Celery task, send → task start, p99", bare99, "ms", "INFO"),
        row("job commit → worker claim (the claim takes the row), p50", hub50, "ms", 15),
        row("job commit → worker claim, p99", hub99, "ms", 50),
        row("job commit → worker claim vs bare Celery, p50", hub50 / bare50, "×", P50_RATIO),
        row("job commit → worker claim vs bare Celery, p99", hub99 / bare99, "×", P99_RATIO),
        *where_rows(timings),
        note(
            "job commit → the worker holds the claimed job, p50",
            statistics.median(held),
            "ms",
            "INFO",
        ),
        note(
            "job commit → the worker holds the claimed job, p99", percentile(held, 99), "ms", "INFO"
        ),
        row("no-op job life (commit → succeeded), p50", statistics.median(lives), "ms", 150),
        row("no-op job life (commit → succeeded), p99", percentile(lives, 99), "ms", 500),
    ]


STAGES = [
    ("committed", "sent", "on-commit publish (send_task)"),
    ("sent", "task_started", "broker and the worker's pick-up"),
    ("task_started", "claim_sent", "the worker's task until it sends the claim"),
    ("claim_sent", "claimed", "claim request until its statement takes the row"),
    ("claimed", "claim_answered", "the statement's answer, the audit event, commit, answer"),
]


def where_rows(timings):
    """Note rows: the median and p99 of each stage of the hub's dispatch."""
    rows = []
    for start, end, what in STAGES:
        values = between(timings, start, end)
        p50, p99 = statistics.median(values), percentile(values, 99)
        rows.append(note(f"  where: {what}, p50 (p99 {p99:.2f} ms)", p50, "ms", "INFO"))
    return rows


def bench_job_pipeline():
    """Rows: job commit → worker claim beside a bare Celery task, and a no-op job's life."""
    from bench.bare_celery import app
    from deployhub.teams.models import Team

    team, user, device_class, device, token = setup_fleet_for(
        Team.objects.create(name="Bench", slug="bench")
    )
    redis = redis_client()
    redis.delete(TIMINGS, STARTS)
    stack = Stack(
        token, device, worker=("-m", "bench.timed_worker", os.environ["CELERY_BROKER_URL"])
    )
    bare_worker = subprocess.Popen(
        [RUN_PYTHON, *BARE_WORKER],
        env=stack.env,
        cwd=ROOT,
        stdout=stack.logs,
        stderr=subprocess.STDOUT,
    )
    try:
        bare_task(redis, app)  # waits until the bare worker is up
        bare, timings = [], []
        for _ in range(MESSAGES + WARMUP):
            timings.append(hub_job(redis, team, user, device_class))
            bare.append(bare_task(redis, app))
    except SystemExit:
        print(stack.output()[-4000:], file=sys.stderr)
        raise
    finally:
        bare_worker.terminate()
        stack.stop()
        bare_worker.wait(timeout=20)
    return dispatch_rows(bare[WARMUP:], timings[WARMUP:])
