"""Private PostgreSQL and Redis servers, and supervised processes, for the fault soak.

The soak (scripts/soak.py) restarts, stops and kills these; the shared services on
5432 and 6379 are never touched. PostgreSQL gets a fresh cluster (trust auth) in a
temporary folder and Redis a folder of its own, each on a spare port. Every process
runs as the leader of its own process group, so a kill takes its children with it.
PostgreSQL refuses to run as root: as root, its commands run as the `postgres` user.
"""

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

POSTGRES_USER = "postgres"


def free_port():
    """Return a TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(check, timeout, what, interval=0.2):
    """Poll check() until it returns something truthy; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def port_open(port):
    """True when something accepts connections on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def postgres_bin(name):
    """Return the path of a PostgreSQL server program (initdb, pg_ctl), newest version first."""
    for found in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(found)
    if path := shutil.which(name):
        return path
    raise FileNotFoundError(f"{name} not found: install PostgreSQL's server package")


class Process:
    """One long-running command in a process group of its own, its output in a log file."""

    def __init__(self, name, command, env, log_path, cwd=None):
        self.name, self.command, self.env = name, command, env
        self.log_path, self.cwd = Path(log_path), cwd
        self.process = None

    def start(self):
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self):
        return self.process.pid

    @property
    def running(self):
        return self.process is not None and self.process.poll() is None

    def signal(self, signum):
        """Send a signal to the whole group (the leader and what it started)."""
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass

    def kill9(self):
        """SIGKILL the group and reap the leader."""
        self.signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self, timeout=20):
        """SIGTERM the group; SIGKILL it when it is still there after `timeout` seconds."""
        if not self.running:
            return
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill9()

    def output(self, tail=4000):
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-tail:]


class Postgres:
    """A throwaway PostgreSQL cluster on a spare port (trust auth, no fsync: it is scratch)."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.data = self.folder / "data"
        self.sockets = self.folder / "sockets"
        self.log_path = self.folder / "postgres.log"
        self.port = free_port()
        self.as_postgres = os.geteuid() == 0

    def url(self, database="postgres"):
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *command, check=True):
        prefix = ["runuser", "-u", POSTGRES_USER, "--"] if self.as_postgres else []
        return subprocess.run(
            prefix + list(command), check=check, capture_output=True, text=True, timeout=120
        )

    def init(self):
        """Create the cluster (as the postgres user when run as root)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        if self.as_postgres:
            user = pwd.getpwnam(POSTGRES_USER)
            for path in (self.folder, self.sockets):
                os.chown(path, user.pw_uid, user.pw_gid)
            _let_others_traverse(self.folder)
        self._run(
            postgres_bin("initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        return self

    def start(self):
        options = (
            f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            postgres_bin("pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.log_path),
            "-w",
            "-t",
            "60",
            "start",
        )
        return self

    def stop(self, mode="fast"):
        """Stop the server: `fast` (roll back open transactions) or `immediate` (a crash)."""
        self._run(
            postgres_bin("pg_ctl"),
            "-D",
            str(self.data),
            "-m",
            mode,
            "-w",
            "-t",
            "60",
            "stop",
            check=False,
        )

    def create_database(self, name):
        psql = postgres_bin("psql")
        self._run(
            psql,
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-c",
            f"CREATE DATABASE {name}",
        )


class Redis:
    """A private Redis on a spare port; with persistence off, as `make test`'s own Redis."""

    def __init__(self, folder, persist=False):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.persist = persist
        self.process = None

    def url(self, db=0):
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self):
        command = [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.folder),
            "--save",
            "",
            "--appendonly",
            "yes" if self.persist else "no",
        ]
        env = {**os.environ}
        self.process = Process("redis", command, env, self.folder / "redis.log").start()
        wait_for(lambda: port_open(self.port), 30, "Redis to listen")
        return self

    def stop(self, kill=False):
        """Stop Redis: SIGTERM (a clean shutdown) or SIGKILL (a crash)."""
        if kill:
            self.process.kill9()
        else:
            self.process.stop()
        wait_for(lambda: not port_open(self.port), 30, "Redis to stop listening")

    @property
    def running(self):
        return self.process is not None and self.process.running


def _let_others_traverse(path):
    """Let the postgres user reach a folder under root's private temporary folders."""
    for parent in [Path(path), *Path(path).parents]:
        if parent == Path("/"):
            break
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o001)
