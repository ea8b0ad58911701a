"""Keep `make run`'s processes up: a crashed child is reaped with its whole group and restarted.

Each child runs in a process group of its own, so when it dies everything it
started (gunicorn's workers, a Celery pool) is killed with it and nothing of the
old one outlives the restart. Restarts back off while a child keeps crashing, so
a child that cannot start costs one attempt every 30 s, never a busy CPU, and
the other children keep serving meanwhile.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
STABLE_AFTER_S = 60.0  # a child up this long starts its count of crashes in a row afresh
QUICK_CRASH_S = 2.0  # a child dying this soon after its start, ...
CRASH_LOOP = 5  # ... this many times in a row, is crash-looping: said loudly
GROUP_GONE_TIMEOUT_S = 5.0
POLL_S = 0.5

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Backoff:
    """A child's crashes in a row, and the wait before its next start that follows from them."""

    crashes: int = 0
    quick_crashes: int = 0

    def after_crash(self, uptime):
        """Return the state after a crash that came `uptime` seconds after the child started."""
        crashes = 1 if uptime >= STABLE_AFTER_S else self.crashes + 1
        quick_crashes = self.quick_crashes + 1 if uptime < QUICK_CRASH_S else 0
        return Backoff(crashes, quick_crashes)

    @property
    def delay(self):
        """Seconds before the restart: 1 s after a first crash, doubling up to 30 s."""
        return min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** max(0, self.crashes - 1))

    @property
    def crash_looping(self):
        """True when the child died soon after its start CRASH_LOOP times in a row."""
        return self.quick_crashes >= CRASH_LOOP


def describe_exit(returncode):
    """Say how a process ended: 'exited with code 1' or 'was killed by SIGKILL'."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


@dataclass
class Child:
    """One supervised process: how to start it, the running process, its crashes."""

    name: str
    command: list
    env: dict
    log_path: Path
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restart_at: float | None = None  # set while the child waits out its backoff
    backoff: Backoff = field(default_factory=Backoff)

    def start(self):
        """Start the process as the leader of a new process group; it dies with run_embedded."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=die_with_parent,
            )
        self.started_at, self.restart_at = time.monotonic(), None

    @property
    def pid(self):
        return self.process.pid

    @property
    def running(self):
        return self.process is not None and self.process.returncode is None

    def log_tail(self, lines=20):
        """Return the last lines of the child's log, for a report about it."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class Supervisor:
    """Start the children, restart the ones that crash, stop every group on the way out.

    run_embedded reaps every process itself (leaders, and the orphans a crashed
    leader leaves, which it adopts as child subreaper on Linux): that is how it
    knows a crashed child's group is really gone before starting it again. It
    waits on its children's groups only, never on any child (waitpid(-1)), so it
    takes no other code's exit status.
    """

    def __init__(self, children, say):
        self.children = list(children)
        self.say = say  # say(line, loud=False) reports to the operator
        self.groups = set()  # process groups with something left to reap

    def start(self):
        adopt_orphans()
        for child in self.children:
            self.start_child(child)

    def start_child(self, child):
        child.start()
        self.groups.add(child.pid)

    def run(self):
        """Supervise until interrupted."""
        while True:
            self.tick()
            time.sleep(POLL_S)

    def tick(self):
        """Handle the children that crashed since the last tick; start those whose wait is over."""
        for child in self.crashed():
            self.handle_crash(child)
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is not None and now >= child.restart_at:
                self.start_child(child)
                self.say(f"{child.name} restarted (pid {child.pid})")

    def crashed(self):
        """Return the children that exited and are not yet waiting to restart."""
        self.collect()
        return [c for c in self.children if not c.running and c.restart_at is None]

    def handle_crash(self, child):
        """Reap the child's group, schedule its restart with backoff, and say so in one line.

        A child that was up a while and exited with code 0 was asked to stop (a worker's
        warm shutdown on SIGTERM): it is restarted after the first delay, not counted as a
        crash. One that exits 0 at once is a crash like any other, so a loop shows.
        """
        pid, uptime = child.pid, time.monotonic() - child.started_at
        self.reap_group(pid)
        if child.process.returncode == 0 and uptime >= QUICK_CRASH_S:
            child.backoff, child.restart_at = Backoff(), time.monotonic() + FIRST_DELAY_S
            self.say(
                f"{child.name} (pid {pid}) stopped cleanly (exit code 0) after {uptime:.0f} s "
                f"up; restarting it in {FIRST_DELAY_S:g} s"
            )
            return
        child.backoff = child.backoff.after_crash(uptime)
        child.restart_at = time.monotonic() + child.backoff.delay
        self.say(
            f"{child.name} (pid {pid}) {describe_exit(child.process.returncode)} after "
            f"{uptime:.0f} s up; restarting it in {child.backoff.delay:g} s "
            f"(crash {child.backoff.crashes} in a row; log {child.log_path})"
        )
        if child.backoff.crash_looping:
            self.report_crash_loop(child)

    def report_crash_loop(self, child):
        self.say(
            f"{child.name} keeps crashing: it died within {QUICK_CRASH_S:.0f} s of starting "
            f"{child.backoff.quick_crashes} times in a row. Still retrying, every "
            f"{child.backoff.delay:g} s; the rest keeps running. The end of its log:\n"
            f"{child.log_tail()}",
            loud=True,
        )

    def stop(self, timeout=10):
        """Ask every group to stop (SIGTERM), kill what is left after `timeout` seconds."""
        groups = list(self.groups)
        for pgid in groups:
            signal_group(pgid, signal.SIGTERM)
        left = self.wait_gone(groups, timeout)
        for pgid in left:
            signal_group(pgid, signal.SIGKILL)
        self.wait_gone(left, GROUP_GONE_TIMEOUT_S)

    def reap_group(self, pgid):
        """Kill what is left of a crashed child's group (a beat or pool child) and wait for it."""
        signal_group(pgid, signal.SIGKILL)
        self.wait_gone([pgid], GROUP_GONE_TIMEOUT_S)

    def wait_gone(self, groups, timeout):
        """Reap until no process of these groups is left or `timeout` passes; return those left."""
        deadline = time.monotonic() + timeout
        while True:
            self.collect()
            groups = [pgid for pgid in groups if group_alive(pgid)]
            if not groups or time.monotonic() >= deadline:
                return groups
            time.sleep(0.05)

    def collect(self):
        """Reap the exited processes of the children's groups, recording a leader's status."""
        leaders = {child.pid: child for child in self.children if child.running}
        for pgid in list(self.groups):
            for pid, status in exited_in_group(pgid):
                if pid in leaders:
                    leaders[pid].process.returncode = os.waitstatus_to_exitcode(status)
            if not group_alive(pgid):
                self.groups.discard(pgid)


def signal_group(pgid, signum):
    """Send a signal to every process of a group; a group already gone is fine."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def exited_in_group(pgid):
    """Yield (pid, wait status) of each exited process of the group that is ours to reap."""
    while True:
        try:
            pid, status = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def group_alive(pgid):
    """True while any process (a zombie not yet reaped included) is left in the group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def keep_private(var_dir, storage_root, files):
    """Keep the embedded hub's data to its own user: what its processes create from now on
    (umask 077, inherited by every child), and what an earlier start left readable.

    The database, the broker's messages, uploaded models and the logs are nobody
    else's business on a shared machine: folders become 0700 (var/ and each folder in
    it, the storage root), files 0600.
    """
    os.umask(0o077)
    folders = [var_dir, storage_root]
    if var_dir.is_dir():
        folders += [path for path in var_dir.iterdir() if path.is_dir()]
    for folder in folders:
        if folder.is_dir():
            folder.chmod(0o700)
    for path in files:
        if path.is_file():
            path.chmod(0o600)


def die_with_parent():
    """Ask Linux to stop this child when run_embedded dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def adopt_orphans():
    """Make this process the parent of its children's orphans, so it can reap them (Linux)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
