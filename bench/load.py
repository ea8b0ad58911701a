"""Bench rows of the hub under load: browser-like users and heartbeating devices.

Users are threads, each with a signed-in session of its own (made in the database, as a
sign-in would leave it: signing in 50 times would time PBKDF2, not the hub). Each one
views, reading THINK_S seconds between views, the models list, a version page, the model's
results JSON and the model page with its figure JSON (fetched right after the page, as
the page's script does), and now and then uploads a small ONNX model through the API.
Devices heartbeat at a fixed total rate, open loop, from a process of their own: each
beat's latency counts from when it was due, so a hub that falls behind shows it.
Everything runs for WARMUP_S, unrecorded, then SECONDS recorded. Any 5xx or unanswered
request is an error.

Both stacks get the same data: the demo (seed_demo) plus RESULTS benchmark runs of its
model over 3 device classes (tests/figure_results.py).
"""

import collections
import http.client
import json
import random
import select
import statistics
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.rows import note, row
from bench.stack import percentile

ROOT = Path(__file__).resolve().parent.parent
USERS, EMBEDDED_USERS = 50, 20
SECONDS, WARMUP_S = 60, 10
HEARTBEATS_PER_S, DEVICES = 100, 200  # each simulated device beats every 2 s
THINK_S = (5.0, 15.0)  # between two views of a user, uniformly: a person reading a page
UPLOAD_CHANCE = 0.03  # of a view being an upload instead: about one every 7 s over 50 users
RESULTS, ACCURACIES = 1000, 200
UPLOAD = ROOT / "deployhub" / "demo" / "assets" / "digits_cnn_v1.onnx"
# Targets: a page a person waits for within 2 s even at p99 (make run's hub first measured
# 2 s at p99 with 20 users); a heartbeat well inside its 10 s interval and the job lease,
# 100 ms at p99; the web processes' memory flat over a minute, within 100 MB summed over the
# gunicorn workers.
PAGE_P99_MS, HEARTBEAT_P99_MS, RSS_GROWTH_MB = 2000, 100, 100
# make run as first measured: p50 400 ms, p99 2 s, the version page p50 1 s, with 20 users.
EMBEDDED_P50_MS, EMBEDDED_P99_MS, EMBEDDED_VERSION_P50_MS = 400, 2000, 1000


def prepare(users, devices):
    """Seed the data and the callers; return what the load needs, as JSON-able dict.

    Runs where Django is set up on the hub's database: in the bench process for the
    scaled-out stack, in `manage.py shell` for the embedded one.
    """
    from django.core.management import call_command

    from deployhub.registry.models import Model
    from deployhub.teams.models import Team

    call_command("seed_demo", verbosity=0)
    team = Team.objects.get(slug="demo")
    model = Model.objects.filter(team=team).order_by("pk").first()
    seed_results(team, model)
    return {
        "model": model.pk,
        "version": model.latest_version().pk,
        "sessions": [session_for(user) for user in load_users(team, users)],
        "token": api_token(team),
        "devices": device_tokens(team, devices),
    }


def prepare_json(users, devices):
    """Print prepare()'s answer as one line of JSON (from `manage.py shell`)."""
    print(json.dumps(prepare(users, devices)))


def seed_results(team, model):
    from tests.figure_results import seed_classes, seed_engines, seed_runs

    engines = seed_engines(list(model.versions.all()), seed_classes(team, prefix="load"))
    seed_runs(engines, RESULTS, ACCURACIES)


def load_users(team, count):
    """Engineers of the team, with no usable password (they never sign in by form)."""
    from django.contrib.auth import get_user_model

    from deployhub.teams.models import Membership, Role

    users = []
    for number in range(count):
        user = get_user_model().objects.create_user(f"load-{number}")
        Membership.objects.create(user=user, team=team, role=Role.ENGINEER)
        users.append(user)
    return users


def session_for(user):
    """Return the key of a signed-in session of the user, as the login view leaves one."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return session.session_key


def api_token(team):
    """A personal API token of the team's admin (alice), for the uploads."""
    from deployhub.teams.models import ApiToken, Membership, Role

    admin = Membership.objects.filter(team=team, role=Role.ADMIN).first().user
    record = ApiToken(user=admin, name="load bench")
    token = record.issue()
    record.save()
    return token


def device_tokens(team, count):
    """Register count devices in a class of their own; return their tokens."""
    from bench.stack import add_devices
    from deployhub.devices.models import DeviceClass

    device_class = DeviceClass.objects.create(team=team, slug="load-fleet", name="Load fleet")
    return [token for _, token in add_devices(device_class, count)]


class Recorder:
    """Latencies by kind and answers by status, of the requests made inside the window."""

    def __init__(self, start, end):
        self.start, self.end = start, end
        self.latencies = collections.defaultdict(list)
        self.statuses = collections.Counter()
        self.failures = []
        self.lock = threading.Lock()

    def add(self, kind, started, latency, status, detail=""):
        if not self.start <= started < self.end:
            return
        with self.lock:
            self.latencies[kind].append(latency * 1000)
            self.statuses[status] += 1
            if is_error(status) and len(self.failures) < 5:
                self.failures.append(f"{kind}: {status} {detail}"[:300])

    def merge(self, other):
        """Add what another recorder (the heartbeat process's) recorded."""
        for kind, values in other.latencies.items():
            self.latencies[kind].extend(values)
        self.statuses.update(other.statuses)
        self.failures.extend(other.failures[: max(0, 5 - len(self.failures))])

    def __getstate__(self):
        return {key: value for key, value in self.__dict__.items() if key != "lock"}

    def __setstate__(self, state):
        self.__dict__.update(state, lock=threading.Lock())

    def errors(self):
        return sum(count for status, count in self.statuses.items() if is_error(status))

    def pages(self):
        return [ms for kind, values in self.latencies.items() if kind in VIEWS for ms in values]


def is_error(status):
    return not isinstance(status, int) or status >= 500


class Client:
    """One keep-alive HTTP/1.1 connection to the hub, as a browser tab or a device keeps.

    http.client, not requests: the load generator shares the hub's cores, and requests cost
    it almost four times the CPU per call (a heartbeat: 1.8 ms against 0.5 ms, measured here).
    A kept connection the server has closed is opened anew before it is used; a request is
    sent once, and any failure is its answer.
    """

    def __init__(self, url, headers=None):
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname, parts.port
        self.headers = headers or {}
        self.connection = None

    def request(self, method, path, body=None, headers=None):
        """Return (status, body bytes)."""
        if self.connection is not None and self._closed_by_server():
            self.close()
        if self.connection is None:
            self.connection = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            self.connection.request(
                method, path, body=body, headers={**self.headers, **(headers or {})}
            )
            response = self.connection.getresponse()
            return response.status, response.read()
        except (http.client.HTTPException, OSError):
            self.close()
            raise

    def _closed_by_server(self):
        """An idle kept connection with something to read has been closed (or broken)."""
        sock = self.connection.sock
        return sock is None or bool(select.select([sock], [], [], 0)[0])

    def close(self):
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def send(client, recorder, kind, method, path, started=None, **kwargs):
    """Make one request and record it; started: when it was due (now when None)."""
    started = time.monotonic() if started is None else started
    try:
        status, body = client.request(method, path, **kwargs)
        detail = body[:200].decode(errors="replace") if status >= 500 else ""
    except (http.client.HTTPException, OSError) as error:
        status, detail = type(error).__name__, str(error)
    recorder.add(kind, started, time.monotonic() - started, status, detail)


# A view: what a browser fetches for it, one after the other.
VIEWS = {
    "models list": ["/models/"],
    "version page": ["/versions/{version}/"],
    "results JSON": ["/models/{model}/results.json"],
    "model page": ["/models/{model}/"],
    "figure JSON": ["/models/{model}/tradeoffs.json"],
}
PAGE_SEQUENCE = [["models list"], ["version page"], ["results JSON"], ["model page", "figure JSON"]]


def user_loop(url, data, session_key, recorder, stop, seed):
    """Browse until stop is set: one view of the sequence after another, thinking between."""
    rng = random.Random(seed)
    session = Client(url, headers={"Cookie": f"sessionid={session_key}"})
    stop.wait(rng.uniform(0, THINK_S[1]))  # users arrive spread out, not all at once
    step = rng.randrange(len(PAGE_SEQUENCE))
    while not stop.is_set():
        if rng.random() < UPLOAD_CHANCE:
            upload(session, data, recorder)
        else:
            for kind in PAGE_SEQUENCE[step % len(PAGE_SEQUENCE)]:
                send(session, recorder, kind, "GET", VIEWS[kind][0].format(**data))
            step += 1
        stop.wait(rng.uniform(*THINK_S))


def upload(session, data, recorder):
    """Upload the small demo model as a new version (its doc string made unique, so the hub
    stores and checks it instead of answering that the same file is there already)."""
    import uuid

    import onnx
    from urllib3 import encode_multipart_formdata

    model = onnx.load(str(UPLOAD))
    model.doc_string = f"load bench {uuid.uuid4()}"
    fields = {"file": (UPLOAD.name, model.SerializeToString()), "notes": "load bench"}
    body, content_type = encode_multipart_formdata(fields)
    headers = {"Authorization": f"Bearer {data['token']}", "Content-Type": content_type}
    path = f"/api/v1/models/{data['model']}/versions"
    send(session, recorder, "upload", "POST", path, body=body, headers=headers)


def heartbeats(url, tokens, fingerprint, recorder, stop):
    """Send device heartbeats at HEARTBEATS_PER_S in all, each due at its time, until stop."""
    local = threading.local()
    body = json.dumps({"fingerprint": fingerprint}).encode()

    def beat(token, due):
        if not hasattr(local, "client"):
            local.client = Client(url, headers={"Content-Type": "application/json"})
        headers = {"Authorization": f"Bearer {token}"}
        path = "/api/v1/device/heartbeat"
        send(local.client, recorder, "heartbeat", "POST", path, due, body=body, headers=headers)

    with ThreadPoolExecutor(max_workers=32) as pool:
        due, number = time.monotonic(), 0
        while not stop.is_set():
            pool.submit(beat, tokens[number % len(tokens)], due)
            number += 1
            due += 1 / HEARTBEATS_PER_S
            stop.wait(max(0.0, due - time.monotonic()))


class RSSMeter:
    """Sum the resident memory of some processes, now and at its peak."""

    def __init__(self, pids):
        import psutil

        self.processes = [psutil.Process(pid) for pid in pids]
        self.baseline = self.peak = self.now()

    def now(self):
        return sum(p.memory_info().rss for p in self.processes) / 1024**2

    def sample(self):
        self.peak = max(self.peak, self.now())


def device_fleet(url, tokens, window, answer):
    """The devices, in a process of their own: the users' threads (parsing pages of up to
    2 MB) would otherwise hold the interpreter lock while a heartbeat's answer waits to be
    timed. Beat until the window ends; send the recorder back through answer (a Pipe end)."""
    from workers import fingerprint

    recorder = Recorder(*window)
    stop = threading.Event()
    threading.Timer(max(0.0, window[1] - time.monotonic()), stop.set).start()
    heartbeats(url, tokens, fingerprint.collect(), recorder, stop)
    answer.send(recorder)


def run_load(url, data, users, web_pids, device_url=None):
    """Run the users and the heartbeats for WARMUP_S + SECONDS; return (recorder, RSS meter)."""
    import multiprocessing

    from django.db import connections

    started = time.monotonic()
    cpu_before = generator_cpu_s()
    recorder = Recorder(started + WARMUP_S, started + WARMUP_S + SECONDS)
    # Forked before this process starts its users' threads, with no database connection to
    # share (the child never uses one). CLOCK_MONOTONIC is the machine's, so both processes
    # time the same window.
    connections.close_all()
    fork = multiprocessing.get_context("fork")
    answer, sender = fork.Pipe(duplex=False)
    window = (recorder.start, recorder.end)
    devices = fork.Process(
        target=device_fleet, args=(device_url or url, data["devices"], window, sender)
    )
    devices.start()
    stop = threading.Event()
    threads = [
        threading.Thread(target=user_loop, args=(url, data, key, recorder, stop, n), daemon=True)
        for n, key in enumerate(data["sessions"][:users])
    ]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, recorder.start - time.monotonic()))
    meter = RSSMeter(web_pids())
    while time.monotonic() < recorder.end:
        time.sleep(0.5)
        meter.sample()
    meter.end = meter.now()
    stop.set()
    for thread in threads:
        thread.join(timeout=90)
    if answer.poll(90):
        recorder.merge(answer.recv())
    else:
        recorder.statuses["heartbeat process sent nothing"] += 1
    devices.join(timeout=30)
    recorder.generator_cpu_s = generator_cpu_s() - cpu_before
    recorder.wall_s = time.monotonic() - started
    return recorder, meter


def generator_cpu_s():
    """CPU seconds of this process and its waited-for children (the devices' process)."""
    import resource

    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


def generator_note(label, recorder):
    """What the load generator itself took of the machine the hub shares."""
    share = recorder.generator_cpu_s / recorder.wall_s * 100
    return note(
        f"{label}: the load generator's own CPU (users and devices), % of one core "
        f"({recorder.generator_cpu_s:.0f} s over {recorder.wall_s:.0f} s)",
        share,
        "%",
        "INFO",
    )


def statuses_text(recorder):
    return ", ".join(
        f"{status}×{count}" for status, count in sorted(recorder.statuses.items(), key=str)
    )


def error_row(label, recorder):
    if recorder.failures:
        print("bench: load errors:\n  " + "\n  ".join(recorder.failures), flush=True)
    requests_ = sum(recorder.statuses.values())
    name = f"{label}: errors (5xx, no answer) of {requests_} requests ({statuses_text(recorder)})"
    return row(name, recorder.errors(), "", 0)


def latency_rows(label, what, values, target_p99):
    """A note with the p50 and a row with the p99 of some latencies."""
    if not values:
        return [note(f"{label}: {what}", None, "ms", "MISS", "none answered")]
    return [
        note(
            f"{label}: {what} p50 ({len(values)} requests)", statistics.median(values), "ms", "INFO"
        ),
        row(f"{label}: {what} p99", percentile(values, 99), "ms", target_p99),
    ]


def view_notes(label, recorder):
    """A note per view: where the page views' p99 comes from."""
    return [
        note(
            f"{label}:   {kind}, p99 (p50 {statistics.median(values):.0f} ms)",
            percentile(values, 99),
            "ms",
            "INFO",
        )
        for kind in VIEWS
        if (values := recorder.latencies[kind])
    ]


def bench_load():
    """Rows: the scaled-out stack (gunicorn, PostgreSQL, Redis, hub worker, 2 device workers)
    under 50 users and 100 heartbeats/s for 60 s."""
    from bench.stack import GUNICORN, Stack, add_devices, setup_fleet_for
    from deployhub.teams.models import Team

    data = prepare(USERS, DEVICES)
    _, _, device_class, device, token = setup_fleet_for(Team.objects.get(slug="demo"))
    more = add_devices(device_class, 1, start=2)
    stack = Stack(token, device, more=more, hub_worker=True)
    try:
        recorder, meter = run_load(
            stack.url, data, USERS, lambda: stack.web_pids, device_url=stack.device_url
        )
        web_nice = stack.web_nice()
        if recorder.errors():
            print(f"bench: the end of the stack's log:\n{stack.output()[-6000:]}", flush=True)
    finally:
        stack.stop()
    label = f"load, {USERS} users + {HEARTBEATS_PER_S} beats/s, {SECONDS} s"
    uploads = recorder.latencies["upload"]
    return [
        error_row(label, recorder),
        *latency_rows(label, "page views", recorder.pages(), PAGE_P99_MS),
        *view_notes(label, recorder),
        *latency_rows(label, "heartbeats", recorder.latencies["heartbeat"], HEARTBEAT_P99_MS),
        note(
            f"{label}: uploads, p50 of {len(uploads)}",
            statistics.median(uploads) if uploads else None,
            "ms",
            "INFO",
        ),
        row(
            f"{label}: web RSS growth, {len(meter.processes)} gunicorn workers "
            f"({' '.join(GUNICORN)}; {meter.baseline:.0f} MB → {meter.end:.0f} MB, "
            f"peak {meter.peak:.0f} MB)",
            meter.end - meter.baseline,
            "MB",
            RSS_GROWTH_MB,
        ),
        generator_note(label, recorder),
        weight_note(label, web_nice),
    ]


def weight_note(label, nice):
    """The web's CPU weight against nice 0's, from the nice its gunicorn workers ran at."""
    from bench.stack import NICE_WEIGHT, WEB_CPU_SHARES

    return note(
        f"{label}: the web's CPU weight against the other processes' (its workers' nice "
        f"{nice}; compose's cpu_shares {WEB_CPU_SHARES} of 1024)",
        NICE_WEIGHT[nice] / NICE_WEIGHT[0] if nice in NICE_WEIGHT else None,
        "×",
        "INFO",
    )


class Embedded:
    """`make run`'s stack (manage.py run_embedded: SQLite, the filesystem broker, gunicorn, the
    hub worker, beat and a local worker) in a folder of its own, in make run's environment."""

    def __init__(self, env):
        import subprocess
        import tempfile

        from bench.stack import RUN_PYTHON, free_port, healthy, wait_for

        self.folder = tempfile.mkdtemp(prefix="deployhub-embedded-")
        self.env = {**env, "DEPLOYHUB_VAR_DIR": self.folder, "PYTHONUNBUFFERED": "1"}
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(Path(self.folder) / "run_embedded.out", "wb")
        command = [RUN_PYTHON, "manage.py", "run_embedded", "--port", self.url.rsplit(":", 1)[1]]
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT
        )
        wait_for(lambda: healthy(self.url), 120, "make run's hub")

    def prepare(self, users, devices):
        import subprocess

        from bench.stack import RUN_PYTHON

        code = f"from bench.load import prepare_json; prepare_json({users}, {devices})"
        done = subprocess.run(
            [RUN_PYTHON, "manage.py", "shell", "-c", code],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise SystemExit(f"bench: seeding make run's hub failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def web_pids(self):
        """The gunicorn workers under run_embedded's web child."""
        import psutil

        for child in psutil.Process(self.process.pid).children():
            if "gunicorn" in " ".join(child.cmdline()):
                return [worker.pid for worker in child.children()]
        return []

    def stop(self):
        import shutil

        self.process.terminate()
        self.process.wait(timeout=60)
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def bench_load_embedded(env):
    """Rows: the same load on make run's embedded stack with 20 users (first measured there at p50
    400 ms, p99 2 s and the version page's p50 1 s)."""
    stack = Embedded(env)
    try:
        data = stack.prepare(EMBEDDED_USERS, DEVICES)
        recorder, meter = run_load(stack.url, data, EMBEDDED_USERS, stack.web_pids)
    finally:
        stack.stop()
    label = f"make run, {EMBEDDED_USERS} users + {HEARTBEATS_PER_S} beats/s, {SECONDS} s"
    pages, beats = recorder.pages(), recorder.latencies["heartbeat"]
    version = recorder.latencies["version page"]
    return [
        error_row(label, recorder),
        row(
            f"{label}: page views p50 ({len(pages)})",
            statistics.median(pages),
            "ms",
            EMBEDDED_P50_MS,
        ),
        row(f"{label}: page views p99", percentile(pages, 99), "ms", EMBEDDED_P99_MS),
        row(
            f"{label}: version page p50 ({len(version)})",
            statistics.median(version),
            "ms",
            EMBEDDED_VERSION_P50_MS,
        ),
        note(f"{label}: heartbeats p50", statistics.median(beats), "ms", "INFO"),
        note(f"{label}: heartbeats p99", percentile(beats, 99), "ms", "INFO"),
        note(
            f"{label}: web RSS growth ({meter.baseline:.0f} → {meter.end:.0f} MB)",
            meter.end - meter.baseline,
            "MB",
            "INFO",
        ),
        generator_note(label, recorder),
    ]
