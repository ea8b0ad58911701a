#!/usr/bin/env python
"""make bench: DeployHub's speed targets, measured on this machine.

Each row prints the figure, its target and PASS or MISS; all rows also go to
bench/results.json. A miss is reported, never hidden; the exit code stays 0 so
every row is always printed (CI does not run this: the machine is shared and noisy).

Needs PostgreSQL and Redis on 127.0.0.1 (`make bench` checks they answer). It
uses its own database (deployhub_bench) and Redis database 14.
"""

import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"
BENCH_DB = "deployhub_bench"
JOBS, WARMUP_JOBS = 100, 10

os.environ.update(
    DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{BENCH_DB}",
    CELERY_BROKER_URL="redis://127.0.0.1:6379/14",
    DEPLOYHUB_VAR_DIR=tempfile.mkdtemp(prefix="deployhub-bench-"),
    DJANGO_SETTINGS_MODULE="deployhub.settings",
)
sys.path.insert(0, str(ROOT))


def percentile(values, q):
    ordered = sorted(values)
    index = (len(ordered) - 1) * q / 100
    low, high = int(index), min(int(index) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (index - low)


def row(name, figure, unit, target, lower_is_better=True):
    passed = figure <= target if lower_is_better else figure >= target
    sign = "≤" if lower_is_better else "≥"
    return {
        "name": name,
        "figure": round(figure, 3),
        "unit": unit,
        "target": f"{sign} {target} {unit}",
        "verdict": "PASS" if passed else "MISS",
    }


def recreate_database():
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {BENCH_DB}")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise SystemExit(f"bench: timed out waiting for {what}")


def healthy(url):
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=1):
            return True
    except OSError:
        return False


class Stack:
    """A hub (gunicorn) and one device worker, as separate processes."""

    def __init__(self, token, device):
        self.url = f"http://127.0.0.1:{free_port()}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.logs = tempfile.TemporaryFile()
        host = self.url.removeprefix("http://")
        self.processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "deployhub.wsgi",
                    "-b",
                    host,
                    "--workers",
                    "2",
                    "--threads",
                    "4",
                ],
                cwd=ROOT,
                env=env,
                stdout=self.logs,
                stderr=subprocess.STDOUT,
            ),
        ]
        wait_for(lambda: healthy(self.url), 60, "the hub")
        self.processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "workers",
                    "run",
                    "--hub",
                    self.url,
                    "--token",
                    token,
                    "--broker",
                    os.environ["CELERY_BROKER_URL"],
                ],
                cwd=ROOT,
                env=env,
                stdout=self.logs,
                stderr=subprocess.STDOUT,
            )
        )
        wait_for(lambda: type(device).objects.get(pk=device.pk).last_heartbeat_at, 60, "the worker")
        time.sleep(1)  # let the consumer attach to its queue

    def stop(self):
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(timeout=20)


def setup_fleet():
    from django.contrib.auth import get_user_model

    from deployhub.devices.models import Device, DeviceClass
    from deployhub.teams.models import Team

    team = Team.objects.create(name="Bench", slug="bench")
    user = get_user_model().objects.create_user("bench")
    device_class = DeviceClass.objects.create(team=team, slug="bench-cpu", name="Bench CPU")
    device = Device(device_class=device_class, name="bench-worker")
    token = device.issue_token()
    device.save()
    return team, user, device_class, device, token


def run_noop_job(team, user, device_class):
    """Submit one no-op job; return (commit→claim, commit→succeeded) in ms."""
    from django.db import transaction

    from deployhub.jobs.actions import submit_job
    from deployhub.jobs.models import Job

    committed = []
    with transaction.atomic():
        transaction.on_commit(lambda: committed.append(time.time()))  # runs before the send
        job = submit_job(team=team, kind="noop", device_class=device_class, user=user)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job = Job.objects.get(pk=job.pk)
        if job.is_final:
            break
        time.sleep(0.002)
    if job.state != "succeeded":
        raise SystemExit(f"bench: no-op job {job.pk} ended {job.state}: {job.error}\n{job.log}")
    return (
        (job.started_at.timestamp() - committed[0]) * 1000,
        (job.finished_at.timestamp() - committed[0]) * 1000,
    )


def bench_job_pipeline():
    """Rows: job commit → worker claim, and the whole life of a no-op job."""
    team, user, device_class, device, token = setup_fleet()
    stack = Stack(token, device)
    try:
        timings = [run_noop_job(team, user, device_class) for _ in range(JOBS + WARMUP_JOBS)]
    finally:
        stack.stop()
    claims = [claim for claim, _ in timings[WARMUP_JOBS:]]
    lives = [life for _, life in timings[WARMUP_JOBS:]]
    return [
        row(
            f"job commit → worker claim, p50 ({JOBS} jobs, Redis loopback)",
            statistics.median(claims),
            "ms",
            15,
        ),
        row("job commit → worker claim, p99", percentile(claims, 99), "ms", 50),
        row("no-op job life (commit → succeeded), p50", statistics.median(lives), "ms", 150),
        row("no-op job life (commit → succeeded), p99", percentile(lives, 99), "ms", 500),
    ]


BENCHES = [bench_job_pipeline]


def main():
    recreate_database()
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    rows = [r for bench in BENCHES for r in bench()]
    print_rows(rows)
    write_results(rows)


def print_rows(rows):
    width = max(len(r["name"]) for r in rows)
    print(f"{'row':<{width}}  {'figure':>10}  {'target':<12} verdict")
    for r in rows:
        figure = f"{r['figure']:>7.2f} {r['unit']:<2}"
        print(f"{r['name']:<{width}}  {figure}  {r['target']:<12} {r['verdict']}")
    misses = sum(r["verdict"] == "MISS" for r in rows)
    print(f"\nwritten to {RESULTS.relative_to(ROOT)}; {misses} miss(es)")


def write_results(rows):
    machine = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    RESULTS.write_text(json.dumps({"when": when, "machine": machine, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
