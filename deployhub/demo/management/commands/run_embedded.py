"""Start the whole product on one machine: hub, hub worker with the reaper, one local CPU worker."""

import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.request

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from deployhub.demo.management.commands.seed_demo import LOCAL_CLASS, LOCAL_DEVICE, demo_password
from deployhub.devices.models import Device


def die_with_parent():
    """Ask Linux to stop this child when run_embedded dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1


def rotate_local_token():
    """Give the local worker a fresh token; tokens are stored hashed, so a new one each start."""
    device = Device.objects.get(device_class__slug=LOCAL_CLASS, name=LOCAL_DEVICE)
    token = device.issue_token()
    device.save(update_fields=["token_hash", "token_hint"])
    return token


class Command(BaseCommand):
    help = "Run DeployHub embedded: web server, hub worker (reaper) and a local CPU worker."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("DEPLOYHUB_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("DEPLOYHUB_PORT", 8000)))
        parser.add_argument("--no-seed", action="store_true", help="Skip the demo data.")

    def handle(self, *args, host, port, no_seed, **options):
        call_command("migrate", interactive=False, verbosity=0)
        if not no_seed:
            call_command("seed_demo")
        url = f"http://{host}:{port}"
        self.processes = self.start(url, host, port, rotate_local_token())
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            self.wait_ready(url)
            self.announce(url)
            self.supervise()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def start(self, url, host, port, token):
        python = sys.executable
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        broker = settings.CELERY_BROKER_URL
        commands = {
            "web": [
                python,
                "-m",
                "gunicorn",
                "deployhub.wsgi",
                "--bind",
                f"{host}:{port}",
                "--workers",
                "2",
                "--threads",
                "4",
                "--access-logfile",
                "-",
                "--log-level",
                "warning",
            ],
            "hub-worker": [
                python,
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
                "-n",
                "hub@%h",
            ],
            "local-worker": [
                python,
                "-m",
                "workers",
                "run",
                "--hub",
                url,
                "--token",
                token,
                "--broker",
                broker,
            ],
        }
        self.log_dir = settings.VAR_DIR / "logs"
        self.log_dir.mkdir(exist_ok=True)
        return {name: self.spawn(name, cmd, env) for name, cmd in commands.items()}

    def spawn(self, name, command, env):
        """Start one process with its output in var/logs/<name>.log; it dies with us."""
        with open(self.log_dir / f"{name}.log", "ab") as log:
            return subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
            )

    def wait_ready(self, url, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise CommandError(f"The hub did not answer on {url}/healthz within {timeout} s.")

    def announce(self, url):
        self.stdout.write(
            self.style.SUCCESS(
                f"\nDeployHub is running at {url}/\n"
                f"  log in as alice / {demo_password()}  (admin of team Demo)\n"
                f"  also bob (reviewer, Demo) and charlie (admin, Acme Robotics), same password\n"
                f"  data in {settings.VAR_DIR}, logs in {self.log_dir}\n"
                f"  press Ctrl-C to stop.\n"
            )
        )

    def check_alive(self):
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise CommandError(
                    f"The {name} process exited with code {process.returncode}. "
                    f"The end of {self.log_dir / (name + '.log')}:\n{tail}"
                )

    def supervise(self):
        while True:
            self.check_alive()
            time.sleep(1)

    def stop(self):
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
