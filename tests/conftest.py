"""The shared cast and the real moving parts: a live hub, worker processes, Redis."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import caches
from django.core.files import File
from django.db import connections
from django.test.utils import override_settings

from deployhub.devices.models import Device, DeviceClass
from deployhub.engines.models import Engine
from deployhub.jobs.models import FAILURE_CATEGORIES, Job, JobKind
from deployhub.registry.models import Model
from deployhub.registry.uploads import create_version
from deployhub.teams.models import Membership, Role, Team

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "deployhub" / "demo" / "assets"
PASSWORD = "correct horse battery"
# Where the browser tests leave their screenshots.
ARTIFACTS = ROOT / "test-artifacts"


# Files that run longest (make test's --durations), started first in this order: under
# pytest-xdist (--dist loadfile) each process takes the next file when it is free, so a long
# file handed out last would run on alone. The other files follow, those with most
# e2e tests (real workers, a live server, Chromium) first, then those with most tests.
LONGEST_FIRST = (
    "test_conformance.py",
    "test_soak_short.py",
    "test_fuzz_api.py",
    "test_pipeline_gate.py",
    "test_schemathesis.py",  # one test, no e2e mark: else handed out among the last
)
# Fixtures that reach a service (PostgreSQL, Redis, a live server, worker processes, Chromium).
# A test needs services when it uses one, even through another fixture (alice needs db).
SERVICE_FIXTURES = {
    "db",
    "transactional_db",
    "django_db_setup",
    "live_server",
    "broker",
    "start_worker",
    "browser",
}


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "services: needs PostgreSQL, Redis, a live server, workers or Chromium (set in "
        "tests/conftest.py from fixtures and marks; make test-fast runs the rest)",
    )
    # pytest-xdist hands out files in the order they are collected (below), not sorted by
    # how many tests each holds, as it does by default: the soak's 3 tests and the gate's 1
    # came near the end.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def needs_services(item):
    """Tell whether a test needs a service: by its django_db or e2e mark, or a fixture it uses."""
    marked = item.get_closest_marker("django_db") or item.get_closest_marker("e2e")
    return bool(marked) or not SERVICE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items):
    """Mark the tests that need services (before `-m` selects on the mark); then, after the
    other plugins' sorts (pytest-django's puts a file's database tests first), put the
    longest files first, each file's tests together in the order they were put in."""
    for item in items:
        if needs_services(item):
            item.add_marker(pytest.mark.services)
    yield
    tests, e2e = Counter(), Counter()
    for item in items:
        tests[item.path] += 1
        e2e[item.path] += bool(item.get_closest_marker("e2e"))

    def longest_first(item):
        name = item.path.name
        known = LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
        return known, -e2e[item.path], -tests[item.path], str(item.path)

    items.sort(key=longest_first)


@pytest.fixture(scope="session", autouse=True)
def quick_password_hashing():
    """Hash the cast's passwords with MD5 in tests: PBKDF2's million rounds take half a
    second per user and per login on a 2-core machine, minutes over the suite. The
    product keeps Django's default hashers; nothing here tests hashing itself."""
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture(scope="session", autouse=True)
def empty_test_broker(request):
    """Start from an empty broker database: a message left by an earlier run is not ours.

    A run of tests that need no services (make test-fast) leaves Redis alone.
    """
    if not any(item.get_closest_marker("services") for item in request.session.items):
        return
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=3)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:
        pytest.exit(f"Redis at {settings.CELERY_BROKER_URL} is not reachable: {exc}", returncode=1)


@pytest.fixture(scope="session", autouse=True)
def work_listener_ends_before_the_test_database(request):
    """The hub's work listener (deployhub/jobs/waiting.py) holds a connection of its own:
    it ends before the test database is dropped (set up first, so torn down after this)."""
    if not any(item.get_closest_marker("services") for item in request.session.items):
        yield
        return
    request.getfixturevalue("django_db_setup")
    yield
    from deployhub.jobs.waiting import WAITERS

    WAITERS.stop_listening()


@pytest.fixture(autouse=True)
def empty_results_cache():
    """Start each test with no results JSON kept (benchmarks/exports.py): a rolled-back test
    database hands out its ids again, and a kept body is per process, not per test."""
    caches["results"].clear()


@pytest.fixture(autouse=True)
def storage_root(settings, tmp_path):
    """Give every test an empty storage root, so it can check exactly what was stored."""
    root = tmp_path / "storage"
    (root / "tmp").mkdir(parents=True)
    settings.STORAGE_ROOT = settings.MEDIA_ROOT = root
    settings.FILE_UPLOAD_TEMP_DIR = root / "tmp"
    return root


def make_user(username, team, role):
    user = get_user_model().objects.create_user(username, password=PASSWORD)
    Membership.objects.create(user=user, team=team, role=role)
    return user


@pytest.fixture
def demo_team(db):
    return Team.objects.create(name="Demo", slug="demo")


@pytest.fixture
def alice(demo_team):
    """Alice owns things: admin of the demo team."""
    return make_user("alice", demo_team, Role.ADMIN)


@pytest.fixture
def bob(demo_team):
    """Bob reviews: reviewer in the demo team."""
    return make_user("bob", demo_team, Role.REVIEWER)


@pytest.fixture
def vera(demo_team):
    """Vera only looks: viewer in the demo team."""
    return make_user("vera", demo_team, Role.VIEWER)


@pytest.fixture
def charlie(db):
    """Charlie is on another team."""
    acme = Team.objects.create(name="Acme Robotics", slug="acme")
    return make_user("charlie", acme, Role.ADMIN)


@pytest.fixture
def model_file():
    return ASSETS / "digits_cnn_v2.onnx"


@pytest.fixture
def version(alice, demo_team, model_file):
    model = Model.objects.create(team=demo_team, name="digits-cnn", created_by=alice)
    with open(model_file, "rb") as handle:
        return create_version(model, File(handle, name="digits_cnn_v2.onnx"), alice)


@pytest.fixture
def device_class(demo_team):
    """A class with a queue of its own, so tests never see each other's messages."""
    return DeviceClass.objects.create(
        team=demo_team, slug=f"cpu-{uuid.uuid4().hex[:8]}", name="Test CPU", frame_budget_ms=33.3
    )


@pytest.fixture
def make_device(device_class):
    """Register a device of the class and return (device, token)."""

    def make(name=None, cls=None):
        device = Device(
            device_class=cls or device_class, name=name or f"dev-{uuid.uuid4().hex[:6]}"
        )
        token = device.issue_token()
        device.save()
        return device, token

    return make


@pytest.fixture
def broker():
    """The real Redis the hub and workers share in tests."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.ping()
    return client


class WorkerProcess:
    """A real `deployhub-worker run` process, with its output kept for failure reports."""

    def __init__(self, hub_url, token, log_path, env=None, python=None, mode="broker"):
        self.log_path = log_path
        self.log = open(log_path, "wb")
        command = [str(python or sys.executable), "-m", "workers", "run", "--hub", hub_url]
        command += ["--token", token]
        # HTTPS mode: no broker URL anywhere in its environment, as an enrolled device.
        command += ["--broker", settings.CELERY_BROKER_URL] if mode == "broker" else []
        env = {**(env or {}), "CELERY_BROKER_URL": ""} if mode == "https" else env
        self.process = subprocess.Popen(
            command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )

    def output(self):
        return Path(self.log_path).read_text(errors="replace")

    def kill9(self):
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill9()
        self.log.close()


def hub_started_with(code, **env):
    """Start the hub's settings in this environment, run code after django.setup() (json
    imported), and return the finished process: a setting's value, or its refusal."""
    return subprocess.run(
        [sys.executable, "-c", f"import json, django; django.setup(); {code}"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "deployhub.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def run_on_sqlite(module, tmp_path):
    """Run `python -m module` as make run has the hub (a fresh SQLite file, its own var and
    storage folders) and return the JSON it prints."""
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'deployhub.sqlite3'}",
        "DEPLOYHUB_VAR_DIR": str(tmp_path),
        "DEPLOYHUB_STORAGE_ROOT": str(tmp_path / "media"),
        "DJANGO_SETTINGS_MODULE": "deployhub.settings",
    }
    result = subprocess.run(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def run_python():
    """Return the interpreter of make run's environment; fail when it is not built."""
    path = Path(os.environ.get("DEPLOYHUB_RUN_PYTHON") or ".venv/bin/python")
    path = path if path.is_absolute() else ROOT / path
    if not path.exists():
        pytest.fail(f"make run's environment is not built ({path} is missing): make test builds it")
    return path


def job_finished(job, worker, timeout=120):
    """Wait for a job to end (any final state); return it, or fail with the worker's output."""
    return wait_until(
        lambda: (j := Job.objects.get(pk=job.pk)).is_final and j,
        timeout,
        f"job {job.pk} to finish",
        on_timeout=worker.output,
    )


def wait_until(predicate, timeout, what, interval=0.1, on_timeout=lambda: ""):
    """Poll `predicate` until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout} s waiting for {what}\n{on_timeout()}")


def worker_ready(worker, device):
    """Wait until the worker has heartbeated and says it is ready for work; return it."""
    wait_until(
        lambda: Device.objects.get(pk=device.pk).last_heartbeat_at,
        timeout=60,
        what=f"worker {device.name} to heartbeat",
        on_timeout=worker.output,
    )
    wait_until(
        lambda: "ready" in worker.output(),
        timeout=60,
        what=f"worker {device.name} to be ready for work",
        on_timeout=worker.output,
    )
    return worker


@pytest.fixture
def start_worker(live_server, tmp_path):
    """Start real worker processes against the live hub; stop them after the test.

    python is the interpreter the worker runs under: this one unless a test names
    another (tests/test_default_install.py runs `make run`'s environment).
    """
    started = []

    def start(device, token, env=None, python=None, mode="broker", ready=True):
        """ready=False: answer at once (workers started side by side load their backends
        at the same time); worker_ready(worker, device) waits."""
        log = tmp_path / f"worker-{device.name}.log"
        worker = WorkerProcess(live_server.url, token, log, env, python, mode)
        started.append(worker)
        return worker_ready(worker, device) if ready else worker

    yield start
    for worker in started:
        worker.stop()


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def browser():
    """Launch Debian's headless Chromium for a test, through Playwright (imported only here)."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is required: `make test` installs it"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        # ORM calls made while Playwright's loop runs keep their connection in that context.
        connections.close_all()
        browser.close()


@pytest.fixture
def job(version, device_class, alice):
    """A queued benchmark of the version on the test device class."""
    return queued_benchmark(version, device_class, alice, iterations=50)


def queued_benchmark(version, device_class, user, **params):
    """Queue a benchmark of the version on the class, as its user asks for one (params: the
    job's; 20 iterations when none are given)."""
    from deployhub.jobs.actions import submit_job

    return submit_job(
        team=version.team,
        kind=JobKind.BENCHMARK,
        device_class=device_class,
        user=user,
        model_version=version,
        params=params or {"iterations": 20},
    )


def stored_engine(version, device_class, build_config=None, backend="onnxruntime", digest=None):
    """Create an engine row as a compile leaves it, for tests that need the row, not its file."""
    return Engine.objects.create(
        model_version=version,
        device_class=device_class,
        backend=backend,
        build_config=build_config or {"provider": "CPUExecutionProvider"},
        config_digest=digest or f"digest-{Engine.objects.count()}",
        compat_key=f"{backend}:test",
        file="engines/test.onnx",
        sha256="0" * 64,
        size=1,
        signature="00",
    )


def category_sent_with(error):
    """Return the category a worker sends with an error it wrote as "<category>: ...", or ""."""
    head = error.split(":", 1)[0]
    return head if head in FAILURE_CATEGORIES else ""
