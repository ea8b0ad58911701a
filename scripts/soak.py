"""`make soak`: break a private scaled-out DeployHub and count what survives.

Starts its own PostgreSQL and Redis on spare ports and its own storage folder (a small
tmpfs when this machine lets us mount one), the hub under gunicorn, the hub worker
(the reaper) and beat, and real device workers, all as processes (tests/soak_stack.py);
the shared services on 5432/6379 are never touched. Then it runs the faults one after
another with cheap jobs (no-op jobs, short benchmarks and compiles of the demo model):

1. worker-kill     kill -9 a worker mid-compile, SIGTERM a worker mid-job, kill -9 the
                   hub worker (the reaper) while a lease runs out; each is restarted
2. redis-restart   restart Redis (persistence off: its messages are gone) with jobs
                   queued and running
3. redis-outage    stop Redis while the hub commits new jobs; start it again later
4. postgres-restart  restart PostgreSQL under load (uploads, submissions, results)
5. storage-full    fill the storage filesystem, then upload a model and build an engine
6. clock-skew      workers whose clocks are 10 minutes ahead and behind hold leases
7. wrong-call-tokens  valid tokens at the wrong call (a device's on a person's call, a
                   person's and a pipeline's on a device's) from the workers' address, more
                   than the made-up-token limit, while jobs run: nothing is locked out

and three on devices in HTTPS mode (a class of four workers with no broker URL at all,
asking `POST device/work`, started by the first of these that runs):

8. https-hub-restart  kill -9 the hub's gunicorn with a job running and the other devices
                   waiting in asks, queue jobs while it is away, start it again; prints each
                   device's reconnect time (its log's "the hub answers again after N failed
                   ask(s)") from the hub's first answer, and their spread
9. https-postgres-restart  restart PostgreSQL while the devices wait in asks: the hub's
                   work listener says it lost its connection and LISTENs again, and a job
                   queued after the restart reaches a waiting device (how soon is printed)
10. https-revoke   revoke a device mid-job, then one waiting in an ask (the revoke API): the
                   job goes back on the queue at once and finishes on another device, each
                   revoked device is given nothing more and its worker exits saying why; a
                   new device takes each one's place for later faults

Each fault prints what it did and what it found: jobs submitted, finished, lost (not
final in time), run twice (a job's result recorded twice) and orphan files (files
without rows, rows without files, half-written uploads). Exit 0 when every fault finds
0 lost, 0 run twice and 0 orphans (and `make soak` ran at least 500 jobs).
`--short` (tests/test_soak_short.py, in `make test`) runs fewer jobs and shorter outages,
and leaves out https-postgres-restart and https-revoke. `--only a,b` runs the named faults alone (in
either form), e.g. `scripts/soak.py --short --only https-hub-restart,https-revoke`.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.private_services import port_open, wait_for  # noqa: E402
from tests.soak_stack import BROKER, HTTPS, Stack, http_json, stop_together  # noqa: E402
from tests.soak_world import (  # noqa: E402
    CLASS_SLUG,
    DEVICES,
    HTTPS_DEVICES,
    SKEWED,
    UNPUBLISHED,
    Jobs,
    Load,
    add_device,
    configure_django,
    db_retry,
    make_world,
    outcome,
    storage_audit,
)

MIN_JOBS = 500


@dataclass(frozen=True)
class Plan:
    """How much each fault does: `make soak` runs FULL, `make test` SHORT."""

    lease_seconds: int
    noops: int  # no-op jobs per fault batch
    redis_outage_s: float
    postgres_outage_s: float
    hub_outage_s: float  # how long the hub's gunicorn stays dead (https-hub-restart)
    long_job_s: float  # a benchmark long enough to be caught mid-job
    settle_s: int  # how long a fault's jobs may take to end
    min_jobs: int


# PostgreSQL stays down for less than a lease: results wait for it instead of being lost.
FULL = Plan(
    lease_seconds=12,
    noops=90,
    redis_outage_s=30,
    postgres_outage_s=10,
    hub_outage_s=5,
    long_job_s=4,
    settle_s=300,
    min_jobs=MIN_JOBS,
)
SHORT = Plan(
    lease_seconds=8,
    noops=12,
    redis_outage_s=6,
    postgres_outage_s=5,
    hub_outage_s=3,
    long_job_s=3,
    settle_s=150,
    min_jobs=0,
)


@dataclass
class Finding:
    """What one fault did and found."""

    name: str
    title: str
    did: list = field(default_factory=list)
    jobs: list = field(default_factory=list)
    expected_failures: set = field(default_factory=set)  # job ids meant to fail (storage full)
    checks: dict = field(default_factory=dict)  # what was checked -> (passed, detail)
    figures: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)  # timings worth keeping (reconnect spread)
    seconds: float = 0.0  # how long the fault took
    skipped: str = ""

    def say(self, line):
        self.did.append(line)
        print(f"   {line}", flush=True)

    def check(self, what, passed, detail=""):
        self.checks[what] = (bool(passed), detail)

    @property
    def ok(self):
        f = self.figures
        clean = not (f.get("lost") or f.get("run_twice") or f.get("orphans"))
        unexpected = f.get("failed_unexpectedly", 0)
        return self.skipped != "" or (
            clean and not unexpected and all(p for p, _ in self.checks.values())
        )


# ---------------------------------------------------------------- the soak


class Soak:
    def __init__(self, stack, world, plan):
        self.stack, self.world, self.plan = stack, world, plan
        self.jobs = Jobs(stack, world)
        self.https_jobs = Jobs(stack, world, world.https_class)
        self.https_devices = list(HTTPS_DEVICES)  # a revoked one is replaced by a new name
        self.findings = []
        self.stalls = []

    # -- workers

    def start_workers(self, names=DEVICES):
        """Start broker-mode workers, all at once (each takes seconds to load its backends),
        and wait until each consumes."""
        stack, tokens = self.stack, self.world.device_tokens
        launched = [
            (name, stack.launch_worker(name, tokens[name], clock_offset=SKEWED.get(name, 0)))
            for name in names
        ]
        for name, started in launched:
            stack.wait_ready(name, BROKER, *started)

    def start_https_workers(self):
        """Start the HTTPS-mode devices not running yet, all at once (each takes seconds to
        load its backends), and wait until each asks the hub for work; return the names of
        the class's devices (a revoked one's replacement, not it)."""
        stack, tokens = self.stack, self.world.device_tokens
        missing = [n for n in self.https_devices if not _running(stack.https_workers.get(n))]
        launched = [(n, stack.launch_worker(n, tokens[n], mode=HTTPS)) for n in missing]
        for name, started in launched:
            stack.wait_ready(name, HTTPS, *started)
        return list(self.https_devices)

    def worker_of(self, job):
        return job.device.name

    # -- waiting

    def settle(self, finding, job_ids=None, https=False):
        """Wait until the fault's jobs are final; restart workers that stall; say so.

        https: the jobs are the HTTPS class's, which no broker carries: a stall is only said.
        """
        job_ids = finding.jobs if job_ids is None else job_ids
        deadline = time.monotonic() + self.plan.settle_s
        still_for = max(4 * self.plan.lease_seconds, 20)
        last, changed = None, time.monotonic()
        while time.monotonic() < deadline:
            states = self.jobs.states(job_ids)
            if states["queued"] + states["running"] == 0:
                return True
            if states != last:
                last, changed = states, time.monotonic()
            elif time.monotonic() - changed > still_for and states["queued"]:
                look = self.look_at_https_stall if https else self.look_at_stall
                look(finding, states)
                changed = time.monotonic()
            time.sleep(0.3)
        finding.say(f"gave up waiting after {self.plan.settle_s} s: {dict(last)}")
        return False

    def look_at_stall(self, finding, states):
        """Jobs queued and nothing moving: messages waiting with workers connected is the
        "connected but not consuming" stall (restart the workers); no messages at all is
        the hub's to fix (its reaper resends lost messages), so only say so."""
        depth = self.queue_depth()
        alive = [name for name, process in self.stack.workers.items() if process.running]
        if not depth:
            finding.say(f"{states['queued']} jobs queued, {depth} messages on the broker")
            return
        line = (
            f"STALL: {states['queued']} jobs queued, {depth} messages waiting, workers "
            f"{', '.join(alive) or 'none'} connected and taking none: restarting them"
        )
        finding.say(line)
        self.stalls.append(line)
        for name in alive:
            self.stack.workers[name].kill9()
            self.start_workers([name])

    def look_at_https_stall(self, finding, states):
        """HTTPS jobs queued and nothing moving: the devices ask and are given none (the
        hub's to fix). Nothing is restarted: that would hide it."""
        alive = [n for n, process in self.stack.https_workers.items() if process.running]
        line = (
            f"STALL: {states['queued']} HTTPS jobs queued and devices "
            f"{', '.join(alive) or 'none'} asking are given none"
        )
        finding.say(line)
        self.stalls.append(line)

    def queue_depth(self):
        """Messages waiting in the class's queue (Redis LLEN), or None when Redis is down."""
        import redis

        client = redis.Redis.from_url(self.stack.redis.url(), socket_connect_timeout=1)
        try:
            return client.llen(f"dc.{CLASS_SLUG}")
        except redis.RedisError:
            return None

    # -- reporting

    def conclude(self, finding):
        """Count the fault's jobs and the storage; print and keep the finding."""
        figures = db_retry(lambda: outcome(finding.jobs, finding.expected_failures))
        audit = db_retry(lambda: storage_audit(self.stack.storage))
        figures["orphans"] = sum(len(v) for v in audit.values())
        figures["orphan_detail"] = {k: v[:5] for k, v in audit.items() if v}
        finding.figures = figures
        self.findings.append(finding)
        print_finding(finding)
        return finding


def print_finding(finding):
    f = finding.figures
    print(
        f"   jobs: submitted {f['submitted']}, finished {f['finished']} (succeeded "
        f"{f['succeeded']}, failed {f['failed']}, cancelled {f['cancelled']}), lost {f['lost']}, "
        f"run twice {f['run_twice']}; re-run attempts {f['rerun_attempts']}, messages lost "
        f"and sent again {f['sent_again']}, benchmark results missing {f['results_missing']}"
    )
    if f["failures"]:
        print(f"   unexpected failures: {f['failures']}")
    print(f"   files: orphans {f['orphans']} {f['orphan_detail'] or ''}".rstrip())
    for what, (passed, detail) in finding.checks.items():
        print(f"   {'ok  ' if passed else 'FAIL'} {what}{': ' + detail if detail else ''}")
    print(f"   => {'OK' if finding.ok else 'FAILED'}", flush=True)


def begin(name, title):
    print(f"\n== {name}: {title}", flush=True)
    return Finding(name, title)


# ---------------------------------------------------------------- 1. worker kills


def fault_worker_kill(soak):
    finding = begin(
        "worker-kill",
        "kill -9 a worker mid-compile; SIGTERM a worker mid-job; kill -9 the hub worker",
    )
    kill_mid_compile(soak, finding)
    terminate_mid_job(soak, finding)
    kill_the_reaper(soak, finding)
    soak.settle(finding)
    return soak.conclude(finding)


def kill_mid_compile(soak, finding):
    jobs, stack = soak.jobs, soak.stack
    compile_id = jobs.compile()
    finding.jobs += [compile_id, *jobs.noops(soak.plan.noops // 2)]
    job = jobs.wait_running(compile_id, 60)
    victim = soak.worker_of(job)
    wait_for(lambda: "input model verified" in jobs.get(compile_id).log, 30, "the build to start")
    stack.workers[victim].kill9()
    last_line = jobs.get(compile_id).log.strip().splitlines()[-1].split(" ", 1)[-1]
    finding.say(
        f"kill -9 worker {victim} while compile job {compile_id} was building (attempt "
        f"{job.attempt}, its last log line: {last_line!r}); restarted it"
    )
    soak.start_workers([victim])
    soak.settle(finding, [compile_id])
    done = jobs.get(compile_id)
    from deployhub.engines.models import Engine

    engines = Engine.objects.filter(model_version=soak.world.version).count()
    finding.check(
        "the compile finished on a later attempt and left exactly one engine",
        done.state == "succeeded" and done.attempt > 1 and engines == 1,
        f"{done.state} on attempt {done.attempt}, {engines} engine(s)",
    )


def terminate_mid_job(soak, finding):
    jobs, stack = soak.jobs, soak.stack
    long_id = jobs.benchmark(soak.plan.long_job_s)
    finding.jobs += [long_id, *jobs.noops(soak.plan.noops // 2)]
    job = jobs.wait_running(long_id, 60, progressed=True)
    victim = soak.worker_of(job)
    started = time.monotonic()
    exited = stack.terminate_worker(victim)
    waited = time.monotonic() - started
    after = jobs.get(long_id)
    finding.say(
        f"SIGTERM worker {victim} while benchmark job {long_id} ran (progress "
        f"{job.progress:.2f}): it {'exited' if exited else 'did not exit; killed'} after "
        f"{waited:.1f} s, the job {after.state} on attempt {after.attempt}; restarted it"
    )
    finding.check(
        "a SIGTERM lets the running job finish before the worker exits (warm shutdown)",
        exited and after.state == "succeeded" and after.attempt == 1,
        f"{after.state} on attempt {after.attempt}",
    )
    soak.start_workers([victim])


def kill_the_reaper(soak, finding):
    jobs, stack, lease = soak.jobs, soak.stack, soak.plan.lease_seconds
    stack.hub_worker.kill9()
    long_id = jobs.benchmark(soak.plan.long_job_s)
    finding.jobs.append(long_id)
    job = jobs.wait_running(long_id, 60, progressed=True)
    victim = soak.worker_of(job)
    stack.workers[victim].kill9()
    soak.start_workers([victim])
    time.sleep(lease + 3)
    stuck = jobs.get(long_id)
    finding.say(
        f"kill -9 the hub worker, then kill -9 worker {victim} running job {long_id}: "
        f"{lease + 3} s later (lease {lease} s) the job is {stuck.state}, attempt {stuck.attempt}"
    )
    finding.jobs += jobs.noops(soak.plan.noops // 4)
    stack.restart_hub_worker()
    started = time.monotonic()
    wait_for(lambda: jobs.get(long_id).attempt > 1, 60, "the restarted reaper to re-queue it")
    finding.say(
        f"restarted the hub worker: it re-queued job {long_id} within "
        f"{time.monotonic() - started:.1f} s"
    )
    finding.check(
        "nothing reaps while the hub worker is down; its restart re-queues the lost job",
        stuck.state == "running" and stuck.attempt == 1,
        f"{stuck.state} on attempt {stuck.attempt} while it was down",
    )


# ---------------------------------------------------------------- 2. Redis


def fault_redis_restart(soak):
    finding = begin(
        "redis-restart", "restart Redis (its messages lost) with jobs queued and running"
    )
    jobs, stack = soak.jobs, soak.stack
    busy = [jobs.benchmark(2 * soak.plan.long_job_s) for _ in stack.workers]  # one each
    finding.jobs += [*busy, *jobs.noops(soak.plan.noops)]  # queued behind them
    for job_id in busy:
        jobs.wait_running(job_id, 60, progressed=True)
    states = jobs.states(finding.jobs)
    depth = soak.queue_depth()
    stack.redis.stop()
    stack.redis.start()
    finding.say(
        f"restarted Redis with {states['queued']} jobs queued ({depth} messages in the "
        f"queue) and {states['running']} running; the restarted Redis holds none of them"
    )
    started = time.monotonic()
    soak.settle(finding)
    finding.say(f"every job ended {time.monotonic() - started:.1f} s after the restart")
    check_consuming(soak, finding)
    return soak.conclude(finding)


def fault_redis_outage(soak):
    outage = soak.plan.redis_outage_s
    finding = begin(
        "redis-outage", f"stop Redis while the hub commits new jobs; start it {outage:g} s later"
    )
    jobs, stack = soak.jobs, soak.stack
    stack.redis.stop()
    statuses, slowest, unpublished = Counter(), 0.0, UNPUBLISHED.count
    stop_at = time.monotonic() + outage
    while time.monotonic() < stop_at:
        began = time.monotonic()
        job_id, (status, _, _) = jobs.benchmark_by_api()
        slowest = max(slowest, time.monotonic() - began)
        statuses[status] += 1
        finding.jobs += [job_id] if job_id else []
        finding.jobs += jobs.noops(2)
        time.sleep(0.2)
    stack.redis.start()
    finding.say(
        f"stopped Redis for {outage:g} s; meanwhile the hub accepted {statuses[202]} benchmark "
        f"requests over HTTP (answers {dict(statuses)}, slowest {slowest:.1f} s) and this "
        f"process committed {len(finding.jobs) - statuses[202]} no-op jobs (it could not "
        f"publish {UNPUBLISHED.count - unpublished} of them); started Redis again"
    )
    finding.check(
        "the hub accepts jobs while the broker is down", set(statuses) == {202}, str(dict(statuses))
    )
    started = time.monotonic()
    soak.settle(finding)
    finding.say(f"every job ended {time.monotonic() - started:.1f} s after Redis came back")
    check_consuming(soak, finding)
    return soak.conclude(finding)


def check_consuming(soak, finding):
    """Every worker takes jobs again after the broker came back (no connected-but-idle stall)."""
    probe = soak.jobs.noops(4 * len(soak.stack.workers))
    finding.jobs += probe
    soak.settle(finding, probe)
    from deployhub.jobs.models import Job

    takers = Counter(Job.objects.filter(pk__in=probe).values_list("device__name", flat=True))
    idle = [name for name in soak.stack.workers if not takers[name]]
    finding.check(
        "every worker consumes again (a probe batch reaches each)",
        not idle,
        f"jobs per worker {dict(takers)}" + (f"; idle: {idle}" if idle else ""),
    )


# ---------------------------------------------------------------- 3. PostgreSQL


def fault_postgres_restart(soak):
    outage = soak.plan.postgres_outage_s
    finding = begin("postgres-restart", f"restart PostgreSQL under load ({outage:g} s down)")
    jobs, stack = soak.jobs, soak.stack
    with Load(soak) as load:
        time.sleep(1)
        # Busy workers when it stops: claims, engine uploads and results meet the outage.
        busy = [jobs.benchmark(1.0) for _ in stack.workers]
        finding.jobs += [*busy, jobs.compile(), jobs.benchmark(1.0), jobs.compile()]
        finding.jobs += jobs.noops(soak.plan.noops)
        for job_id in busy:
            jobs.wait_running(job_id, 60, progressed=True, or_done=True)
        stack.postgres.stop("fast")
        down = time.monotonic()
        time.sleep(outage)
        stack.postgres.start()
        back = time.monotonic()
        healthy = wait_for(lambda: stack.health()[0] == 200 and time.monotonic(), 60, "/healthz")
        time.sleep(2)
    finding.say(
        f"stopped PostgreSQL (fast shutdown) under load for {back - down:.1f} s; the hub "
        f"answered /healthz 200 again {healthy - back:.1f} s after it came back"
    )
    answers = ", ".join(f"{e} {s}: {n}" for (e, s), n in sorted(load.answers.items(), key=str))
    finding.say(f"answers meanwhile: {answers}")
    finding.check(
        "while the database is down the hub answers 503 with a JSON error and Retry-After, "
        "never another 5xx",
        not load.bad and any(s == 503 for (_, s) in load.answers),
        "; ".join(sorted(set(load.bad))[:5]) or "every 5xx was a 503 with a JSON error",
    )
    finding.jobs += load.submitted
    soak.settle(finding)
    check_uploads(soak, finding, load.uploads)
    return soak.conclude(finding)


def check_uploads(soak, finding, uploads):
    """Every upload the hub acknowledged (201) is a version with its file."""
    from deployhub.registry.models import ModelVersion

    kept = {
        v.pk: v
        for v in ModelVersion.objects.filter(pk__in=[pk for pk, _ in uploads])
        if v.file and (Path(soak.stack.storage) / v.file.name).exists()
    }
    lost = [pk for pk, sha in uploads if pk not in kept or kept[pk].sha256 != sha]
    finding.check(
        "every acknowledged upload is stored with its file",
        not lost,
        f"{len(uploads)} acknowledged, {len(lost)} lost {lost[:5] or ''}".rstrip(),
    )


# ---------------------------------------------------------------- 4. storage full


def fault_storage_full(soak):
    finding = begin("storage-full", "storage full during an upload and during an engine upload")
    stack, jobs = soak.stack, soak.jobs
    if not stack.tmpfs:
        finding.skipped = "cannot mount a small tmpfs here (needs root): not run"
        finding.say(finding.skipped)
        return soak.conclude(finding)
    ballast = fill(stack.storage, leave=16 * 1024)
    finding.say(f"filled the {stack.storage_free_bytes() // 1024} KiB-free storage tmpfs")
    try:
        upload_when_full(soak, finding)
        engine_when_full(soak, finding)
    finally:
        ballast.unlink()
    finding.say("freed the space again")
    after = [jobs.compile(), *jobs.noops(soak.plan.noops // 2)]
    finding.jobs += after
    soak.settle(finding)
    finding.check(
        "with space again, builds and jobs succeed",
        jobs.states(after)["succeeded"] == len(after),
        str(dict(jobs.states(after))),
    )
    return soak.conclude(finding)


def fill(folder, leave):
    """Write a ballast file until the filesystem is full, then free `leave` bytes of it."""
    ballast = Path(folder) / "ballast"
    with open(ballast, "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 65536)
        except OSError:
            pass
    size = ballast.stat().st_size
    os.truncate(ballast, max(0, size - leave))
    return ballast


def upload_when_full(soak, finding):
    from deployhub.registry.models import ModelVersion

    before = ModelVersion.objects.count()
    url = f"{soak.stack.url}/api/v1/models/{soak.world.model.pk}/versions"
    content = (ROOT / "deployhub" / "demo" / "assets" / "digits_cnn_v1.onnx").read_bytes()
    status, body, _ = http_json(
        "POST", url, token=soak.world.api_token, files={"file": ("full.onnx", content)}
    )
    finding.say(f"uploaded a {len(content) // 1024} KiB model: the hub answered {status} {body}")
    leftovers = [p for p in (Path(soak.stack.storage) / "tmp").rglob("*") if p.is_file()]
    finding.check(
        "a model upload onto a full disk is refused with a clear JSON error and stores nothing",
        status == 507
        and isinstance(body, dict)
        and "storage" in body.get("error", "").lower()
        and ModelVersion.objects.count() == before
        and not leftovers,
        f"{status}, {ModelVersion.objects.count() - before} new versions, "
        f"{len(leftovers)} temporary files left",
    )


def engine_when_full(soak, finding):
    jobs = soak.jobs
    compile_id = jobs.compile()
    finding.jobs.append(compile_id)
    finding.expected_failures.add(compile_id)
    soak.settle(finding, [compile_id])
    job = jobs.get(compile_id)
    finding.say(f"compile job {compile_id} on the full disk: {job.state}: {job.error[:200]}")
    finding.check(
        "an engine upload onto a full disk fails its job with a clear error",
        job.state == "failed" and "storage" in job.error.lower(),
        job.error[:120],
    )


# ---------------------------------------------------------------- 5. clock skew


def fault_clock_skew(soak):
    finding = begin("clock-skew", "workers whose clocks are 10 minutes ahead and behind")
    stack, jobs, lease = soak.stack, soak.jobs, soak.plan.lease_seconds
    for name in DEVICES:
        stack.terminate_worker(name)
    soak.start_workers(list(SKEWED))
    finding.say("stopped the workers; started 'ahead' (clock +600 s) and 'behind' (clock -600 s)")
    held = [jobs.benchmark(2.5 * lease) for _ in SKEWED]
    finding.jobs += [*held, *jobs.noops(soak.plan.noops)]
    soak.settle(finding)
    ran = [jobs.get(job_id) for job_id in held]
    finding.check(
        f"benchmarks longer than two leases ({2.5 * lease:g} s) finish on their first attempt",
        all(j.state == "succeeded" and j.attempt == 1 for j in ran),
        ", ".join(f"job {j.pk} {j.state} attempt {j.attempt} on {j.device}" for j in ran),
    )
    reap_on_hub_clock(soak, finding)
    stop_together([stack.workers.pop(name) for name in SKEWED], 20)
    soak.start_workers()
    return soak.conclude(finding)


def reap_on_hub_clock(soak, finding):
    """A skewed worker killed mid-job loses its lease on the hub's clock, not its own."""
    jobs, stack, lease = soak.jobs, soak.stack, soak.plan.lease_seconds
    long_id = jobs.benchmark(soak.plan.long_job_s * 2)
    finding.jobs.append(long_id)
    job = jobs.wait_running(long_id, 60, progressed=True)
    victim = soak.worker_of(job)
    stack.workers[victim].kill9()
    killed = time.monotonic()
    wait_for(lambda: jobs.get(long_id).attempt > 1, 120, "the lease to expire")
    took = time.monotonic() - killed
    soak.start_workers([victim])
    soak.settle(finding, [long_id])
    done = jobs.get(long_id)
    finding.say(
        f"kill -9 worker {victim} mid-job: the hub re-queued job {long_id} {took:.1f} s later "
        f"(lease {lease} s); it {done.state} on {done.device}"
    )
    limit = lease + 3 * stack.reaper_interval + 5
    finding.check(
        "the hub expires a skewed worker's lease on its own clock",
        took <= limit and done.state == "succeeded",
        f"re-queued after {took:.1f} s (limit {limit} s)",
    )


# ---------------------------------------------------------------- 6. tokens at the wrong call


def fault_wrong_call_tokens(soak):
    """Valid tokens sent where they do not belong, from the address the workers
    share (127.0.0.1, as make run's worker shares it with every local script), were counted
    as made-up ones; the address was locked out and a finished job ran a second time."""
    from django.utils import timezone

    finding = begin("wrong-call-tokens", "valid tokens at the wrong call from the workers' address")
    jobs, stack = soak.jobs, soak.stack
    busy = [jobs.benchmark(2 * soak.plan.long_job_s) for _ in stack.workers]
    finding.jobs += [*busy, *jobs.noops(soak.plan.noops)]
    for job_id in busy:
        jobs.wait_running(job_id, 60, progressed=True)
    answers = send_wrong_calls(soak, WRONG_CALLS)
    after, locked = timezone.now(), locked_addresses()
    finding.say(
        f"sent {len(WRONG_CALLS)} valid tokens to calls they do not open from {stack.url} "
        f"while {len(busy)} benchmarks ran: answers {dict(answers)}"
    )
    finding.check(
        "a known token at the wrong call is a 403, never counted as a made-up one",
        set(answers) == {403} and not locked,
        f"answers {dict(answers)}, addresses counted: {locked or 'none'}",
    )
    finding.jobs += jobs.noops(soak.plan.noops)  # queued after the calls
    soak.settle(finding)
    ran = [jobs.get(job_id) for job_id in busy]
    finding.check(
        "the running jobs finish on their first attempt",
        all(j.state == "succeeded" and j.attempt == 1 for j in ran),
        ", ".join(f"job {j.pk} {j.state} attempt {j.attempt}" for j in ran),
    )
    check_heartbeats_since(soak, finding, after)
    return soak.conclude(finding)


# More than DEPLOYHUB_TOKEN_FAILURE_LIMIT (30): (method, path, whose token).
WRONG_CALLS = (
    [("POST", "models", "device")] * 14
    + [("POST", "device/heartbeat", "pipeline")] * 14
    + [("GET", "device", "person")] * 12
)


def send_wrong_calls(soak, calls):
    """Send each call with a valid token of the wrong kind; count the answers' statuses."""
    world = soak.world
    tokens = {
        "device": world.device_tokens[DEVICES[0]],
        "pipeline": world.pipeline_token,
        "person": world.api_token,
    }
    answers = Counter()
    for method, path, whose in calls:
        url = f"{soak.stack.url}/api/v1/{path}"
        answers[http_json(method, url, {}, token=tokens[whose])[0]] += 1
    return answers


def locked_addresses():
    """The addresses with made-up tokens counted against them."""
    from deployhub.teams.models import TokenFailures

    return list(TokenFailures.objects.values_list("address", flat=True))


def check_heartbeats_since(soak, finding, moment):
    """Every worker's device heartbeated after `moment`: none showed offline."""
    from deployhub.devices.models import Device

    names = list(soak.stack.workers)
    quiet = Device.objects.filter(name__in=names).exclude(last_heartbeat_at__gt=moment)
    quiet = sorted(quiet.values_list("name", flat=True))
    finding.check(
        "every worker heartbeats on after the calls (none shows offline)",
        not quiet,
        f"quiet: {quiet}" if quiet else f"{len(names)} workers heartbeating",
    )


# ---------------------------------------------------------------- 7. HTTPS mode

# What an HTTPS-mode worker's log says (workers/https_mode.py, workers/cli.py) and the hub's.
ASK_FAILED = "asking the hub for work failed"
ANSWERS_AGAIN = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ workers\.https_mode: "
    r"the hub answers again after (\d+) failed ask",
    re.MULTILINE,
)
REFUSED_DEVICE = "the hub refused this device"
LISTENER_LOST = "work listener lost its connection"
LISTEN_QUERY = "LISTEN deployhub_work"  # deployhub/jobs/waiting.py's CHANNEL


def fault_https_hub_restart(soak):
    outage = soak.plan.hub_outage_s
    finding = begin(
        "https-hub-restart",
        f"kill -9 the hub's gunicorn under HTTPS devices; start it again {outage:g} s later",
    )
    stack, jobs = soak.stack, soak.https_jobs
    names = soak.start_https_workers()
    running = max(1, len(names) // 4)  # the other devices wait in asks when the hub dies
    busy = [jobs.benchmark(2 * soak.plan.long_job_s) for _ in range(running)]
    finding.jobs += busy
    for job_id in busy:
        jobs.wait_running(job_id, 60, progressed=True)
    time.sleep(1)  # the other devices are back in an ask the hub holds
    marks = {name: log_mark(stack, name) for name in names}
    stack.hub.kill9()
    killed = time.time()
    finding.jobs += jobs.noops(soak.plan.noops)  # queued while the hub is away
    time.sleep(outage)
    stack.restart_hub()
    bound = wait_for(lambda: port_open(stack.port) and time.time(), 120, "the hub's port", 0.02)
    back = wait_for(lambda: stack.health()[0] == 200 and time.time(), 120, "the hub", 0.05)
    finding.say(
        f"kill -9 the hub's gunicorn with {len(busy)} benchmark(s) running on HTTPS devices "
        f"and the others waiting in asks; queued {soak.plan.noops} no-op jobs while it was "
        f"away; started it again after {outage:g} s: its port took connections "
        f"{bound - killed:.1f} s after the kill, /healthz answered 200 {back - bound:.1f} s "
        "later (what connected meanwhile waited in the listen backlog)"
    )
    soak.settle(finding, https=True)
    wait_came_back(marks)
    ran = [jobs.get(job_id) for job_id in busy]
    finding.say(
        "what ran through the outage: "
        + ", ".join(f"job {j.pk} {j.state} on attempt {j.attempt}" for j in ran)
    )
    report_reconnect_spread(soak, finding, marks, healthy_at=back)
    return soak.conclude(finding)


def report_reconnect_spread(soak, finding, marks, healthy_at):
    """Say how long after the hub's return each device that lost it had an ask answered
    again, from its log ("the hub answers again after N failed ask(s)"); check that each
    device whose ask failed came back.

    The hub is back from its first answer: /healthz's 200 or a device's answered ask,
    whichever the logs show first (a device may be answered before /healthz is).
    """
    answered, lost, busy = reconnects(marks)
    back = min([healthy_at, *(at for at, _ in answered.values())])
    delays = {name: at - back for name, (at, _) in answered.items()}
    spread = max(delays.values()) - min(delays.values()) if delays else 0.0
    finding.measured["reconnect_s"] = {name: round(d, 2) for name, d in delays.items()}
    finding.measured["reconnect_spread_s"] = round(spread, 2)
    each = ", ".join(
        f"{name} +{delays[name]:.1f} s ({failed} failed)"
        for name, (_, failed) in sorted(answered.items())
    )
    finding.say(
        f"reconnect spread, from the hub's first answer to each device's first answered ask: "
        f"{each or 'no device lost the hub'}; spread {spread:.1f} s"
        + (f"; {', '.join(busy)} ran a job through the outage (no ask failed)" if busy else "")
    )
    exited = [name for name in marks if not _running(soak.stack.https_workers.get(name))]
    finding.check(
        "every device whose ask failed asks again once the hub is back; none exits",
        answered and not lost and not exited,
        f"{len(answered)} came back"
        + (f"; never came back: {lost}" if lost else "")
        + (f"; exited: {exited}" if exited else ""),
    )


def reconnects(marks):
    """From the workers' logs since their marks: ({device: (when its first ask was answered
    again, after how many failed asks)}, devices whose asks failed and never came back,
    devices none of whose asks failed)."""
    answered, lost, busy = {}, [], []
    for name, (log, offset) in marks.items():
        text = log.read_text(errors="replace")[offset:]
        if found := ANSWERS_AGAIN.search(text):
            answered[name] = (log_time(found.group(1)), int(found.group(2)))
        elif ASK_FAILED in text:
            lost.append(name)
        else:
            busy.append(name)
    return answered, lost, busy


def fault_https_postgres_restart(soak):
    outage = soak.plan.postgres_outage_s
    finding = begin(
        "https-postgres-restart",
        f"restart PostgreSQL ({outage:g} s down) while HTTPS devices wait in asks",
    )
    stack, jobs = soak.stack, soak.https_jobs
    names = soak.start_https_workers()
    finding.jobs += jobs.noops(2 * len(names))  # every hub process has held asks: listens
    soak.settle(finding, https=True)
    time.sleep(1)  # every device back in an ask the hub holds
    marks = {name: log_mark(stack, name) for name in names}
    hub_log = stack.logs / "hub.log"
    hub_offset = hub_log.stat().st_size
    stack.postgres.stop("fast")
    time.sleep(outage)
    stack.postgres.start()
    back = time.monotonic()
    stack.wait_healthy(60)
    listeners = wait_for(listening, 60, "the hub's work listener to LISTEN again", 0.1)
    relistened = time.monotonic() - back
    lost_lines = hub_log.read_text(errors="replace")[hub_offset:].count(LISTENER_LOST)
    finding.say(
        f"stopped PostgreSQL (fast shutdown) for {outage:g} s with {len(names)} HTTPS devices "
        f"waiting in asks; the hub logged {LISTENER_LOST!r} {lost_lines} time(s) and "
        f"{listeners} listener(s) LISTENed again {relistened:.1f} s after it came back"
    )
    finding.check(
        "the hub's work listener notices the lost connection and LISTENs again",
        lost_lines and listeners,
        f"{lost_lines} lost, {listeners} listening again",
    )
    wait_came_back(marks)
    first_pickup(soak, finding)
    finding.jobs += jobs.noops(soak.plan.noops)
    soak.settle(finding, https=True)
    return soak.conclude(finding)


def listening():
    """How many connections of the hub LISTEN for news of work (just connected: a listener
    that has LISTENed for 30 s has sent its liveness check since, and is not counted)."""
    from django.db import connection

    def count():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE query = %s", [LISTEN_QUERY])
            return cursor.fetchone()[0]

    return db_retry(count)


def wait_came_back(marks, timeout=90):
    """Wait until every device whose ask failed since its mark has been answered since (a
    device backs off for up to a minute); False when one has not after `timeout` s."""
    try:
        return wait_for(lambda: all_came_back(marks), timeout, "the devices to ask again")
    except TimeoutError:
        return False


def all_came_back(marks):
    """True when every device whose ask failed since its mark has been answered since."""
    for log, offset in marks.values():
        text = log.read_text(errors="replace")[offset:]
        if ASK_FAILED in text and not ANSWERS_AGAIN.search(text):
            return False
    return True


def first_pickup(soak, finding):
    """Queue one job with every device waiting in an ask; say how soon one took it (an ask
    is held up to DEPLOYHUB_POLL_SECONDS: a pickup well within it was woken by the news)."""
    jobs = soak.https_jobs
    queued_at = time.monotonic()
    [job_id] = jobs.noops(1)
    finding.jobs.append(job_id)
    job = jobs.wait_running(job_id, 60, or_done=True)
    took = time.monotonic() - queued_at
    finding.measured["first_pickup_s"] = round(took, 2)
    finding.say(f"a job queued after the restart was taken by {job.device} {took:.2f} s later")


def fault_https_revoke(soak):
    finding = begin("https-revoke", "revoke an HTTPS device mid-job, and one waiting in an ask")
    soak.start_https_workers()
    revoke_mid_job(soak, finding)
    revoke_while_asking(soak, finding)
    soak.settle(finding, https=True)
    return soak.conclude(finding)


def revoke_mid_job(soak, finding):
    jobs = soak.https_jobs
    long_id = jobs.benchmark(2 * soak.plan.long_job_s)
    finding.jobs.append(long_id)
    victim = jobs.wait_running(long_id, 60, progressed=True).device
    status, revoked_at = revoke(soak, victim)
    moved = jobs.get(long_id)
    finding.jobs += jobs.noops(soak.plan.noops // 2)
    line = wait_refused(soak, victim.name)
    soak.settle(finding, [long_id], https=True)
    done = jobs.get(long_id)
    finding.say(
        f"revoked device {victim} (POST devices/{victim.pk}/revoke: {status}) while it ran "
        f"benchmark job {long_id}: the job was {moved.state} (attempt {moved.attempt}) at "
        f"once and {done.state} on {done.device} (attempt {done.attempt}); the worker: {line}"
    )
    finding.check(
        "a device revoked mid-job: its job is re-queued at once and finishes once on another",
        status == 200
        and moved.attempt == 2
        and done.state == "succeeded"
        and done.device_id != victim.pk,
        f"{done.state} on {done.device}, attempt {done.attempt}",
    )
    check_stopped(soak, finding, victim, revoked_at, line)


def revoke_while_asking(soak, finding):
    """The hub holds a device's ask for up to DEPLOYHUB_POLL_SECONDS: revoked meanwhile, it
    must not be given the jobs queued next."""
    from deployhub.devices.models import Device

    jobs = soak.https_jobs
    soak.settle(finding, https=True)
    time.sleep(1)  # every device in an ask the hub holds
    name = next(n for n in soak.https_devices if _running(soak.stack.https_workers.get(n)))
    victim = Device.objects.get(device_class=soak.world.https_class, name=name)
    status, revoked_at = revoke(soak, victim)
    finding.jobs += jobs.noops(soak.plan.noops // 2)
    line = wait_refused(soak, name)
    finding.say(
        f"revoked device {victim} (POST devices/{victim.pk}/revoke: {status}) while it waited "
        f"in an ask, then queued {soak.plan.noops // 2} no-op jobs; the worker: {line}"
    )
    check_stopped(soak, finding, victim, revoked_at, line)


def revoke(soak, device):
    """Revoke the device as its team's admin does (the API); return (status, revoked_at)."""
    url = f"{soak.stack.url}/api/v1/devices/{device.pk}/revoke"
    status, _, _ = http_json("POST", url, {}, token=soak.world.api_token)
    device.refresh_from_db()
    replace_revoked(soak, device.name)
    return status, device.revoked_at


def replace_revoked(soak, name):
    """A new HTTPS device of the class takes the revoked one's place for later faults."""
    number = len(HTTPS_DEVICES) + 1
    while f"h{number}" in soak.world.device_tokens:
        number += 1
    new = f"h{number}"
    add_device(soak.world, soak.world.https_class, new, HTTPS)
    soak.https_devices[soak.https_devices.index(name)] = new


def wait_refused(soak, name):
    """Wait for the revoked device's worker to exit; return the line it said, or what
    became of it."""
    process = soak.stack.https_workers[name]
    timeout = 60  # a held ask (up to DEPLOYHUB_POLL_SECONDS) or a job ends first
    try:
        process.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill9()
        return f"still running {timeout} s later: killed"
    said = [line for line in process.output().splitlines() if REFUSED_DEVICE in line]
    return f"exited {process.process.returncode}: {said[-1] if said else 'saying nothing'}"


def check_stopped(soak, finding, device, revoked_at, line):
    """The revoked device took nothing after its revocation and its worker exited, saying
    why."""
    from deployhub.teams.models import Event

    taken = Event.objects.filter(
        actor=f"device:{device.name}", verb="job.claimed", created_at__gt=revoked_at
    ).values_list("target_id", flat=True)
    finding.check(
        f"revoked device {device.name} is given no job and its worker exits, saying so",
        not taken and line.startswith("exited 2:") and REFUSED_DEVICE in line,
        f"jobs given after its revocation: {list(taken) or 'none'}; {line}",
    )


def log_mark(stack, name):
    """(log path, its length now): where a worker's log goes on from."""
    log = stack.logs / f"worker-{name}.log"
    return log, log.stat().st_size


def log_time(stamp):
    """The epoch seconds of a worker log line's time (logging's asctime, local time)."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _running(process):
    return process is not None and process.running


# Faults `make soak` runs that --short leaves out unless named (--only): make test runs
# --short, within its time. The PostgreSQL restart under HTTPS devices takes half a minute
# more than its fault shows on a small machine; a revoke mid-job and mid-ask is proven in
# make test by tests/test_enrolment.py, test_https_mode.py and test_worker_runner.py.
LONG_ONLY = ("https-postgres-restart", "https-revoke")
FAULTS = {
    "worker-kill": fault_worker_kill,
    "redis-restart": fault_redis_restart,
    "redis-outage": fault_redis_outage,
    "postgres-restart": fault_postgres_restart,
    "storage-full": fault_storage_full,
    "clock-skew": fault_clock_skew,
    "wrong-call-tokens": fault_wrong_call_tokens,
    "https-hub-restart": fault_https_hub_restart,
    "https-postgres-restart": fault_https_postgres_restart,
    "https-revoke": fault_https_revoke,
}


# ---------------------------------------------------------------- main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="fewer jobs, shorter outages")
    parser.add_argument(
        "--worker-python",
        default=sys.executable,
        help="Python of the hub and worker processes (make soak: .venv's)",
    )
    parser.add_argument(
        "--only",
        default="",
        help=f"comma-separated faults to run, of: {', '.join(FAULTS)} (default: all; "
        f"with --short all but {', '.join(LONG_ONLY)})",
    )
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--keep", action="store_true", help="keep the stack's folder (logs)")
    args = parser.parse_args(argv)
    if unknown := [name for name in args.only.split(",") if name and name not in FAULTS]:
        parser.error(f"no such fault: {', '.join(unknown)} (faults: {', '.join(FAULTS)})")
    return args


def summarise(findings, plan, seconds):
    totals = Counter()
    for finding in findings:
        for key in ("submitted", "finished", "lost", "run_twice", "orphans", "rerun_attempts"):
            totals[key] += finding.figures.get(key, 0)
    enough = totals["submitted"] >= plan.min_jobs
    passed = enough and all(f.ok for f in findings)
    print(
        f"\nTOTAL over {len(findings)} faults in {seconds:.0f} s: jobs submitted "
        f"{totals['submitted']}, finished {totals['finished']}, lost {totals['lost']}, run twice "
        f"{totals['run_twice']}, orphan files {totals['orphans']} (re-run attempts "
        f"{totals['rerun_attempts']})"
        + ("" if enough else f"; fewer than the {plan.min_jobs} jobs asked for")
    )
    print(f"SOAK {'PASSED' if passed else 'FAILED'}", flush=True)
    return passed, totals


def main(argv=None):
    args = parse_args(argv)
    plan = SHORT if args.short else FULL
    chosen = [name for name in args.only.split(",") if name]
    chosen = chosen or [n for n in FAULTS if not (args.short and n in LONG_ONLY)]
    folder = Path(tempfile.mkdtemp(prefix="deployhub-soak-"))
    stack = Stack(folder, args.worker_python, plan.lease_seconds)
    began, findings, passed = time.monotonic(), [], False
    print(f"soak: stack in {folder} ({'short' if args.short else 'full'} form)", flush=True)
    try:
        run_faults(stack, plan, chosen, findings)
        passed, _ = summarise(findings, plan, time.monotonic() - began)
    finally:
        stack.stop()
        if args.json:
            write_json(args.json, findings, passed, time.monotonic() - began)
        if passed and not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"soak: logs in {folder / 'logs'}")
    return 0 if passed else 1


def run_faults(stack, plan, chosen, findings):
    """Start the stack and its workers, then run the chosen faults; findings fill in as they end."""
    stack.start()
    configure_django(stack)
    soak = Soak(stack, make_world(), plan)
    soak.findings = findings
    soak.start_workers()
    where = "a tmpfs of its own" if stack.tmpfs else "a folder"
    print(
        f"soak: hub {stack.url}, PostgreSQL :{stack.postgres.port}, Redis :{stack.redis.port}, "
        f"storage on {where}",
        flush=True,
    )
    for name in chosen:
        began = time.monotonic()
        finding = FAULTS[name](soak)
        finding.seconds = round(time.monotonic() - began, 1)
        print(f"   ({name} took {finding.seconds:.0f} s)", flush=True)


def write_json(path, findings, passed, seconds):
    document = {
        "passed": passed,
        "seconds": round(seconds, 1),
        "faults": [
            {
                "name": f.name,
                "ok": f.ok,
                "skipped": f.skipped,
                "did": f.did,
                "checks": {k: list(v) for k, v in f.checks.items()},
                "measured": f.measured,
                "seconds": f.seconds,
                **{k: v for k, v in f.figures.items()},
            }
            for f in findings
        ],
    }
    Path(path).write_text(json.dumps(document, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
