"""What a hub and its workers leave on the host: no dead job folders, no token in `ps`,
data for its user only, one log line per refused request."""

import contextlib
import http.server
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
import requests

from deployhub.demo.management.commands.run_embedded import Command
from deployhub.demo.management.commands.seed_demo import demo_password
from deployhub.embedded import keep_private
from deployhub.request_log import OneLineClientErrors
from tests.conftest import ROOT, wait_until
from workers import cli, scratch

TOKEN = "dht_not-for-ps-0123456789"

HOLD_A_JOB_FOLDER = """
import sys, time
from workers.scratch import scratch_dir
with scratch_dir(7, sys.argv[1]) as path:
    (path / "build").mkdir()
    (path / "build" / "engine.bin").write_bytes(bytes(2_000_000))
    print(path, flush=True)
    time.sleep(120)
"""


def mode(path):
    return stat.S_IMODE(Path(path).stat().st_mode)


def hold_a_job_folder(root):
    """Start a process that makes a job folder as a worker does and keeps it; return both."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_JOB_FOLDER, str(root)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    return process, Path(process.stdout.readline().strip())


@pytest.fixture
def worker_start(tmp_path):
    """Start `deployhub-worker run` on a hub that is not there (it waits for it) and stop it."""
    started = []

    def start(workdir, env):
        log = tmp_path / f"worker-{len(started)}.log"
        process = subprocess.Popen(
            [sys.executable, "-m", "workers", "run", "--hub", "http://127.0.0.1:9"]
            + ["--workdir", str(workdir)],
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        started.append(process)
        return process, lambda: log.read_text(errors="replace")

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_a_starting_worker_removes_a_killed_attempts_folder_and_keeps_a_live_ones(
    tmp_path, worker_start
):
    work = tmp_path / "work"
    killed, dead_folder = hold_a_job_folder(work)
    live, live_folder = hold_a_job_folder(work)
    killed.kill()
    killed.wait()
    unnamed = work / "job-3-abcdef"  # not named by scratch_dir: whose it is cannot be told
    unnamed.mkdir()
    assert dead_folder.is_dir(), "a worker killed mid-job leaves its folder"

    try:
        worker, output = worker_start(work, {"DEPLOYHUB_DEVICE_TOKEN": TOKEN})
        wait_until(lambda: not dead_folder.exists(), 30, "the dead folder to go", on_timeout=output)
        wait_until(lambda: "waiting for the hub" in output(), 30, "the worker to go on")

        assert live_folder.is_dir() and (live_folder / "build" / "engine.bin").exists()
        assert unnamed.is_dir()
        assert (
            f"removed 1 job folder(s) of stopped workers (2.0 MB): {dead_folder.name}" in output()
        )
    finally:
        live.kill()
        live.wait()


def test_it_tells_a_pid_taken_again_from_the_process_that_made_the_folder(tmp_path):
    me = scratch.owner_tag(os.getpid())
    pid, started = me.split(".")
    mine = tmp_path / f"job-1-{me}-aaaa"
    reused = tmp_path / f"job-2-{pid}.{int(started) - 500}-bbbb"  # same pid, started 5 s earlier
    for folder in (mine, reused):
        folder.mkdir()

    removed = scratch.remove_dead(tmp_path)

    assert [path for path, _ in removed] == [reused]
    assert mine.is_dir() and not reused.exists()


def test_make_run_gives_the_local_worker_its_token_in_its_environment(tmp_path):
    command = Command()
    command.log_dir = tmp_path

    children = {c.name: c for c in command.children("http://127.0.0.1:1", "127.0.0.1", 1, TOKEN)}

    assert not [c.name for c in children.values() if TOKEN in " ".join(c.command)]
    assert children["local-worker"].env["DEPLOYHUB_DEVICE_TOKEN"] == TOKEN
    others = [c for name, c in children.items() if name != "local-worker"]
    assert not [c.name for c in others if c.env.get("DEPLOYHUB_DEVICE_TOKEN") == TOKEN]


class RefusingHub(http.server.BaseHTTPRequestHandler):
    """A hub that refuses every token, and remembers the ones it saw."""

    seen = []

    def do_GET(self):
        RefusingHub.seen.append(self.headers["Authorization"])
        body = b'{"error": "unknown device token"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing_hub():
    RefusingHub.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RefusingHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_worker_reads_its_token_from_a_file(refusing_hub, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DEPLOYHUB_DEVICE_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)

    status = cli.main(["run", "--hub", refusing_hub, "--token-file", str(token_file)])

    assert status == 2 and RefusingHub.seen == [f"Bearer {TOKEN}"]
    err = capsys.readouterr().err
    assert "refused this token" in err and "readable by other users" not in err


def test_the_worker_warns_of_a_token_file_others_may_read(refusing_hub, tmp_path, capsys):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o644)

    cli.main(["run", "--hub", refusing_hub, "--token-file", str(token_file)])

    assert f"{token_file} is readable by other users: chmod 600" in capsys.readouterr().err


def test_the_token_flag_still_works_and_says_where_it_belongs(refusing_hub, capsys):
    cli.main(["run", "--hub", refusing_hub, "--token", TOKEN])

    assert RefusingHub.seen == [f"Bearer {TOKEN}"]
    assert "set DEPLOYHUB_DEVICE_TOKEN or use --token-file instead" in capsys.readouterr().err


MAKE_DATA = """
import django, os
os.umask(0o022)  # a usual umask: the modes below are the hub's doing
os.environ["DJANGO_SETTINGS_MODULE"] = "deployhub.settings"
django.setup()
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE t (x int)")
    cursor.execute("INSERT INTO t VALUES (1)")
wal = connection.settings_dict["NAME"] + "-wal"
print(oct(os.stat(wal).st_mode & 0o777))  # while the database is open: SQLite removes it on close
print(default_storage.save("models/7/model.onnx", ContentFile(b"onnx")))
"""


def test_embedded_data_is_created_for_its_user_only(tmp_path):
    var = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}

    result = subprocess.run(
        [sys.executable, "-c", MAKE_DATA],
        cwd=ROOT,
        env={**env, "DEPLOYHUB_VAR_DIR": str(var)},
        capture_output=True,
        text=True,
    )

    assert result.returncode == 0, result.stderr
    wal_mode, stored_name = result.stdout.split()
    stored = var / "media" / stored_name
    folders = (var, var / "media", var / "media" / "tmp", var / "broker", var / "static")
    assert {p.name: mode(p) for p in folders} == {
        "var": 0o700,
        "media": 0o700,
        "tmp": 0o700,
        "broker": 0o700,
        "static": 0o700,
    }
    assert {mode(p) for p in (var / "broker").iterdir()} == {0o700}  # queue, processed, control
    assert mode(stored.parent) == 0o700 and mode(stored) == 0o600
    assert (mode(var / "deployhub.sqlite3"), wal_mode) == (0o600, "0o600")
    assert mode(var / "secret_key") == 0o600


def test_make_run_makes_an_earlier_var_folder_private(tmp_path):
    var, media, database = tmp_path / "var", tmp_path / "var" / "media", tmp_path / "var" / "db"
    media.mkdir(parents=True, mode=0o755)
    (var / "broker").mkdir(mode=0o755)
    var.chmod(0o755)
    database.write_bytes(b"")
    database.chmod(0o644)
    before = os.umask(0o022)
    try:
        keep_private(var, media, [database, tmp_path / "absent-wal"])
        umask = os.umask(0o022)
    finally:
        os.umask(before)

    assert (mode(var), mode(media), mode(database), umask) == (0o700, 0o700, 0o600, 0o077)
    assert mode(var / "broker") == 0o700


def test_a_refused_request_is_one_line_in_the_log_and_a_server_error_keeps_its_traceback(
    client, alice, bob, caplog
):
    client.force_login(bob)
    with caplog.at_level(logging.WARNING, logger="django.request"):
        assert client.post("/team/settings/", {"approvals_required": 2}).status_code == 403
    record = next(r for r in caplog.records if r.name == "django.request")
    hub_format = hub_formatter()

    line = hub_format.format(record)

    assert line == (
        "Forbidden (Permission denied): /team/settings/ "
        "(PermissionDenied: This needs the admin role in Demo.)"
    )
    assert "Traceback" in logging.Formatter().format(record)  # what Django alone writes
    record.status_code = 500
    assert "Traceback" in hub_format.format(record)


def hub_formatter():
    """The formatter of the hub's console handler, as settings.LOGGING configures it."""
    handlers = logging.getLogger().handlers
    return next(h.formatter for h in handlers if isinstance(h.formatter, OneLineClientErrors))


# make run itself, end to end.


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def make_run(tmp_path_factory):
    """`manage.py run_embedded` on a fresh var/ folder, with a temp folder of its own."""
    base = tmp_path_factory.mktemp("make-run")
    (base / "tmp").mkdir()
    port, log = free_port(), base / "run.log"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(DEPLOYHUB_VAR_DIR=str(base / "var"), TMPDIR=str(base / "tmp"), PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_embedded", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    output = lambda: log.read_text(errors="replace")  # noqa: E731
    try:
        wait_until(lambda: "DeployHub is running" in output(), 180, "make run", on_timeout=output)
        yield {"url": f"http://127.0.0.1:{port}", "process": process, "base": base}
    finally:
        process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def local_worker(stack):
    """Return the local worker's process (its group leader), or None."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(stack["process"].pid).children():
            if "workers run" in " ".join(child.cmdline()):
                return child
    return None


@pytest.mark.e2e
def test_make_run_keeps_the_worker_token_out_of_ps_and_its_data_private(make_run):
    worker = wait_until(lambda: local_worker(make_run), 60, "the local worker")
    var = make_run["base"] / "var"

    cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "workers run --hub" in cmdline and "--token" not in cmdline and "dht_" not in cmdline
    folders = (var, var / "media", var / "logs", var / "broker", var / "static")
    assert {p.name: mode(p) for p in folders} == {
        "var": 0o700,
        "media": 0o700,
        "logs": 0o700,
        "broker": 0o700,
        "static": 0o700,
    }
    assert mode(var / "deployhub.sqlite3") == 0o600
    assert mode(var / "logs" / "web.log") == 0o600


@pytest.mark.e2e
def test_make_run_logs_a_refused_request_in_one_line(make_run):
    url, session = make_run["url"], requests.Session()
    session.get(f"{url}/login/")
    csrf = {"csrfmiddlewaretoken": session.cookies["csrftoken"]}
    session.post(f"{url}/login/", data={"username": "bob", "password": demo_password(), **csrf})
    web_log = make_run["base"] / "var" / "logs" / "web.log"

    csrf = {"csrfmiddlewaretoken": session.cookies["csrftoken"]}  # a new one after signing in
    answer = session.post(f"{url}/team/settings/", data={"approvals_required": 2, **csrf})

    assert answer.status_code == 403
    line = "Forbidden (Permission denied): /team/settings/ (PermissionDenied: This needs the admin"
    wait_until(
        lambda: line in web_log.read_text(), 10, "the 403 in the log", on_timeout=web_log.read_text
    )
    assert "Traceback" not in web_log.read_text()


@pytest.mark.e2e
def test_make_run_cleans_the_folder_of_a_worker_killed_mid_job(make_run):
    worker = wait_until(lambda: local_worker(make_run), 60, "the local worker")
    # The folder that worker makes for a job (workers/scratch.py), then kill -9 mid-job.
    folder = make_run["base"] / "tmp" / f"job-42-{scratch.owner_tag(worker.pid)}-x1y2z3"
    (folder / "build").mkdir(parents=True)
    (folder / "build" / "engine.onnx").write_bytes(bytes(1000))
    os.killpg(worker.pid, signal.SIGKILL)

    wait_until(lambda: not folder.exists(), 60, "the restarted worker to remove the folder")
    restarted = wait_until(lambda: local_worker(make_run), 60, "the restarted worker")
    assert restarted.pid != worker.pid
