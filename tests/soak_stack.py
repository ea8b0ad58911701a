"""A scaled-out DeployHub on private services, as processes the fault soak can break.

PostgreSQL and Redis of its own (tests/private_services.py), a storage folder of its
own (on a small tmpfs when this machine lets us mount one, so "disk full" is the
kernel's ENOSPC), the hub under gunicorn, the hub worker (the reaper) and beat as
`make run` starts them, and real device workers (`python -m workers run`), each
restartable one by one: broker-mode workers consume their class's queue on the private
Redis, HTTPS-mode workers (`mode=HTTPS`) ask the hub for work and have no broker URL at
all. Nothing here imports Django: the driver configures Django itself, pointed at
`stack.env`.
"""

import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import requests

from deployhub.gunicorn_worker import WORKER_CLASS
from tests.private_services import Postgres, Process, Redis, free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent
STORAGE_MB = 64
BROKER, HTTPS = "broker", "https"  # how a device worker takes its work
READY = {BROKER: " ready.", HTTPS: " ready: asking"}  # what each says once it takes work
BROKER_SCHEMES = ("redis://", "rediss://", "amqp://", "filesystem://", "memory://")


class Stack:
    """PostgreSQL, Redis, storage, hub, hub worker, beat and device workers in one folder."""

    def __init__(self, folder, python, lease_seconds, reaper_interval=1):
        self.folder = Path(folder)
        self.python = str(python)
        self.postgres = Postgres(self.folder / "postgres")
        self.redis = Redis(self.folder / "redis")
        self.storage = self.folder / "storage"
        self.logs = self.folder / "logs"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lease_seconds = lease_seconds
        self.reaper_interval = reaper_interval
        self.secret_key = secrets.token_urlsafe(50)
        self.tmpfs = False
        self.hub = self.hub_worker = self.beat = None
        self.workers = {}  # device name -> Process: broker-mode workers
        self.https_workers = {}  # device name -> Process: HTTPS-mode workers

    @property
    def env(self):
        """The environment of every hub process (and of the driver's Django)."""
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "deployhub.settings",
            "DATABASE_URL": self.postgres.url("soak"),
            "CELERY_BROKER_URL": self.redis.url(),
            "DEPLOYHUB_VAR_DIR": str(self.folder / "var"),
            "DEPLOYHUB_STORAGE_ROOT": str(self.storage),
            "SECRET_KEY": self.secret_key,
            "DEPLOYHUB_JOB_LEASE_SECONDS": str(self.lease_seconds),
            "DEPLOYHUB_REAPER_INTERVAL": str(self.reaper_interval),
            "DEPLOYHUB_HEARTBEAT_INTERVAL": "3",
            # Persistent connections, as a production hub keeps them: a restarted
            # database must not cost every one of them an error.
            "DATABASE_CONN_MAX_AGE": "60",
            "PYTHONUNBUFFERED": "1",
        }

    def start(self):
        """Bring up the services, migrate, and start the hub, its worker and beat."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.postgres.init().start().create_database("soak")
        self.redis.start()
        self.tmpfs = mount_tmpfs(self.storage, STORAGE_MB)
        (self.storage / "tmp").mkdir(parents=True, exist_ok=True)
        self.manage("migrate", "--noinput", "-v", "0")
        self.hub = self._process("hub", self._gunicorn()).start()
        self.hub_worker = self._process("hub-worker", self._celery_worker()).start()
        self.beat = self._process("beat", self._celery_beat()).start()
        self.wait_healthy(60)

    def stop(self):
        """Stop every process and service; unmount the storage tmpfs. The device workers
        stop together, then the hub's processes together."""
        workers = [*self.workers.values(), *self.https_workers.values()]
        for processes in (workers, [self.beat, self.hub_worker, self.hub]):
            stop_together([process for process in processes if process is not None], 10)
        if self.redis.running:
            self.redis.stop(kill=True)
        self.postgres.stop("immediate")
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.storage)], check=False)

    def manage(self, *args):
        subprocess.run(
            [self.python, "manage.py", *args], cwd=ROOT, env=self.env, check=True, timeout=300
        )

    def _process(self, name, command, env=None):
        return Process(name, command, env or self.env, self.logs / f"{name}.log", cwd=ROOT)

    def _gunicorn(self):
        return [
            self.python,
            "-m",
            "gunicorn",
            "deployhub.wsgi",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            "2",
            "--threads",
            "4",
            "--worker-class",
            WORKER_CLASS,
            "--timeout",
            "120",
            "--graceful-timeout",
            "5",
            "--log-level",
            "warning",
        ]

    def _celery_worker(self):
        return [
            self.python,
            "-m",
            "celery",
            "-A",
            "deployhub",
            "worker",
            "-Q",
            "hub",
            "-P",
            "solo",
            "-l",
            "WARNING",
            "-n",
            "hub@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]

    def _celery_beat(self):
        schedule = self.folder / "var" / "celerybeat-schedule"
        return [
            self.python,
            "-m",
            "celery",
            "-A",
            "deployhub",
            "beat",
            "-l",
            "WARNING",
            "--schedule",
            str(schedule),
        ]

    def restart_hub_worker(self):
        self.hub_worker = self._process("hub-worker", self._celery_worker()).start()

    def restart_hub(self):
        """Start the hub's gunicorn again (after a kill -9): the device API comes back."""
        self.hub = self._process("hub", self._gunicorn()).start()

    def health(self):
        """Return (status, JSON body) of /healthz; (None, reason) when the hub does not answer."""
        return http_json("GET", f"{self.url}/healthz", timeout=5)

    def wait_healthy(self, timeout):
        wait_for(lambda: self.health()[0] == 200, timeout, "the hub's /healthz to answer 200")

    def start_worker(self, name, token, clock_offset=0, mode=BROKER):
        """Start a device worker (its wall clock `clock_offset` seconds off); wait until ready."""
        return self.wait_ready(name, mode, *self.launch_worker(name, token, clock_offset, mode))

    def launch_worker(self, name, token, clock_offset=0, mode=BROKER):
        """Start a device worker without waiting; return (process, log, where its log began).

        An HTTPS-mode worker gets no broker URL, neither as an argument nor anywhere in its
        environment: it must find its work through the hub alone, as an enrolled device.
        """
        module = ["-m", "workers", "run", "--workdir", str(self.folder / "work" / name)]
        if clock_offset:
            module = ["-m", "tests.skewed_clock", str(clock_offset), *module]
        env = {**os.environ, "DEPLOYHUB_HUB_URL": self.url, "DEPLOYHUB_DEVICE_TOKEN": token}
        env["PYTHONUNBUFFERED"] = "1"
        for each in ("DJANGO_SETTINGS_MODULE", "CELERY_BROKER_URL"):
            env.pop(each, None)
        if mode == BROKER:
            env["CELERY_BROKER_URL"] = self.redis.url()
        else:
            brokers = [key for key, value in env.items() if value.startswith(BROKER_SCHEMES)]
            if brokers:
                raise RuntimeError(f"an HTTPS-mode worker's environment names a broker: {brokers}")
        log = self.logs / f"worker-{name}.log"
        offset = log.stat().st_size if log.exists() else 0
        process = self._process(f"worker-{name}", [self.python, *module], env).start()
        (self.workers if mode == BROKER else self.https_workers)[name] = process
        return process, log, offset

    def wait_ready(self, name, mode, process, log, offset):
        """Wait until the worker says it is ready: consuming (Celery's "ready."), or asking
        the hub for work over HTTPS."""
        said = READY[mode]
        wait_for(
            lambda: said in log.read_text(errors="replace")[offset:] or _died(process),
            90,
            f"worker {name} to be ready",
        )
        if not process.running:
            raise RuntimeError(f"worker {name} exited:\n{process.output()}")
        return process

    def terminate_worker(self, name, timeout=60):
        """SIGTERM the worker's main process only, as `kill <pid>` does; wait for it to exit."""
        process = self.workers[name]
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill9()
            return False
        process.signal(signal.SIGKILL)  # what it left behind (a build server) goes too
        return True

    def storage_free_bytes(self):
        return shutil.disk_usage(self.storage).free


def stop_together(processes, timeout):
    """SIGTERM every process's group at once; SIGKILL those still there `timeout` s later."""
    running = [process for process in processes if process.running]
    for process in running:
        process.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in running:
        try:
            process.process.wait(timeout=max(0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill9()


def _died(process):
    return not process.running


def mount_tmpfs(folder, megabytes):
    """Mount a small tmpfs at folder when allowed (root); return whether it was mounted."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0700", "tmpfs", str(folder)],
        capture_output=True,
    )
    return done.returncode == 0


def http_json(method, url, body=None, token=None, timeout=30, files=None):
    """Send a request; return (status, parsed JSON or text, headers). status None: no answer.

    files: {field: (filename, bytes)}, sent as multipart/form-data.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = requests.request(
            method, url, json=body, files=files, headers=headers, timeout=timeout
        )
    except requests.RequestException as error:
        return None, str(error), {}
    try:
        answer = response.json()
    except ValueError:
        answer = response.text[:500]
    return response.status_code, answer, dict(response.headers)
