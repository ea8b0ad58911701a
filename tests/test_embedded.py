"""`make run`'s embedded mode: SQLite, the filesystem broker, hub worker and local worker."""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import psutil
import pytest
import requests

from deployhub import embedded as supervision
from deployhub.demo.management.commands.seed_demo import demo_password
from deployhub.embedded import Backoff, Child, Supervisor
from tests.conftest import ROOT, wait_until


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def run_embedded(tmp_path):
    """Start `manage.py run_embedded` with nothing configured but a fresh var/ folder."""
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")
    }
    env.update(DEPLOYHUB_VAR_DIR=str(tmp_path / "var"), PYTHONUNBUFFERED="1")
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
    with run_embedded(tmp_path_factory.mktemp("embedded")) as stack:
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
    assert "p50 ms" in status["results_page"]


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

    output = shared_stack["output"]()
    assert f"local-worker (pid {old}) was killed by SIGKILL" in output
    assert f"local-worker restarted (pid {new})" in output
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
    new = wait_until(
        lambda: (pid := child_pid(embedded, command)) != old and pid,
        30,
        f"{command} to restart",
        on_timeout=embedded["output"],
    )
    return old, new


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


SLEEPER_WITH_A_CHILD = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"
)
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
