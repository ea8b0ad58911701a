"""The processes a bench row measures: a gunicorn hub, device workers, the hub worker.

Pointed at the database and broker bench/run.py set in the environment. Each
process's output goes to one temporary log, printed when the stack fails to start.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from deployhub.gunicorn_worker import WORKER_CLASS

ROOT = Path(__file__).resolve().parent.parent
# The device workers run in make run's environment (the Makefile says where), as users get it.
RUN_PYTHON = os.environ.get("DEPLOYHUB_RUN_PYTHON") or sys.executable
# gunicorn with threads, as docker-compose.yml runs it (4 processes of 4 threads), sized to
# this machine's 2 cores: a process per core, 8 threads each, so a quick call (a heartbeat)
# is not queued behind slow pages. Under bench_load, 4 × 4 gave a worse p99 and twice the memory.
GUNICORN = ("--workers", "2", "--threads", "8", "--keep-alive", "75")
# The device API's own gunicorn (docker-compose.yml's devices service, which runs 2 processes;
# one here, on a 2-core machine): devices' calls never queue behind page renders for a web
# process's interpreter lock.
DEVICE_GUNICORN = ("--workers", "1", "--threads", "8", "--keep-alive", "75")
# What docker-compose.yml's devices service sets besides the hub's environment.
DEVICE_ENV = {"DATABASE_CONN_HEALTH_CHECKS": "false"}
# The web's CPU weight: compose's cpu_shares 256 against every other service's 1024. Here the
# processes share one machine, not containers: a nice of 6 is about the same weight (272
# against 1024), and any user may set it.
WEB_CPU_SHARES, WEB_NICE = 256, 6
# The kernel's CPU weight of a nice value (kernel/sched/core.c, sched_prio_to_weight).
NICE_WEIGHT = {-6: 3906, -5: 3121, 0: 1024, 4: 423, 5: 335, 6: 272, 7: 215, 8: 172}
DEVICE_WORKER = ("-m", "workers")


def percentile(values, q):
    ordered = sorted(values)
    index = (len(ordered) - 1) * q / 100
    low, high = int(index), min(int(index) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (index - low)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise SystemExit(f"bench: timed out waiting for {what}")


def healthy(url):
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=1):
            return True
    except OSError:
        return False


class Stack:
    """A hub (gunicorn) and device workers, each a process; the hub worker when asked.

    more: further [(device, token)] to run a worker for. worker: the module that runs a
    device worker (bench/timed_worker.py wraps workers' own with timestamps).
    """

    def __init__(self, token, device, *, more=(), hub_worker=False, worker=DEVICE_WORKER):
        self.url = f"http://127.0.0.1:{free_port()}"
        self.device_url = f"http://127.0.0.1:{free_port()}"
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "MALLOC_ARENA_MAX": "2"}  # Dockerfile
        self.logs = tempfile.TemporaryFile()
        self.processes = [
            self.gunicorn(self.url, GUNICORN, nice=WEB_NICE),
            self.gunicorn(self.device_url, DEVICE_GUNICORN, DEVICE_ENV),
        ]
        wait_for(lambda: healthy(self.url) and healthy(self.device_url), 60, "the hub")
        if hub_worker:
            self.processes.append(self.start(sys.executable, *HUB_WORKER))
        for each_device, each_token in [(device, token), *more]:
            self.processes.append(self.start(RUN_PYTHON, *worker, *self.worker_args(each_token)))
            wait_for(
                lambda d=each_device: type(d).objects.get(pk=d.pk).last_heartbeat_at,
                60,
                f"the worker of {each_device}",
            )
        time.sleep(1)  # let the consumers attach to their queues

    def gunicorn(self, url, options, env=None, nice=0):
        host = url.removeprefix("http://")
        command = ("-m", "gunicorn", "deployhub.wsgi", "-b", host, "-k", WORKER_CLASS, *options)
        return self.start(sys.executable, *command, env={**self.env, **(env or {})}, nice=nice)

    def start(self, python, *command, env=None, nice=0):
        """Start a process; nice: added to its priority by nice(1) before it runs (its threads,
        forks and children, an upload's checking child among them, inherit it)."""
        return subprocess.Popen(
            [*(("nice", "-n", str(nice)) if nice else ()), python, *command],
            cwd=ROOT,
            env=env or self.env,
            stdout=self.logs,
            stderr=subprocess.STDOUT,
        )

    def worker_args(self, token):
        broker = os.environ["CELERY_BROKER_URL"]
        return ["run", "--hub", self.device_url, "--token", token, "--broker", broker]

    @property
    def web_pids(self):
        """The gunicorn worker processes (not the arbiters) of the web and the device API."""
        import psutil

        arbiters = self.processes[:2]
        return [
            child.pid for arbiter in arbiters for child in psutil.Process(arbiter.pid).children()
        ]

    def web_nice(self):
        """The nice the web's gunicorn workers run at (None when they differ)."""
        import psutil

        nices = {child.nice() for child in psutil.Process(self.processes[0].pid).children()}
        return nices.pop() if len(nices) == 1 else None

    def output(self):
        self.logs.seek(0)
        return self.logs.read().decode(errors="replace")

    def stop(self):
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(timeout=20)


HUB_WORKER = (
    "-m",
    "celery",
    "-A",
    "deployhub",
    "worker",
    "--beat",
    "-Q",
    "hub",
    "-P",
    "solo",
    "-l",
    "WARNING",
    "--without-gossip",
    "--without-mingle",
    "--without-heartbeat",
)


def setup_fleet_for(team):
    """Create a user, a device class and a device with its token in the team."""
    from django.contrib.auth import get_user_model

    from deployhub.devices.models import DeviceClass

    user = get_user_model().objects.create_user(f"bench-{team.slug}")
    device_class = DeviceClass.objects.create(team=team, slug=f"{team.slug}-cpu", name="Bench CPU")
    [(device, token)] = add_devices(device_class, 1)
    return team, user, device_class, device, token


def add_devices(device_class, count, start=1):
    """Register count devices in the class; return [(device, its token)]."""
    from deployhub.devices.models import Device

    fleet = []
    for number in range(start, start + count):
        suffix = f"-{number}" if number > 1 else ""
        device = Device(device_class=device_class, name=f"{device_class.team.slug}-worker{suffix}")
        token = device.issue_token()
        device.save()
        fleet.append((device, token))
    return fleet
