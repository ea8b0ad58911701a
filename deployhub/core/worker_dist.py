"""The worker this hub speaks, as the wheel devices install from the hub itself.

`GET /downloads/deployhub-<version>-py3-none-any.whl` serves the deployhub distribution built
from the source this hub runs (the project root holding pyproject.toml), so
`pip install "deployhub[worker] @ <hub>/downloads/deployhub-<version>-py3-none-any.whl"` puts
on a device exactly the worker code the hub was started with, whatever PyPI or an old
checkout holds. It is built on first request, once per version and source (a digest of the
files that go in), and kept under var/worker-wheel/; a lock makes concurrent first requests,
in any of the hub's processes, build it once. A hub installed as a package, with no source
beside it, serves the wheel DEPLOYHUB_WORKER_WHEEL names instead.

No sign-in: a device has no session, and the wheel holds only the code the hub runs.
"""

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from packaging.version import InvalidVersion, Version

from workers.version import OLDEST_PROTOCOL, PROTOCOL, worker_version

logger = logging.getLogger(__name__)

# What the wheel is built from, beside its packages: what pyproject.toml reads.
PROJECT_FILES = ("pyproject.toml", "README.md", "LICENSE")
# The worker, and the client a pipeline installs from the same wheel (deployhub[client]).
PACKAGES = ("deployhub", "workers", "deployhub_client")
# Built wheels of this many versions or sources are kept (a rolling restart serves two).
KEPT_BUILDS = 3
BUILD_SECONDS = 600
BUILD = "import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])"


class WheelUnavailable(Exception):
    """The hub cannot serve its worker wheel (HTTP 503); the message says what to do."""


@dataclass(frozen=True)
class Wheel:
    path: Path
    sha256: str


def wheel_name():
    """The file name of this hub's wheel: deployhub-<version>-py3-none-any.whl."""
    return f"deployhub-{worker_version()}-py3-none-any.whl"


def wheel_url(base):
    """Where the hub at `base` serves the wheel of its own version, a worker that speaks its
    protocol."""
    return f"{base.rstrip('/')}/downloads/{wheel_name()}"


def install_command(base):
    """The pip command that installs a device's worker from the hub at `base`."""
    return f'pip install "deployhub[worker] @ {wheel_url(base)}"'


def speaks(protocol):
    """Tell whether this hub serves a worker speaking `protocol`."""
    return OLDEST_PROTOCOL <= protocol <= PROTOCOL


def refusal(protocol, base):
    """What a worker speaking a protocol this hub does not is answered (HTTP 426)."""
    return (
        f"This hub speaks device protocol {OLDEST_PROTOCOL}–{PROTOCOL}; this worker speaks "
        f"{protocol}. Install the hub's worker: {install_command(base)}"
    )


def older_than_hub(version):
    """Tell whether a worker's version is older than the hub's; False when either is unknown."""
    try:
        return bool(version) and Version(version) < Version(worker_version())
    except InvalidVersion:
        return False


_lock = threading.Lock()
_wheels: dict[tuple, Any] = {}  # (prebuilt setting, var folder) -> Wheel, once per process
# The same key -> (when, WheelUnavailable): a failed build is not retried at once.
_failures: dict[tuple, tuple[float, Exception]] = {}
# Anyone may ask for the wheel: a build that failed is said again for this long before the
# next try, and a request waits this long for another's build before it is told to come back.
RETRY_FAILED_BUILD_S = 60
BUILD_WAIT_S = 30


def worker_wheel():
    """Return this hub's worker Wheel: DEPLOYHUB_WORKER_WHEEL's, else built from source once.

    Raises WheelUnavailable, saying why, when there is neither (for a minute, without trying
    again), or when another request's build is still running.
    """
    key = (settings.DEPLOYHUB_WORKER_WHEEL, str(settings.VAR_DIR))
    if not _lock.acquire(timeout=BUILD_WAIT_S):
        raise WheelUnavailable("The worker wheel is being built: ask again in a minute.")
    try:
        wheel = _wheels.get(key)
        if wheel is None or not wheel.path.is_file():
            _wheels[key] = wheel = _wheel_or_failure(key)
        return wheel
    finally:
        _lock.release()


def _wheel_or_failure(key):
    """Find or build the wheel; a failure is kept and raised again for a minute."""
    failed_at, failure = _failures.get(key, (0.0, None))
    if failure is not None and time.monotonic() - failed_at < RETRY_FAILED_BUILD_S:
        raise failure
    prebuilt = settings.DEPLOYHUB_WORKER_WHEEL
    try:
        wheel = _prebuilt(Path(prebuilt)) if prebuilt else _from_source(settings.BASE_DIR)
    except WheelUnavailable as exc:
        _failures[key] = (time.monotonic(), exc)
        raise
    _failures.pop(key, None)
    return wheel


def _prebuilt(path):
    """The wheel DEPLOYHUB_WORKER_WHEEL names, once its version is found to be the hub's."""
    if not path.is_file():
        raise WheelUnavailable(f"DEPLOYHUB_WORKER_WHEEL names {path}, which is not a file.")
    version = wheel_version(path)
    if version != worker_version():
        raise WheelUnavailable(
            f"DEPLOYHUB_WORKER_WHEEL is deployhub {version}, and this hub is deployhub "
            f"{worker_version()}: point it at the wheel this hub was installed from."
        )
    return Wheel(path, _sha256(path))


def wheel_version(path):
    """Return the Version field of a wheel's METADATA; raise WheelUnavailable if it has none."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            metadata = archive.read(name).decode("utf-8", "replace")
    except (zipfile.BadZipFile, StopIteration, OSError) as exc:
        raise WheelUnavailable(f"{path.name} is not a wheel with METADATA.") from exc
    for line in metadata.splitlines():
        if line.startswith("Version:"):
            return line.removeprefix("Version:").strip()
    raise WheelUnavailable(f"{path.name}'s METADATA names no version.")


def _from_source(root):
    """Build the wheel from the source at `root` unless a build of the same files is kept."""
    root = Path(root)
    if not (root / "pyproject.toml").is_file():
        raise WheelUnavailable(
            "This hub runs from an installed package, with no source to build its worker from: "
            "set DEPLOYHUB_WORKER_WHEEL to the deployhub wheel it was installed from."
        )
    files = source_files(root)
    builds = Path(settings.VAR_DIR) / "worker-wheel"
    folder = builds / f"{worker_version()}-{_digest(root, files)}"
    target = folder / wheel_name()
    builds.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _exclusive(builds / "build.lock"):  # another process may be building it now
        if not target.is_file():
            _build(root, files, target)
            _forget_older(builds)
    return Wheel(target, _sha256(target))


def source_files(root):
    """The files under `root` a wheel is built from, relative: no caches, no compiled files."""
    found = [Path(name) for name in PROJECT_FILES if (root / name).is_file()]
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            relative = path.relative_to(root)
            if path.is_file() and "__pycache__" not in relative.parts and path.suffix != ".pyc":
                found.append(relative)
    return found


def _digest(root, files):
    """A short digest of the files' names and bytes: a changed source is a new build."""
    digest = hashlib.sha256()
    for relative in files:
        digest.update(f"{relative.as_posix()}\0".encode())
        digest.update((root / relative).read_bytes())
    return digest.hexdigest()[:16]


def _build(root, files, target):
    """Build the wheel from a copy of the source (the checkout stays untouched) into target."""
    with tempfile.TemporaryDirectory(dir=target.parent.parent) as scratch:
        source, out = Path(scratch) / "source", Path(scratch) / "wheel"
        for relative in files:
            (source / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / relative, source / relative)
        done = subprocess.run(
            [sys.executable, "-c", BUILD, str(out)],
            cwd=source,
            capture_output=True,
            text=True,
            timeout=BUILD_SECONDS,
        )
        built = out / wheel_name()
        if done.returncode != 0:
            logger.error("Building the worker wheel failed:\n%s", done.stderr[-4000:])
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise WheelUnavailable(f"This hub could not build its worker wheel: {last[:300]}")
        if not built.is_file():
            names = ", ".join(p.name for p in out.glob("*.whl")) or "nothing"
            raise WheelUnavailable(
                f"The hub's source builds {names}, not {wheel_name()}: this hub runs as "
                f"deployhub {worker_version()}; reinstall it after changing its version "
                "(make run, or pip install -e .)."
            )
        target.parent.mkdir(mode=0o700, exist_ok=True)
        os.replace(built, target)


def _forget_older(builds):
    """Remove all but the KEPT_BUILDS newest builds."""
    folders = sorted(
        (p for p in builds.iterdir() if p.is_dir() and not p.name.startswith("tmp")),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for folder in folders[KEPT_BUILDS:]:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _exclusive(path):
    """Hold an exclusive lock on `path` (any process of the hub), created if need be."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
