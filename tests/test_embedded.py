"""`make run`'s embedded mode: SQLite, the filesystem broker, hub worker and local worker."""

import contextlib
import csv
import io
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest
import requests

from deployhub import embedded as supervision
from deployhub.demo.management.commands.seed_demo import demo_password
from deployhub.embedded import Backoff, Child, Supervisor
from tests.conftest import ROOT, wait_until
from tests.soak_world import FINAL_VERBS  # the audit verbs of a job's end: one per run


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# make run's lease is 30 s; the shared stack's is shorter, so that a job whose worker
# died is re-queued within a test's time (scripts/soak.py does the same).
LEASE_S = 10
REAPER_INTERVAL_S = 5  # make run's


@contextlib.contextmanager
def run_embedded(tmp_path, extra_env=None):
    """Start `manage.py run_embedded` with nothing configured but a fresh var/ folder (and
    what `extra_env` sets)."""
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")
    }
    env.update(DEPLOYHUB_VAR_DIR=str(tmp_path / "var"), PYTHONUNBUFFERED="1", **(extra_env or {}))
    log = open(tmp_path / "run.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_embedded", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    output = lambda: (tmp_path / "run.log").read_text(errors="replace")  # noqa: E731
    try:
        wait_until(
            lambda: "DeployHub is running at" in output(),
            120,
            "run_embedded to start",
            on_timeout=output,
        )
        yield {
            "url": f"http://127.0.0.1:{port}",
            "process": process,
            "output": output,
            "var": tmp_path / "var",
        }
    finally:
        stop(process)
        log.close()


def stop(process):
    """Stop run_embedded as Ctrl-C does, then kill whatever is left in any of its groups."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
    for leftover in in_session(process.pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            leftover.kill()


@pytest.fixture
def embedded(tmp_path):
    """A stack of its own, for a test that stops or kills it."""
    with run_embedded(tmp_path) as stack:
        yield stack


@pytest.fixture(scope="module")
def shared_stack(tmp_path_factory):
    """One stack for the tests that leave it running, however many of its children they kill."""
    lease = {"DEPLOYHUB_JOB_LEASE_SECONDS": str(LEASE_S)}
    with run_embedded(tmp_path_factory.mktemp("embedded"), lease) as stack:
        yield stack


def in_session(sid):
    """Return the live processes of a session: run_embedded and every child group it started."""
    found = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            if os.getsid(proc.pid) == sid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def child_pid(stack, command):
    """Return the pid of run_embedded's child whose command line contains `command`, or None."""
    with contextlib.suppress(psutil.Error):
        for proc in psutil.Process(stack["process"].pid).children():
            if command in " ".join(proc.cmdline()):
                return proc.pid
    return None


def schedulers(stack):
    """Return the stack's Celery beat schedulers, however beat is run.

    A standalone `celery beat` is one. A `celery worker --beat` forks its
    scheduler as a child with its own command line: that child is one, and so is
    such a child left behind when its worker died (it has no child of its own).
    """
    args = {}
    for proc in in_session(stack["process"].pid):
        with contextlib.suppress(psutil.Error):
            args[proc] = proc.cmdline()
    found = []
    for proc, command in args.items():
        with contextlib.suppress(psutil.Error):
            forks = [child for child in proc.children() if args.get(child) == command]
            if "beat" in command or ({"--beat", "-B"} & set(command) and not forks):
                found.append(proc)
    return found


def login(url):
    session = requests.Session()
    session.get(f"{url}/login/")
    response = session.post(
        f"{url}/login/",
        data={
            "username": "alice",
            "password": demo_password(),
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
    )
    assert response.url.endswith("/models/"), "alice could not log in with the printed password"
    return session


def run_a_benchmark(embedded):
    """Benchmark the demo model on local-cpu as alice does in the browser; return the job status."""
    url = embedded["url"]
    session = login(url)
    models_page = session.get(f"{url}/models/").text
    model_url = re.search(r'href="(/models/\d+/)">digits-cnn', models_page).group(1)
    version_url = re.search(r'href="(/versions/\d+/)">v2', session.get(url + model_url).text).group(
        1
    )
    page = session.get(url + version_url).text
    class_id = re.search(r'<option value="(\d+)"[^>]*>local-cpu', page).group(1)
    response = session.post(
        f"{url}{version_url}benchmark",
        allow_redirects=False,
        data={
            "device_class": class_id,
            "batch_size": 1,
            "warmup_iterations": 5,
            "iterations": 200,
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
    )
    job_id = re.search(r"#job-(\d+)$", response.headers["Location"]).group(1)
    status = wait_until(
        lambda: (s := session.get(f"{url}/jobs/{job_id}/status").json())["final"] and s,
        60,
        "the benchmark to finish",
        on_timeout=embedded["output"],
    )
    status["results_page"] = session.get(f"{url}{version_url}results").text
    # A run's percentiles are in its details, which load when opened: the newest run's.
    details_url = re.search(r'data-details-url="([^"]+)"', status["results_page"]).group(1)
    status["run_details"] = session.get(url + details_url).text
    return status


def wait_for_worker_online(embedded):
    return wait_until(
        lambda: (h := requests.get(f"{embedded['url']}/healthz").json())["workers_online"] and h,
        60,
        "the local worker to come online",
        on_timeout=embedded["output"],
    )


@pytest.mark.e2e
def test_make_run_serves_the_demo_and_runs_a_benchmark(shared_stack):
    url = shared_stack["url"]
    assert f"{url}/" in shared_stack["output"]() and "alice" in shared_stack["output"]()
    health = wait_for_worker_online(shared_stack)
    assert health["database"] == "ok" and health["broker"] == "ok" and health["embedded"]
    assert (shared_stack["var"] / "deployhub.sqlite3").exists()
    assert (shared_stack["var"] / "broker").is_dir()

    status = run_a_benchmark(shared_stack)
    assert status["state"] == "succeeded", status["log"]
    assert "p99 ms" in status["results_page"] and "p50 ms" in status["run_details"]


@pytest.mark.e2e
def test_stopping_make_run_stops_every_process(embedded):
    parent = psutil.Process(embedded["process"].pid)
    children = parent.children(recursive=True)
    assert len(children) >= 4  # web, hub worker, beat, local worker
    embedded["process"].send_signal(signal.SIGINT)
    assert embedded["process"].wait(timeout=30) == 0
    gone, alive = psutil.wait_procs(children, timeout=15)
    assert alive == []


@pytest.mark.e2e
def test_killing_make_run_outright_takes_its_processes_down(embedded):
    children = psutil.Process(embedded["process"].pid).children(recursive=True)
    embedded["process"].kill()
    embedded["process"].wait(timeout=10)
    gone, alive = psutil.wait_procs(children, timeout=20)
    assert alive == []


@pytest.mark.e2e
def test_it_restarts_a_killed_local_worker_and_runs_the_jobs_queued_after(shared_stack):
    wait_for_worker_online(shared_stack)

    old, new = kill_and_wait_for_restart(shared_stack, "-m workers run")

    # The supervisor says so once the new child runs: its pid may be seen a moment before.
    restarted = f"local-worker restarted (pid {new})"
    wait_until(lambda: restarted in shared_stack["output"](), 10, "the restart to be said")
    assert f"local-worker (pid {old}) was killed by SIGKILL" in shared_stack["output"]()
    status = run_a_benchmark(shared_stack)
    assert status["state"] == "succeeded", status["log"]
    assert shared_stack["process"].poll() is None


@pytest.mark.e2e
def test_it_restarts_a_killed_hub_worker_or_beat_with_one_scheduler_and_keeps_serving(shared_stack):
    assert len(schedulers(shared_stack)) == 1
    with answers_meanwhile(f"{shared_stack['url']}/healthz") as answers:
        for command in ("deployhub worker", "deployhub beat"):
            kill_and_wait_for_restart(shared_stack, command)
    assert len(schedulers(shared_stack)) == 1
    assert answers and set(answers) == {200}, answers
    assert shared_stack["process"].poll() is None


def kill_and_wait_for_restart(embedded, command):
    """kill -9 the stack's child running `command`; return its old and its new pid."""
    old = child_pid(embedded, command)
    os.kill(old, signal.SIGKILL)
    return old, wait_for_restart(embedded, command, old)


def wait_for_restart(embedded, command, old):
    """Wait until the supervisor restarted the child running `command`; return its new pid."""
    return wait_until(
        lambda: (pid := child_pid(embedded, command)) not in (None, old) and pid,
        30,
        f"{command} to restart",
        on_timeout=embedded["output"],
    )


@contextlib.contextmanager
def answers_meanwhile(url):
    """Ask `url` every 0.1 s while the block runs; yield the list of answers (status or error)."""
    answers, done = [], threading.Event()

    def ask():
        while not done.wait(0.1):
            try:
                answers.append(requests.get(url, timeout=5).status_code)
            except requests.RequestException as error:
                answers.append(repr(error))

    thread = threading.Thread(target=ask)
    thread.start()
    try:
        yield answers
    finally:
        done.set()
        thread.join()


# ---------------------------------------------------------------- faults mid-job

LOCAL_WORKER = "-m workers run"
HUB_WORKER = "deployhub worker"
DEMO_BUILD = {"optimization_level": "all", "provider": "CPUExecutionProvider"}


class Jobs:
    """Submit jobs on the stack as alice does over the REST API; read what became of them."""

    def __init__(self, stack):
        self.stack, self.url = stack, stack["url"]
        self.session = login(self.url)
        self.session.headers["Authorization"] = f"Bearer {self.new_token()}"
        self.version = self.demo_version()

    def new_token(self):
        """Create a personal API token for alice in the browser; return it (shown once)."""
        page = self.session.post(
            f"{self.url}/account/tokens/",
            data={
                "name": "faults",
                "scope": "full",
                "csrfmiddlewaretoken": self.session.cookies["csrftoken"],
            },
        ).text
        return re.search(r"dhu_[\w-]+", page).group(0)

    def api(self, method, path, **kwargs):
        response = self.session.request(method, f"{self.url}/api/v1/{path}", **kwargs)
        assert response.ok, f"{method} {path}: {response.status_code} {response.text}"
        return response.json()

    def demo_version(self):
        """Return the id of the demo model's version 2."""
        models = self.api("GET", "models")["items"]
        model = next(m for m in models if m["name"] == "digits-cnn")
        versions = self.api("GET", f"models/{model['id']}")["versions"]
        return next(v["id"] for v in versions if v["number"] == 2)

    def compile(self):
        """Queue a build of the demo model for local-cpu; return the job's id."""
        body = {"device_class": "local-cpu", "backend": "onnxruntime", "build_config": DEMO_BUILD}
        answer = self.api("POST", f"versions/{self.version}/engines", json=body)
        assert not answer["reused"], f"the engine was built before this test: {answer}"
        return answer["job"]["id"]

    def benchmark(self, seconds=None):
        """Queue a benchmark on local-cpu: a short one, or one that measures for `seconds`."""
        body = {"device_class": "local-cpu", "iterations": 20, "warmup_iterations": 2}
        if seconds:
            body = {"device_class": "local-cpu", "duration_s": seconds, "warmup_s": 0.2}
        return self.api("POST", f"versions/{self.version}/benchmarks", json=body)["job"]["id"]

    def status(self, job_id):
        """The job as its page shows it: state, attempt, progress and the whole log."""
        return self.session.get(f"{self.url}/jobs/{job_id}/status").json()

    def wait(self, job_id, condition, timeout, what):
        """Wait until the job's status meets `condition`; return that status."""
        return wait_until(
            lambda: condition(status := self.status(job_id)) and status,
            timeout,
            f"job {job_id}: {what}",
            interval=0.05,
            on_timeout=lambda: f"{self.status(job_id)}\n{self.stack['output']()}",
        )

    def wait_final(self, job_id, timeout=90):
        return self.wait(job_id, lambda s: s["final"], timeout, "to end")

    def engines(self):
        """The demo version's engines for local-cpu of the build the tests ask for."""
        return [
            engine
            for engine in self.api("GET", f"versions/{self.version}/engines?limit=500")["items"]
            if engine["device_class"] == "local-cpu"
            and engine["backend"] == "onnxruntime"
            and DEMO_BUILD.items() <= engine["build_config"].items()
        ]

    def benchmark_runs(self, job_id):
        """The version's benchmark runs that the job recorded."""
        runs = self.api("GET", f"versions/{self.version}/benchmarks?limit=500")["items"]
        return [run for run in runs if run["job"] == job_id]

    def endings(self, job_id):
        """The job's ends in the team's audit log: one, unless it was recorded twice."""
        audit = self.session.get(f"{self.url}/team/audit.csv?object=job&object_id={job_id}")
        rows = csv.DictReader(io.StringIO(audit.text))
        return [row["verb"] for row in rows if row["verb"] in FINAL_VERBS]

    def outcome(self, job_ids):
        """Count what became of the jobs: finished, lost (not final), run twice; and say it."""
        statuses = [self.status(job_id) for job_id in job_ids]
        finished = sum(s["final"] for s in statuses)
        figures = {
            "submitted": len(job_ids),
            "finished": finished,
            "lost": len(job_ids) - finished,
            "run_twice": sum(len(self.endings(job_id)) > 1 for job_id in job_ids),
        }
        states = ", ".join(f"{s['id']} {s['state']} on attempt {s['attempt']}" for s in statuses)
        said = ", ".join(f"{name.replace('_', ' ')} {n}" for name, n in figures.items())
        return {**figures, "said": f"jobs {said} (jobs {states})"}


@pytest.fixture
def jobs(shared_stack):
    wait_for_worker_online(shared_stack)
    return Jobs(shared_stack)


def last_line(status):
    """The job's last log line, without its time stamp."""
    return status["log"].strip().splitlines()[-1].split(" ", 1)[-1]


@pytest.mark.e2e
def test_it_finishes_a_compile_whose_worker_was_killed_mid_build_with_one_engine(
    shared_stack, jobs
):
    compile_id, behind = jobs.compile(), jobs.benchmark()
    jobs.wait(compile_id, lambda s: "input model verified" in s["log"], 60, "the build to start")

    old = child_pid(shared_stack, LOCAL_WORKER)
    os.kill(old, signal.SIGKILL)
    killed = jobs.status(compile_id)

    new = wait_for_restart(shared_stack, LOCAL_WORKER, old)
    done = jobs.wait_final(compile_id)
    jobs.wait_final(behind)
    engines, outcome = jobs.engines(), jobs.outcome([compile_id, behind])
    report = (
        f"kill -9 the local worker (pid {old}; restarted as {new}) while compile job "
        f"{compile_id} was building (attempt {killed['attempt']}, {killed['state']}, its last "
        f"log line: {last_line(killed)!r}); it {done['state']} on attempt {done['attempt']} "
        f"with {len(engines)} engine(s); {outcome['said']}"
    )
    print(report)
    assert done["state"] == "succeeded" and done["attempt"] > 1, report
    assert len(engines) == 1, report
    assert outcome["lost"] == outcome["run_twice"] == 0, report
    assert jobs.status(behind)["state"] == "succeeded", report
    assert f"local-worker (pid {old}) was killed by SIGKILL" in shared_stack["output"]()


@pytest.mark.e2e
def test_a_sigterm_lets_the_running_job_finish_before_the_local_worker_exits(shared_stack, jobs):
    long_id = jobs.benchmark(seconds=4)
    behind = jobs.benchmark()
    running = jobs.wait(
        long_id, lambda s: s["state"] == "running" and s["progress"] > 0, 60, "to measure"
    )
    old = child_pid(shared_stack, LOCAL_WORKER)

    os.kill(old, signal.SIGTERM)  # only the worker's main process, as `kill <pid>` does
    started = time.monotonic()
    wait_until(
        lambda: not psutil.pid_exists(old) or psutil.Process(old).status() == "zombie",
        60,
        "the local worker to exit",
        on_timeout=shared_stack["output"],
    )
    waited = time.monotonic() - started
    after = jobs.status(long_id)
    new = wait_for_restart(shared_stack, LOCAL_WORKER, old)
    jobs.wait_final(behind)
    runs, outcome = jobs.benchmark_runs(long_id), jobs.outcome([long_id, behind])
    report = (
        f"SIGTERM the local worker (pid {old}) while benchmark job {long_id} ran (progress "
        f"{running['progress']:.2f}): it exited {waited:.1f} s later, the job then "
        f"{after['state']} on attempt {after['attempt']} with {len(runs)} benchmark run(s); "
        f"restarted as {new}; {outcome['said']}"
    )
    print(report)
    assert after["state"] == "succeeded" and after["attempt"] == 1, report
    assert len(runs) == 1, report
    assert outcome["lost"] == outcome["run_twice"] == 0, report
    assert jobs.status(behind)["state"] == "succeeded", report
    assert f"local-worker (pid {old}) stopped cleanly (exit code 0)" in shared_stack["output"](), (
        report
    )


@pytest.mark.e2e
def test_the_restarted_hub_worker_requeues_a_job_whose_worker_was_killed(shared_stack, jobs):
    long_id = jobs.benchmark(seconds=4)
    jobs.wait(long_id, lambda s: s["state"] == "running" and s["progress"] > 0, 60, "to measure")

    hub_old, old = child_pid(shared_stack, HUB_WORKER), child_pid(shared_stack, LOCAL_WORKER)
    os.kill(hub_old, signal.SIGKILL)
    os.kill(old, signal.SIGKILL)
    killed = time.monotonic()
    hub_new = wait_for_restart(shared_stack, HUB_WORKER, hub_old)
    new = wait_for_restart(shared_stack, LOCAL_WORKER, old)
    jobs.wait(long_id, lambda s: s["attempt"] > 1, 60, "to be re-queued")
    took = time.monotonic() - killed
    done = jobs.wait_final(long_id)
    runs, outcome = jobs.benchmark_runs(long_id), jobs.outcome([long_id])
    reaped = [line for line in done["log"].splitlines() if "lease expired" in line]
    report = (
        f"kill -9 the hub worker (pid {hub_old}; restarted as {hub_new}), then the local "
        f"worker (pid {old}; restarted as {new}) running benchmark job {long_id}: the hub "
        f"re-queued it {took:.1f} s later (lease {LEASE_S} s; its log: {reaped}); it "
        f"{done['state']} on attempt {done['attempt']} with {len(runs)} benchmark run(s); "
        f"{outcome['said']}"
    )
    print(report)
    assert took <= LEASE_S + 3 * REAPER_INTERVAL_S + 5, report
    assert len(reaped) == 1 and "re-queued as attempt 2" in reaped[0], report
    assert done["state"] == "succeeded" and done["attempt"] == 2, report
    assert len(runs) == 1 and outcome["run_twice"] == 0, report


SLEEPER_WITH_A_CHILD = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"
)
STOPS_CLEANLY = "import time; time.sleep(2.2)"  # up past QUICK_CRASH_S, then exits 0
CANNOT_START = "import sys; print('cannot bind 127.0.0.1:8000', file=sys.stderr); sys.exit(3)"


@pytest.fixture
def supervisor():
    """A Supervisor that keeps its report lines in `.lines`; its children are stopped afterwards."""
    lines = []
    supervisor = Supervisor([], lambda line, loud=False: lines.append((line, loud)))
    supervisor.lines = lines
    yield supervisor
    supervisor.stop(timeout=2)


def supervise(supervisor, name, code, tmp_path):
    child = Child(name, [sys.executable, "-c", code], dict(os.environ), tmp_path / f"{name}.log")
    supervisor.children.append(child)
    supervisor.start_child(child)
    return child


def test_it_kills_a_crashed_childs_whole_group_before_restarting_it(supervisor, tmp_path):
    child = supervise(supervisor, "hub-worker", SLEEPER_WITH_A_CHILD, tmp_path)
    old = child.pid
    grandchild = wait_until(lambda: psutil.Process(old).children(), 30, "the child's own child")[0]

    os.kill(old, signal.SIGKILL)
    wait_until(lambda: supervisor.tick() or supervisor.lines, 30, "the crash to be reported")

    assert not grandchild.is_running()  # a beat or pool child never outlives its worker
    line, loud = supervisor.lines[0]
    assert re.match(rf"hub-worker \(pid {old}\) was killed by SIGKILL after \d+ s up; ", line)
    assert "restarting it in 1 s (crash 1 in a row" in line and not loud
    wait_until(lambda: supervisor.tick() or child.running, 30, "the restart")
    assert child.pid != old
    assert supervisor.lines[1] == (f"hub-worker restarted (pid {child.pid})", False)


def test_a_child_that_stopped_cleanly_is_restarted_without_counting_a_crash(
    supervisor, tmp_path, monkeypatch
):
    monkeypatch.setattr(supervision, "FIRST_DELAY_S", 0.01)
    child = supervise(supervisor, "local-worker", STOPS_CLEANLY, tmp_path)

    for restarts in (1, 2):  # twice: a second clean stop waits no longer than the first
        wait_until(
            lambda n=restarts: supervisor.tick() or len(supervisor.lines) >= 2 * n,
            30,
            "the stop and the restart",
        )
    stops = [line for line, loud in supervisor.lines if "stopped cleanly" in line]
    assert len(stops) == 2 and all("restarting it in 0.01 s" in line for line in stops)
    assert not any("crash" in line for line, _ in supervisor.lines)
    assert child.backoff == Backoff()


def test_it_reports_a_crash_loop_loudly_and_keeps_retrying(supervisor, tmp_path, monkeypatch):
    monkeypatch.setattr(supervision, "FIRST_DELAY_S", 0.01)  # the same policy, faster
    child = supervise(supervisor, "web", CANNOT_START, tmp_path)

    loud = wait_until(
        lambda: supervisor.tick() or [line for line, loud in supervisor.lines if loud],
        30,
        "a loud report",
    )

    quiet = [line for line, is_loud in supervisor.lines if not is_loud]
    assert sum("web (pid" in line and "exited with code 3" in line for line in quiet) >= 5
    assert "web keeps crashing: it died within 2 s of starting 5 times in a row" in loud[0]
    assert "Still retrying" in loud[0] and "cannot bind 127.0.0.1:8000" in loud[0]
    wait_until(lambda: supervisor.tick() or child.running, 10, "the retry after the report")


def test_it_backs_off_from_1_s_doubling_to_a_30_s_cap():
    backoff, delays = Backoff(), []
    for _ in range(7):
        backoff = backoff.after_crash(uptime=10)
        delays.append(backoff.delay)
    assert delays == [1, 2, 4, 8, 16, 30, 30]


def test_it_counts_crashes_afresh_after_a_child_stayed_up_a_minute():
    assert Backoff(crashes=6).after_crash(uptime=61).delay == 1
    assert Backoff(crashes=6).after_crash(uptime=59).delay == 30


def test_it_calls_five_quick_crashes_in_a_row_a_crash_loop():
    backoff = Backoff()
    for _ in range(4):
        backoff = backoff.after_crash(uptime=0.5)
    assert not backoff.crash_looping
    assert backoff.after_crash(uptime=0.5).crash_looping
    assert not backoff.after_crash(uptime=5).crash_looping  # a slower crash breaks the loop
