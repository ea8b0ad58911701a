"""A worker installed as a device installs it: from the hub's wheel alone, into a fresh
virtual environment with no checkout on its path.

The worker's dependencies are not downloaded (gigabytes, and the test machine may be
offline): the new environment sees those of make run's `.venv`, through a folder of links
to its site-packages that leaves out this checkout's editable install (its `__editable__`
finder and the deployhub metadata), Django, pip and setuptools. pip then installs
`deployhub[worker] @ <the hub's URL>` with no index: it resolves the worker extra against
those links, so an extra that needed something make run lacks (or Django) fails here, and
the worker's code comes from the hub's wheel only.
"""

import os
import subprocess
from pathlib import Path

from deployhub.core.worker_dist import wheel_url as hub_wheel_url
from tests.conftest import run_python

# What of .venv's site-packages the new environment must not see.
HIDDEN = ("__editable__", "deployhub", "django", "pip", "setuptools", "_distutils_hack")
# Settings of this process that would reach into the checkout or the test run.
UNSET = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE", "PYTHONSTARTUP")


def clean_env():
    """This process's environment less what points into the checkout, and no pip settings."""
    return {
        name: value
        for name, value in os.environ.items()
        if name not in UNSET and not name.startswith("PIP_")
    }


def run(command, cwd, timeout=300):
    """Run a command in the new environment's world; fail with its output when it fails."""
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def installed_worker(hub_url, folder, wheel_url=None):
    """Install the hub's worker into a new virtual environment under folder; return its python.

    The install line is the one the hub shows (deployhub[worker] @ its wheel's URL); cwd is
    folder, so nothing of the checkout is importable but through what pip installed.

    Start that worker by its script, `python.parent / "deployhub-worker"`, or by
    `python -m workers` with a cwd outside the checkout and clean_env(): `-m` from the
    checkout's root (where conftest's WorkerProcess runs) imports the checkout's `workers`.
    """
    folder = Path(folder)
    venv = folder / "device-venv"
    run([run_python(), "-m", "venv", venv], cwd=folder)
    python = venv / "bin" / "python"
    dependencies = _dependency_links(folder / "make-run-dependencies")
    (site_packages(python) / "make_run_dependencies.pth").write_text(f"{dependencies}\n")
    requirement = f"deployhub[worker] @ {wheel_url or hub_wheel_url(hub_url)}"
    run([python, "-m", "pip", "install", "--no-index", "--no-cache-dir", requirement], folder)
    return python


def site_packages(python):
    """The site-packages folder of an environment, by its python."""
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    return Path(run([python, "-c", code], cwd="/").strip())


def _dependency_links(folder):
    """A folder of links to each package in .venv's site-packages but the HIDDEN ones."""
    source = site_packages(run_python())
    folder.mkdir()
    for entry in source.iterdir():
        if entry.suffix == ".pth" or entry.name == "__pycache__" or _hidden(entry.name):
            continue
        (folder / entry.name).symlink_to(entry)
    return folder


def _hidden(name):
    """True for a HIDDEN package, its metadata, or its modules (django-5.2.19.dist-info)."""
    lowered = name.lower()
    return any(lowered == h or lowered.startswith((f"{h}-", f"{h}.", h + "_")) for h in HIDDEN)
