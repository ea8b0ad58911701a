"""Start the whole product on one machine: web server, hub worker, beat, one local CPU worker.

Each runs as a supervised child (deployhub/embedded.py): one that crashes is
restarted with backoff while the others keep serving.
"""

import os
import signal
import sys
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from deployhub.demo.management.commands.seed_demo import LOCAL_CLASS, LOCAL_DEVICE, demo_password
from deployhub.devices.models import Device
from deployhub.embedded import Child, Supervisor, describe_exit, keep_private
from deployhub.gunicorn_worker import WORKER_CLASS


def sqlite_files():
    """The SQLite database's files (database, write-ahead log, shared memory), when it is one."""
    database = settings.DATABASES["default"]
    if not database["ENGINE"].endswith("sqlite3"):
        return []
    return [Path(f"{database['NAME']}{suffix}") for suffix in ("", "-wal", "-shm")]


def rotate_local_token():
    """Give the local worker a fresh token; tokens are stored hashed, so a new one each start."""
    device = Device.objects.get(device_class__slug=LOCAL_CLASS, name=LOCAL_DEVICE)
    token = device.issue_token()
    device.save(update_fields=["token_hash", "token_hint"])
    return token


class Command(BaseCommand):
    help = "Run DeployHub embedded: web server, hub worker, beat and a local CPU worker."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("DEPLOYHUB_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("DEPLOYHUB_PORT", 8000)))
        parser.add_argument("--no-seed", action="store_true", help="Skip the demo data.")

    def handle(self, *args, host, port, no_seed, **options):
        keep_private(settings.VAR_DIR, settings.STORAGE_ROOT, sqlite_files())
        call_command("migrate", interactive=False, verbosity=0)
        if not no_seed:
            call_command("seed_demo")
        url = f"http://{host}:{port}"
        self.log_dir = settings.VAR_DIR / "logs"
        self.log_dir.mkdir(exist_ok=True)
        self.supervisor = Supervisor(self.children(url, host, port, rotate_local_token()), self.say)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        # Ctrl-C stops it even when started from a shell that ignores SIGINT in background jobs.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self.supervisor.start()
            self.wait_ready(url)
            self.announce(url)
            self.supervisor.run()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def children(self, url, host, port, token):
        """Return the supervised children.

        Beat runs as a child of its own, not inside the hub worker (`--beat`): a
        hub worker's crash then never leaves a scheduler behind to double up.
        """
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "MALLOC_ARENA_MAX": "2"}  # see Dockerfile
        # The local worker's token goes in its environment, never its command line (`ps`).
        worker_env = {k: v for k, v in env.items() if k != "DEPLOYHUB_DEVICE_TOKEN_FILE"}
        envs = {"local-worker": {**worker_env, "DEPLOYHUB_DEVICE_TOKEN": token}}
        commands = {
            "web": ["gunicorn", "deployhub.wsgi", "--bind", f"{host}:{port}"]
            + ["--workers", "2", "--threads", "4", "--worker-class", WORKER_CLASS]
            + ["--access-logfile", "-"]
            # Devices heartbeat every few seconds on one kept connection: a 2 s keep-alive
            # (gunicorn's default) closed it under them now and then (a reset in make bench).
            + ["--keep-alive", "75"]
            + ["--log-level", "warning"],
            "hub-worker": ["celery", "-A", "deployhub", "worker", "-Q", "hub", "-P", "solo"]
            + ["-l", "WARNING", "-n", "hub@%h"]
            + ["--without-gossip", "--without-mingle", "--without-heartbeat"],
            "hub-beat": ["celery", "-A", "deployhub", "beat", "-l", "WARNING"],
            "local-worker": ["workers", "run", "--hub", url]
            + ["--broker", settings.CELERY_BROKER_URL],
        }
        return [
            Child(
                name,
                [sys.executable, "-m", *command],
                envs.get(name, env),
                self.log_dir / f"{name}.log",
            )
            for name, command in commands.items()
        ]

    def wait_ready(self, url, timeout=60):
        """Wait for /healthz; a child dying before the hub answers is fatal (a port in use, say)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.refuse_early_exit()
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        raise CommandError(f"The hub did not answer on {url}/healthz within {timeout} s.")

    def refuse_early_exit(self):
        for child in self.supervisor.crashed():
            raise CommandError(
                f"The {child.name} process {describe_exit(child.process.returncode)}. "
                f"The end of {child.log_path}:\n{child.log_tail(60)}"
            )

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

    def say(self, line, loud=False):
        """Report a crash or a restart in one timestamped line (a loud one in red)."""
        line = f"[{time.strftime('%H:%M:%S')}] {line}"
        self.stdout.write(self.style.ERROR(line) if loud else self.style.WARNING(line))
        self.stdout.flush()

    def stop(self):
        """Stop every child's group; a second Ctrl-C meanwhile does not cut that short."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.supervisor.stop()
