"""The fault soak's world and its jobs: set up, submitted the hub's ways, counted.

scripts/soak.py drives the faults; this is what it drives them with. The driver's own
Django points at the soak's private stack (tests/soak_stack.py): it submits jobs as a
hub process does (the row, then the message on commit) and over the hub's HTTP API,
and counts what became of them and of the storage folder.
"""

import hashlib
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tests.private_services import wait_for
from tests.soak_stack import http_json

ROOT = Path(__file__).resolve().parent.parent
ASSET = ROOT / "deployhub" / "demo" / "assets" / "digits_cnn_v2.onnx"
CLASS_SLUG = "soak-cpu"
DEVICES = ("w1", "w2")
# A class whose devices take work over HTTPS only (POST device/work): no broker anywhere.
HTTPS_CLASS_SLUG = "soak-https"
HTTPS_DEVICES = ("h1", "h2", "h3", "h4")
SKEWED = {"ahead": 600, "behind": -600}  # device name -> clock offset in seconds
BUILD_BACKEND = "onnxruntime"  # the backend every CPU worker of `make run` has
BUILD_CONFIG = {"optimization_level": "all", "provider": "CPUExecutionProvider"}
# What the reaper writes in a job's log when its message was gone from the broker.
LOST_MESSAGE = "its message is not on the broker"

# ---------------------------------------------------------------- the driver's own Django


def configure_django(stack):
    """Point this process's Django at the stack's database, broker and storage."""
    for name, value in stack.env.items():
        if name.startswith(("DATABASE", "CELERY", "DEPLOYHUB", "SECRET", "DJANGO")):
            os.environ[name] = value
    import django

    django.setup()
    logging.getLogger("deployhub.jobs.actions").addFilter(UNPUBLISHED)


class Unpublished(logging.Filter):
    """Count this process's "could not publish job" warnings (the broker is down) instead of
    printing each: the reaper sends those jobs once it is back."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def filter(self, record):
        if record.getMessage().startswith("could not publish"):
            self.count += 1
            return False
        return True


UNPUBLISHED = Unpublished()


def db_retry(function, timeout=120):
    """Call function, retrying while the database is down (the driver shares its outage)."""
    from django.db import DatabaseError, connections

    deadline = time.monotonic() + timeout
    while True:
        try:
            return function()
        except DatabaseError:
            connections.close_all()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@dataclass
class World:
    """The soak's team, user, tokens, device classes, model version and devices."""

    team: object
    user: object
    api_token: str
    pipeline_token: str
    device_class: object
    model: object
    version: object
    device_tokens: dict
    https_class: object


def make_world():
    from django.contrib.auth import get_user_model
    from django.core.files import File

    from deployhub.devices.models import Delivery, DeviceClass
    from deployhub.registry.models import Model
    from deployhub.registry.uploads import create_version
    from deployhub.teams.models import Membership, Role, Team

    team = Team.objects.create(name="Soak", slug="soak")
    user = get_user_model().objects.create_user("alice", password="soak-password-1")
    Membership.objects.create(user=user, team=team, role=Role.ADMIN)
    api_token, pipeline_token = (issue_token(user, scope) for scope in ("full", "pipeline"))
    device_class = DeviceClass.objects.create(
        team=team, slug=CLASS_SLUG, name="Soak CPU", frame_budget_ms=33.3
    )
    model = Model.objects.create(team=team, name="digits-cnn", created_by=user)
    with open(ASSET, "rb") as handle:
        version = create_version(model, File(handle, name=ASSET.name), user)
    https_class = DeviceClass.objects.create(
        team=team, slug=HTTPS_CLASS_SLUG, name="Soak HTTPS", frame_budget_ms=33.3
    )
    tokens = {}
    world = World(
        team, user, api_token, pipeline_token, device_class, model, version, tokens, https_class
    )
    for name in (*DEVICES, *SKEWED):
        add_device(world, device_class, name)
    for name in HTTPS_DEVICES:
        add_device(world, https_class, name, Delivery.HTTPS)
    return world


def add_device(world, device_class, name, delivery=None):
    """Register a device of the class (as enrolling one does); keep its token in the world.

    An HTTPS class's devices are registered as taking work over HTTPS from the start, as
    an enrolled device is: no job of that class ever waits on the broker for one of them.
    """
    from deployhub.devices.models import Device

    device = Device(device_class=device_class, name=name)
    if delivery:
        device.delivery = delivery
    world.device_tokens[name] = device.issue_token()
    device.save()
    return device


def issue_token(user, scope):
    """Issue the user a personal API token of this scope; return it."""
    from deployhub.teams.models import ApiToken

    record = ApiToken(user=user, name=f"soak {scope}", scope=scope)
    token = record.issue()
    record.save()
    return token


# ---------------------------------------------------------------- jobs


class Jobs:
    """Submit jobs the ways the hub does, and read what became of them.

    Jobs go to the world's broker class, or to `device_class` when given (the HTTPS one).
    """

    def __init__(self, stack, world, device_class=None):
        self.stack, self.world = stack, world
        self.device_class = device_class or world.device_class

    def noops(self, count):
        """Queue no-op jobs from this process (a hub process: it commits, then publishes)."""
        from deployhub.jobs.actions import submit_job
        from deployhub.jobs.models import JobKind

        return [self._submit(submit_job, JobKind.NOOP).pk for _ in range(count)]

    def _submit(self, submit_job, kind, params=None):
        world = self.world
        return submit_job(
            team=world.team,
            kind=kind,
            device_class=self.device_class,
            user=world.user,
            model_version=world.version,
            params=params or {},
        )

    def benchmark(self, seconds=None):
        """Queue a benchmark from this process: a short one, or one that runs `seconds`."""
        from deployhub.jobs.actions import submit_job
        from deployhub.jobs.models import JobKind

        params = {"iterations": 20, "warmup_iterations": 2}
        if seconds:
            params = {"duration_s": seconds, "warmup_s": 0.2}
        return self._submit(submit_job, JobKind.BENCHMARK, params).pk

    def compile(self):
        """Queue a compile of the demo model (each builds; an identical engine is kept once)."""
        from deployhub.engines.actions import canonical_config
        from deployhub.jobs.actions import submit_job
        from deployhub.jobs.models import JobKind

        config = canonical_config(BUILD_BACKEND, BUILD_CONFIG)
        params = {"backend": BUILD_BACKEND, "build_config": config}
        return self._submit(submit_job, JobKind.COMPILE, params).pk

    def benchmark_by_api(self):
        """Ask the hub for a short benchmark over HTTP; return (job id or None, the answer)."""
        url = f"{self.stack.url}/api/v1/versions/{self.world.version.pk}/benchmarks"
        body = {"device_class": CLASS_SLUG, "iterations": 20, "warmup_iterations": 2}
        answer = http_json("POST", url, body, token=self.world.api_token)
        status, found = answer[0], answer[1]
        job_id = found.get("job", {}).get("id") if status == 202 else None
        return job_id, answer

    def get(self, job_id):
        from deployhub.jobs.models import Job

        return db_retry(lambda: Job.objects.select_related("device").get(pk=job_id))

    def wait_running(self, job_id, timeout, progressed=False, or_done=False):
        """Wait until the job runs on a device (with progress > 0 when asked), or has run
        (when or_done); return it."""

        def running():
            job = self.get(job_id)
            moved = job.progress > 0 or not progressed
            runs = job.state == "running" and job.device and moved
            return job if runs or (or_done and job.is_final) else None

        return wait_for(running, timeout, f"job {job_id} to run", interval=0.05)

    def states(self, job_ids):
        from deployhub.jobs.models import Job

        rows = db_retry(lambda: list(Job.objects.filter(pk__in=job_ids).values_list("state")))
        return Counter(state for (state,) in rows)


# ---------------------------------------------------------------- counting


FINAL_VERBS = (
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.reaped.failed",
    "job.reaped.cancelled",
)


def outcome(job_ids, expected_failures=()):
    """Count what became of these jobs: finished, lost, run twice, re-run."""
    from deployhub.benchmarks.models import BenchmarkRun
    from deployhub.jobs.models import Job
    from deployhub.teams.models import Event

    jobs = list(Job.objects.filter(pk__in=job_ids))
    states = Counter(job.state for job in jobs)
    finals = Event.objects.filter(target_type="job", target_id__in=job_ids, verb__in=FINAL_VERBS)
    per_job = Counter(finals.values_list("target_id", flat=True))
    failed = [job for job in jobs if job.state == "failed" and job.pk not in expected_failures]
    benchmarks = [job.pk for job in jobs if job.kind == "benchmark" and job.state == "succeeded"]
    stored = set(
        BenchmarkRun.objects.filter(job_id__in=benchmarks).values_list("job_id", flat=True)
    )
    final = sum(states[s] for s in ("succeeded", "failed", "cancelled"))
    return {
        "submitted": len(job_ids),
        "finished": final,
        "succeeded": states["succeeded"],
        "failed": states["failed"],
        "cancelled": states["cancelled"],
        "lost": len(job_ids) - final,
        "run_twice": sum(1 for count in per_job.values() if count > 1),
        "rerun_attempts": sum(job.attempt - 1 for job in jobs),
        "sent_again": sum(LOST_MESSAGE in job.log for job in jobs),
        "results_missing": len(set(benchmarks) - stored),
        "failed_unexpectedly": len(failed),
        "failures": sorted({job.error[:160] for job in failed})[:5],
    }


def storage_audit(root):
    """Compare the storage folder with the rows naming its files."""
    from django.apps import apps
    from django.db import models

    referenced = set()
    for model in apps.get_models():
        for each in model._meta.get_fields():
            if isinstance(each, models.FileField):
                names = model.objects.exclude(**{each.name: ""}).values_list(each.name, flat=True)
                referenced.update(names)
    root = Path(root)
    stored = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    temporary = {name for name in stored if name.startswith("tmp/")}
    stored -= temporary
    return {
        "files_without_rows": sorted(stored - referenced),
        "rows_without_files": sorted(referenced - stored),
        "half_written": sorted(temporary),
    }


class Load:
    """Background HTTP traffic during an outage: uploads, submissions, probes."""

    def __init__(self, soak):
        self.soak = soak
        self.stop = threading.Event()
        self.uploads = []  # acknowledged: (version id, sha256)
        self.submitted = []  # acknowledged benchmark job ids
        self.answers = Counter()  # (endpoint, status) -> count
        self.bad = []  # 503s without a JSON error or Retry-After, and every 500
        self.threads = [
            threading.Thread(target=t, daemon=True)
            for t in (self.upload_loop, self.submit_loop, self.probe_loop)
        ]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)

    def upload_loop(self):

        import onnx

        base = onnx.load(ASSET)
        number = 0
        while not self.stop.is_set():
            number += 1
            base.doc_string = f"soak upload {number} {time.time()}"
            content = base.SerializeToString()
            url = f"{self.soak.stack.url}/api/v1/models/{self.soak.world.model.pk}/versions"
            files = {"file": (f"digits-{number}.onnx", content)}
            status, body, headers = http_json(
                "POST", url, token=self.soak.world.api_token, files=files, timeout=60
            )
            self.note("upload", status, body, headers)
            if status == 201:
                self.uploads.append((body["id"], hashlib.sha256(content).hexdigest()))
            else:
                self.stop.wait(0.2)

    def submit_loop(self):
        while not self.stop.wait(0.2):
            job_id, answer = self.soak.jobs.benchmark_by_api()
            self.note("submit", *answer)
            if job_id:
                self.submitted.append(job_id)

    def probe_loop(self):
        stack, world = self.soak.stack, self.soak.world
        token = world.device_tokens[DEVICES[0]]
        while not self.stop.wait(0.1):
            status, body, headers = http_json("GET", f"{stack.url}/api/v1/device", token=token)
            self.note("device", status, body, headers)
            status, body, headers = http_json(
                "GET", f"{stack.url}/api/v1/models", token=world.api_token
            )
            self.note("models", status, body, headers)

    def note(self, endpoint, status, body, headers):
        self.answers[(endpoint, status)] += 1
        if status == 503 and not (isinstance(body, dict) and body.get("error")):
            self.bad.append(f"{endpoint} 503 without a JSON error: {str(body)[:80]}")
        elif status == 503 and not headers.get("Retry-After"):
            self.bad.append(f"{endpoint} 503 without Retry-After")
        elif status is not None and status >= 500 and status != 503:
            self.bad.append(f"{endpoint} {status}: {str(body)[:120]}")
