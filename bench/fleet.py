"""Bench rows of a fleet in HTTPS mode: a thousand devices asking the hub for work.

Every device here asks `POST device/work {"wait": 50}` again and again, as
workers/https_mode.py's Asker does, from one asyncio process (bench/asking.py) on
loopback. The hub is the device API alone (docker-compose.yml's devices service:
gunicorn with HubWorker) with enough threads to hold a thousand asks at once:
FLEET_GUNICORN. Four rows:

- bench_fleet_idle: what a thousand idle devices cost the hub: the CPU of its gunicorn
  processes over 60 s (per device, and as a share of one core), the database's
  transactions per second (pg_stat_database's xact_commit: pg_stat_statements is not
  loaded on this PostgreSQL, and each of the hub's device queries runs in a transaction
  of its own, so it counts them), and any failed ask.
- bench_fleet_dispatch: with those thousand asks held, jobs committed one at a time to a
  class of a few asking devices: commit → the device holding the claimed job, beside a
  bare Celery task's send → start (bench/bare_celery.py), in turn, in the same run.
- bench_fleet_backlog: take_next_job on an empty queue against 10,000 queued jobs over 50
  classes, two databases timed side by side; and the plan of its statement.
- bench_fleet_reconnect: the device API killed under 300 asking devices and started 5 s
  later: when each device's next ask succeeds, from when the hub answers again.

The machine has 2 cores shared with others: each row names the load average around it.
"""

import json
import os
import queue
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from bench.rows import note, row
from bench.stack import (
    DEVICE_ENV,
    ROOT,
    RUN_PYTHON,
    free_port,
    healthy,
    percentile,
    wait_for,
)
from deployhub.gunicorn_worker import WORKER_CLASS
from workers.https_mode import POLL_WAIT_S

IDLE_DEVICES, IDLE_CLASSES = 1000, 4
BUSY_DEVICES = 4  # the class that receives jobs in bench_fleet_dispatch
RECONNECT_DEVICES = 300
WAIT_S = POLL_WAIT_S  # what a worker asks for
# First asks spread over one wait, so the asks come at a steady rate (devices / WAIT_S) from
# the start; the window opens once they are all held.
RAMP_S, WARMUP_S, SECONDS = WAIT_S, WAIT_S + 5, 60
# Two processes (one per core) of 1,024 threads: each holds up to 1,020 asks
# (waiting.max_waiters: threads less 4 kept for other calls), so either may hold the whole
# fleet. gunicorn does not share connections out evenly between its processes: with 520
# threads each (516 asks), one process got more than its share and answered the rest "come
# back later" (retry_after 1–5 s), 538 to 1,811 such answers a minute, which the CPU counted.
# --preload: the port opens once Django is loaded, so devices coming back after a restart
# are refused (and back off with jitter) instead of queueing in the listen backlog, all
# answered at once when the workers are ready. Each process shares a pool of 16 database
# connections (DATABASE_POOL_MAX_SIZE) among its threads, as docker-compose.yml's devices.
FLEET_GUNICORN = (
    "--workers",
    "2",
    "--threads",
    "1024",
    "--worker-connections",
    "2000",
    "--keep-alive",
    "75",
    "--preload",
)
FLEET_ENV = {**DEVICE_ENV, "DATABASE_POOL_MAX_SIZE": "16"}
IDLE_CPU_TARGET = 10  # % of one core for a thousand idle devices
DISPATCH_JOBS, DISPATCH_WARMUP = 200, 20
DISPATCH_P50_RATIO, DISPATCH_P99_MS = 2, 100
BACKLOG_JOBS, BACKLOG_CLASSES, TAKES = 10_000, 50, 200
BACKLOG_RATIO = 1.2
DOWN_S, RECOVER_S = 5, 45
# A herd puts every device's return in one second; full jitter, for an outage of about this
# length, puts some 18 % in its busiest second (simulated_returns): 25 % leaves room for
# 300 devices' chance, and catches a hub or policy that bunches them.
PEAK_SECOND_SHARE = 25


class DeviceApi:
    """The device API (gunicorn, HubWorker) on the bench database, killed and started at will."""

    def __init__(self, options=FLEET_GUNICORN):
        self.url = f"http://127.0.0.1:{free_port()}"
        self.options = options
        self.logs = tempfile.TemporaryFile()
        self.process = None
        self.start()

    def start(self):
        command = ("-m", "gunicorn", "deployhub.wsgi", "-b", self.url.removeprefix("http://"))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "MALLOC_ARENA_MAX": "2", **FLEET_ENV}
        self.process = subprocess.Popen(
            [sys.executable, *command, "-k", WORKER_CLASS, *self.options],
            cwd=ROOT,
            env=env,
            stdout=self.logs,
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: healthy(self.url), 60, "the device API")

    def processes(self):
        """The arbiter and its workers, as psutil processes."""
        import psutil

        arbiter = psutil.Process(self.process.pid)
        return [arbiter, *arbiter.children()]

    def cpu_s(self):
        """CPU seconds (user and system) the arbiter and its workers have used so far."""
        return sum(p.cpu_times().user + p.cpu_times().system for p in self.processes())

    def kill(self):
        """Kill every process at once, as a crash would: held asks are cut, nothing drains.
        (A graceful stop would wait up to DEPLOYHUB_POLL_SECONDS for the held asks.)"""
        for process in reversed(self.processes()):
            process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=20)

    def stop(self):
        if self.process.poll() is None:
            self.kill()

    def output(self):
        self.logs.seek(0)
        return self.logs.read().decode(errors="replace")


class Asking:
    """bench/asking.py in a process of its own: the devices, asking the hub for work."""

    def __init__(self, url, tokens, ramp_s=RAMP_S):
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.asking"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        orders = {"url": url, "tokens": tokens, "wait": WAIT_S, "ramp_s": ramp_s}
        self.process.stdin.write(json.dumps(orders) + "\n")
        self.process.stdin.flush()

    def _read(self):
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def cpu_s(self):
        import psutil

        times = psutil.Process(self.process.pid).cpu_times()
        return times.user + times.system

    def next_job(self, timeout=30):
        """Return (job id, when a device received it) for the next job a device got."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise SystemExit(f"bench: no device received a job within {timeout} s") from None
        _, job_id, received = line.split()
        return int(job_id), float(received)

    def finish(self):
        """Stop the devices; return their summary (bench/asking.py)."""
        self.process.stdin.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line.startswith("summary "):
                self.process.wait(timeout=20)
                return json.loads(line.removeprefix("summary "))
        self.log.seek(0)
        raise SystemExit(f"bench: the asking devices sent no summary\n{self.log.read()[-3000:]}")

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=20)


def fleet_team():
    """The bench's fleet team and its user (made once per run)."""
    from django.contrib.auth import get_user_model

    from deployhub.teams.models import Team

    team, created = Team.objects.get_or_create(slug="fleet-bench", defaults={"name": "Fleet bench"})
    user, _ = get_user_model().objects.get_or_create(username="bench-fleet")
    return team, user


def add_https_devices(device_class, count, prefix):
    """Register count devices that take work over HTTPS in one statement; return
    [(device id, token)]."""
    from deployhub.devices.models import Delivery, Device

    devices, tokens = [], []
    for number in range(1, count + 1):
        device = Device(
            device_class=device_class, name=f"{prefix}-{number}", delivery=Delivery.HTTPS
        )
        tokens.append(device.issue_token())
        devices.append(device)
    Device.objects.bulk_create(devices, batch_size=500)
    return [(device.pk, token) for device, token in zip(devices, tokens, strict=True)]


_IDLE = []


def idle_fleet():
    """The thousand idle devices, [(id, token)], over IDLE_CLASSES classes (made once per run)."""
    from deployhub.devices.models import DeviceClass

    if not _IDLE:
        team, _ = fleet_team()
        per_class = IDLE_DEVICES // IDLE_CLASSES
        for number in range(1, IDLE_CLASSES + 1):
            device_class = DeviceClass.objects.create(
                team=team, slug=f"fleet-idle-{number}", name=f"Idle fleet {number}"
            )
            _IDLE.extend(add_https_devices(device_class, per_class, f"idle-{number}"))
    return list(_IDLE)


def database_transactions():
    """Transactions committed in the bench database so far (pg_stat_database.xact_commit)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return cursor.fetchone()[0]


def load_average():
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def failed_asks(summary):
    """The failed asks of a run: every answer but a 200."""
    return sum(
        count for status, count in summary["statuses"].items() if not status.startswith("200")
    )


def statuses_text(summary):
    return ", ".join(f"{status}×{count}" for status, count in sorted(summary["statuses"].items()))


def bench_fleet_idle():
    """Rows: the hub's CPU and the database's transactions for a thousand idle asking devices."""
    from django.db import connections

    tokens = [token for _, token in idle_fleet()]
    connections.close_all()
    api = DeviceApi()
    asking = Asking(api.url, tokens)
    try:
        time.sleep(WARMUP_S)
        before = (time.time(), api.cpu_s(), database_transactions(), asking.cpu_s())
        time.sleep(SECONDS)
        after = (time.time(), api.cpu_s(), database_transactions(), asking.cpu_s())
        summary = asking.finish()
    finally:
        asking.stop()
        api.stop()
    if summary["failures"]:
        print("bench: failed asks:\n  " + "\n  ".join(summary["failures"]), file=sys.stderr)
    seconds, hub_cpu, commits, generator_cpu = (b - a for a, b in zip(before, after, strict=True))
    answered = asks_between(summary, before[0], seconds)
    label = f"{len(tokens):,} idle devices asking (wait {WAIT_S} s), {seconds:.0f} s"
    return [
        row(
            f"{label}: hub CPU, % of one core ({hub_cpu:.1f} s; device API "
            f"{' '.join(FLEET_GUNICORN)}; {load_average()})",
            hub_cpu / seconds * 100,
            "%",
            IDLE_CPU_TARGET,
        ),
        note(
            f"{label}: hub CPU per idle device per second",
            hub_cpu / seconds / len(tokens) * 1e6,
            "µs",
            "INFO",
        ),
        note(f"{label}: asks per second", answered / seconds, "/s", "INFO"),
        note(
            f"{label}: database transactions per second (pg_stat_database xact_commit; "
            "each device query is one)",
            commits / seconds,
            "/s",
            "INFO",
        ),
        row(f"{label}: failed asks ({statuses_text(summary)})", failed_asks(summary), "", 0),
        note(
            f"{label}: the load generator's own CPU, % of one core",
            generator_cpu / seconds * 100,
            "%",
            "INFO",
        ),
    ]


def asks_between(summary, start, seconds):
    """How many asks the devices sent in [start, start + seconds) (time.time())."""
    return sum(
        start <= t < start + seconds for device in summary["devices"] for t in device["asked"]
    )


def busy_class():
    """A class of BUSY_DEVICES asking devices that receives jobs; return (team, user, class,
    tokens)."""
    from deployhub.devices.models import DeviceClass

    team, user = fleet_team()
    device_class = DeviceClass.objects.create(team=team, slug="fleet-busy", name="Busy fleet")
    busy = add_https_devices(device_class, BUSY_DEVICES, "busy")
    return team, user, device_class, [token for _, token in busy]


def hub_job(asking, team, user, device_class):
    """Commit one no-op job; return ms from just before its COMMIT to a device holding it."""
    from django.db import transaction

    from deployhub.jobs.actions import submit_job
    from deployhub.jobs.models import JobKind

    with transaction.atomic():
        job = submit_job(team=team, kind=JobKind.NOOP, device_class=device_class, user=user)
        committed = time.time()  # the last act before COMMIT: the commit's own time counts
    job_id, received = asking.next_job()
    if job_id != job.pk:
        raise SystemExit(f"bench: committed job {job.pk}, a device received {job_id}")
    return (received - committed) * 1000


def start_bare_worker(log):
    """The bare Celery worker of bench_job_pipeline (bench/bare_celery.py), in make run's Python."""
    from bench.dispatch import BARE_WORKER

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [RUN_PYTHON, *BARE_WORKER], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )


def bench_fleet_dispatch():
    """Rows: commit → the claimed job at an asking device while a thousand asks are held,
    beside a bare Celery task's send → start, in turn."""
    from django.db import connections

    from bench.bare_celery import STARTS, app
    from bench.dispatch import bare_task, redis_client

    idle = [token for _, token in idle_fleet()]
    team, user, device_class, busy = busy_class()
    redis = redis_client()
    redis.delete(STARTS)
    connections.close_all()
    api = DeviceApi()
    asking = Asking(api.url, idle + busy)
    bare_worker = start_bare_worker(api.logs)
    try:
        bare_task(redis, app)  # waits until the bare worker is up
        time.sleep(WARMUP_S)
        hub, bare = [], []
        for _ in range(DISPATCH_JOBS + DISPATCH_WARMUP):
            hub.append(hub_job(asking, team, user, device_class))
            bare.append(bare_task(redis, app))
        summary = asking.finish()
    except SystemExit:
        print(api.output()[-4000:], file=sys.stderr)
        raise
    finally:
        bare_worker.terminate()
        asking.stop()
        api.stop()
        bare_worker.wait(timeout=20)
    return dispatch_rows(hub[DISPATCH_WARMUP:], bare[DISPATCH_WARMUP:], summary, len(idle))


def dispatch_rows(hub, bare, summary, idle):
    hub50, hub99 = statistics.median(hub), percentile(hub, 99)
    bare50, bare99 = statistics.median(bare), percentile(bare, 99)
    label = f"with {idle:,} idle devices asking, {len(hub)} jobs"
    return [
        note(
            f"{label}: bare Celery task, send → task start, p50 (p99 {bare99:.2f} ms; "
            f"in turn with the jobs)",
            bare50,
            "ms",
            "INFO",
        ),
        note(
            f"{label}: job commit → an asking device holds it (HTTPS), p50 ({load_average()})",
            hub50,
            "ms",
            "INFO",
        ),
        row(
            f"{label}: job commit → an asking device holds it vs bare Celery, p50",
            hub50 / bare50,
            "×",
            DISPATCH_P50_RATIO,
        ),
        row(f"{label}: job commit → an asking device holds it, p99", hub99, "ms", DISPATCH_P99_MS),
        row(f"{label}: failed asks ({statuses_text(summary)})", failed_asks(summary), "", 0),
    ]


def backlog_fleet():
    """The probe's class and device, and 49 other classes for the backlog; return (user,
    probe device, classes)."""
    from deployhub.devices.models import Device, DeviceClass

    team, user = fleet_team()
    classes = [
        DeviceClass.objects.create(team=team, slug=f"fleet-backlog-{n}", name=f"Backlog {n}")
        for n in range(1, BACKLOG_CLASSES + 1)
    ]
    add_https_devices(classes[0], 1, "probe")
    probe = Device.objects.get(device_class=classes[0])
    return user, probe, classes


def queue_backlog(classes, user):
    """Queue BACKLOG_JOBS no-op jobs over the classes in one statement, then ANALYZE the table
    as autovacuum would after such a change."""
    from django.db import connection

    from deployhub.jobs.models import Job, JobKind

    jobs = [
        Job(
            team_id=classes[n % len(classes)].team_id,
            device_class=classes[n % len(classes)],
            kind=JobKind.NOOP,
            created_by=user,
            log="queued by the backlog bench",
        )
        for n in range(BACKLOG_JOBS)
    ]
    Job.objects.bulk_create(jobs, batch_size=2000)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")


def copy_database(source, copy):
    """CREATE DATABASE copy from source; retried while another session (autovacuum) is in it."""
    import psycopg

    admin = "postgresql://postgres@127.0.0.1:5432/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {copy} WITH (FORCE)")
        for _ in range(50):
            try:
                conn.execute(f"CREATE DATABASE {copy} TEMPLATE {source}")
                return
            except psycopg.errors.ObjectInUse:
                time.sleep(0.2)
    raise SystemExit(f"bench: {source} stayed in use; could not copy it")


def drop_database(name):
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


class Prober:
    """bench/take_probe.py on one database: take(), then a JSON line back."""

    def __init__(self, database, device, user):
        url = os.environ["DATABASE_URL"].rsplit("/", 1)[0] + f"/{database}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.take_probe", str(device.pk), str(user.pk)],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": url},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.takes = []

    def take(self):
        self.process.stdin.write("take\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline() or "null")
        if answer is None or answer["job"] is None:
            raise SystemExit(f"bench: the take probe took nothing: {answer}")
        self.takes.append(answer)

    def ms(self):
        return [t["ms"] for t in self.takes if t["ms"] is not None]

    def queries(self):
        return {t["queries"] for t in self.takes if t["queries"] is not None}

    def stop(self):
        self.process.stdin.close()
        self.process.wait(timeout=20)


def candidate_plan(device):
    """EXPLAIN of the statement take_next_job runs for the device on PostgreSQL, as text: it
    takes the oldest queued job of the class (Job.objects.take_oldest)."""
    from django.db import connection
    from django.utils import timezone

    from deployhub.jobs.models import Job

    sql, params = Job.objects.oldest_statement(device, lease_expires_at=timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def bench_fleet_backlog():
    """Rows: take_next_job with 10,000 queued jobs over 50 classes against an empty queue,
    the two databases timed in turn; and whether its statement reads the partial index."""
    from django.conf import settings
    from django.db import connections

    from bench.take_probe import WARMUP

    user, probe, classes = backlog_fleet()
    source = settings.DATABASES["default"]["NAME"]
    empty = f"{source}_empty"
    connections.close_all()
    copy_database(source, empty)  # the same rows, without the backlog
    queue_backlog(classes, user)
    plan = candidate_plan(probe)
    connections.close_all()
    probers = [Prober(empty, probe, user), Prober(source, probe, user)]
    try:
        for number in range(TAKES + WARMUP):
            for prober in probers if number % 2 else probers[::-1]:  # neither always first
                prober.take()
    finally:
        for prober in probers:
            prober.stop()
        drop_database(empty)
    return backlog_rows(*probers, plan)


def backlog_rows(empty, full, plan):
    empty50, full50 = statistics.median(empty.ms()), statistics.median(full.ms())
    (empty_queries,), (full_queries,) = empty.queries(), full.queries()
    label = f"take_next_job, {BACKLOG_JOBS:,} queued jobs over {BACKLOG_CLASSES} classes"
    uses_index = "job_queued_by_class" in plan
    return [
        row(
            f"{label}: queries per take (an empty queue: {empty_queries})",
            full_queries,
            "",
            empty_queries,
        ),
        row(
            f"{label} vs an empty queue, median time, in turn ({full50:.2f} vs {empty50:.2f} ms"
            f" over {len(full.ms())} takes each; {load_average()})",
            full50 / empty50,
            "×",
            BACKLOG_RATIO,
        ),
        note(
            f"{label}: its statement reads the partial index job_queued_by_class",
            None,
            "",
            "PASS" if uses_index else "MISS",
            "" if uses_index else " / ".join(line.strip() for line in plan.splitlines()),
        ),
    ]


def bench_fleet_reconnect():
    """Rows: the device API killed under RECONNECT_DEVICES asking devices and started again
    DOWN_S later: how the devices' returns spread (full jitter, no herd).

    A device is back when its ask lands: the hub's first act on an ask is to record it as
    the device's heartbeat (last_heartbeat_at), which the next ask, a held wait later,
    overwrites. The bench reads them every half second: the device's own clock would see a
    held ask end, or an ask sent while the hub boots, not the moment the hub took it.
    """
    from django.db import connections

    fleet = idle_fleet()[:RECONNECT_DEVICES]
    connections.close_all()
    api = DeviceApi()
    asking = Asking(api.url, [token for _, token in fleet])
    try:
        time.sleep(WARMUP_S)
        killed = time.time()
        api.kill()
        time.sleep(DOWN_S)
        api.start()
        landed = landings([pk for pk, _ in fleet], killed, RECOVER_S)
        summary = asking.finish()
    finally:
        asking.stop()
        api.stop()
    if not summary["devices"] or not landed:
        raise SystemExit(f"bench: no device came back: {statuses_text(summary)}")
    back = min(landed.values())
    returns = [landed[pk] - back if pk in landed else None for pk, _ in fleet]
    return reconnect_rows(returns, len(fleet), back - killed)


def landings(device_ids, since, timeout):
    """{device id: when its first ask after since landed}, read every half second (time.time())."""
    from datetime import UTC, datetime

    from deployhub.devices.models import Device

    after = datetime.fromtimestamp(since, UTC)
    landed, deadline = {}, time.monotonic() + timeout
    while len(landed) < len(device_ids) and time.monotonic() < deadline:
        beats = Device.objects.filter(pk__in=device_ids, last_heartbeat_at__gt=after)
        for pk, at in beats.values_list("pk", "last_heartbeat_at"):
            landed.setdefault(pk, at.timestamp())
        time.sleep(0.5)
    return landed


def reconnect_spread(times, back):
    """The spread of returns after the hub is back: p10, p50, p90 (s after back), the most
    in any one second, and that as a % of the returns."""
    after = sorted(t - back for t in times)
    peak = peak_per_second(after)
    return {
        "p10": percentile(after, 10),
        "p50": percentile(after, 50),
        "p90": percentile(after, 90),
        "peak": peak,
        "peak_share": 100 * peak / len(after),
    }


def peak_per_second(times):
    """The most of the times (seconds, sorted) that fall in any window of one second."""
    peak, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= 1:
            start += 1
        peak = max(peak, end - start + 1)
    return peak


def simulated_returns(down_s, count, rng=random):
    """When count devices following workers' reconnect_delay come back to a hub that went away
    at 0 and answers again at down_s: seconds after down_s, one per device."""
    from workers.https_mode import reconnect_delay

    returns = []
    for _ in range(count):
        at, failures = 0.0, 0
        while at < down_s:
            failures += 1
            at += reconnect_delay(failures, rng)
        returns.append(at - down_s)
    return returns


def reconnect_rows(returns, count, down_s):
    back = [t for t in returns if t is not None]
    label = f"{count} asking devices, the device API killed, the first back {down_s:.1f} s later"
    rows = [row(f"{label}: devices not back within {RECOVER_S} s", count - len(back), "", 0)]
    if not back:
        return rows
    spread = reconnect_spread(back, 0.0)
    expected = reconnect_spread(simulated_returns(down_s, count, random.Random(0)), 0.0)
    return [
        *rows,
        note(
            f"{label}: returns after the first, p10–p90 (p10 {spread['p10']:.1f} s, "
            f"p50 {spread['p50']:.1f} s; the policy simulated: p10–p90 "
            f"{expected['p10']:.1f}–{expected['p90']:.1f} s)",
            spread["p90"] - spread["p10"],
            "s",
            "INFO",
        ),
        row(
            f"{label}: the busiest second's share of returns ({spread['peak']} devices; "
            f"the policy simulated: {expected['peak_share']:.0f} %; {load_average()})",
            spread["peak_share"],
            "%",
            PEAK_SECOND_SHARE,
        ),
    ]
