"""Job scratch folders: one per attempt, named after the worker process that made it.

A worker killed mid-job (kill -9, an OOM kill, a power cut) cannot remove its
folder, which may hold a whole build (90 MB after a ResNet-18 compile). The name
says which process made it, `job-<job>-<pid>.<start>-<random>`, with the process's
start time in centiseconds, so a worker starting later on the host removes the
folders whose maker is gone and leaves those of the live workers beside it alone.
"""

import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import psutil

NAME = re.compile(r"^job-\d+-(?P<pid>\d+)\.(?P<started>\d+)-")


@contextmanager
def scratch_dir(job_id, root=None):
    """Yield a fresh folder for one attempt of a job, under root (system temp by default), and
    remove it afterwards."""
    if root is not None:
        Path(root).mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"job-{job_id}-{owner_tag(os.getpid())}-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def owner_tag(pid):
    """Name a process as `<pid>.<start time in centiseconds>`: a pid taken again later differs."""
    return f"{pid}.{round(psutil.Process(pid).create_time() * 100)}"


def remove_dead(root=None):
    """Remove the scratch folders under root whose maker process is gone; return (path, bytes)
    for each.

    Only folders named by scratch_dir and owned by this user are considered; one is
    kept while its maker runs (same pid, same start time), so a live worker's job
    on this host is never touched.
    """
    base = Path(root) if root is not None else Path(tempfile.gettempdir())
    if not base.is_dir():
        return []
    removed = []
    for path in base.iterdir():
        match = NAME.match(path.name)
        if match and _ours(path) and not _running(int(match["pid"]), int(match["started"])):
            size = _size(path)
            shutil.rmtree(path, ignore_errors=True)
            removed.append((path, size))
    return removed


def _ours(path):
    """True for a real folder (not a link) of this user."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return path.is_dir() and not path.is_symlink() and info.st_uid == os.getuid()


def _running(pid, started):
    """True while the process that made a folder runs: its pid is live, not a zombie, and was
    started at the recorded time (one centisecond either way, for rounding)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(round(process.create_time() * 100) - started) <= 1
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: not ours to judge, keep its folder
        return True


def _size(path):
    """Total bytes of the files under path."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total
