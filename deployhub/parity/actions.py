"""Queue a parity check: validate the pack, store it, and send a parity job to a worker."""

import math
from pathlib import Path

from deployhub.core.store import placed, workspace
from deployhub.devices.models import Device
from deployhub.jobs.actions import submit_job
from deployhub.jobs.models import JobKind
from deployhub.parity import packs
from deployhub.parity.models import ParityRun, pack_upload_path
from deployhub.registry.archives import check_filename
from deployhub.registry.uploads import read_in_child, received
from deployhub.teams.access import require_role
from deployhub.teams.models import Event, Role
from workers.checks.parity import PackError, pack_format


def default_device_class(team):
    """Return the team's first device class with a worker online, else its first class."""
    classes = list(team.device_classes.all())
    online = set(
        Device.objects.online()
        .filter(device_class__team=team, draining=False)
        .values_list("device_class_id", flat=True)
    )
    return next((dc for dc in classes if dc.pk in online), classes[0] if classes else None)


def check_tolerance(value):
    """Return a tolerance as a float (None for the default), or raise PackError."""
    if value in (None, ""):
        return None
    try:
        tolerance = float(value)
    except (TypeError, ValueError):
        tolerance = math.nan
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise PackError(f"tolerance must be a positive number, not {value!r}.")
    return tolerance


def submit_parity(version, uploaded_file, user, *, device_class=None, tolerance=None):
    """Check a parity pack against the version, store it, queue a parity job; return the run."""
    require_role(user, version.team, Role.ENGINEER)
    if not version.preprocessing:
        raise PackError(
            f"{version} has no preprocessing spec to check: add one (as a new version) first."
        )
    device_class = device_class or default_device_class(version.team)
    if device_class is None:
        raise PackError("No device class to run the check on: create one and register a device.")
    tolerance = check_tolerance(tolerance)
    filename = check_filename(Path(uploaded_file.name or "").name)
    if not filename.lower().endswith(".zip"):
        raise PackError(f"{filename!r} is not a .zip. {pack_format()}")
    with received(uploaded_file) as (path, sha256, size), workspace() as work:
        params = packs.pack_params(version)
        facts = read_in_child(
            packs.KIND, path, work, params, refusal=PackError, module=packs.__name__
        )
        run = ParityRun(
            model_version=version,
            original_filename=filename,
            sha256=sha256,
            size=size,
            samples=facts["samples"],
            sample_names=facts["names"],
            tolerance=tolerance,
            created_by=user,
        )
        return _store(run, path, device_class)


def _store(run, path, device_class):
    """Place the pack and save the run with its queued job; remove a new file if that fails."""
    run.file.name = pack_upload_path(run, "")
    params = {"spec": run.model_version.preprocessing}
    if run.tolerance is not None:
        params["tolerance"] = run.tolerance
    with placed(path, run.file.name):
        run.job = submit_job(
            team=run.team,
            kind=JobKind.PARITY,
            device_class=device_class,
            user=run.created_by,
            model_version=run.model_version,
            params=params,
        )
        run.save()
        Event.record(run.team, run.created_by, "parity.queued", run, job=run.job.pk, after="queued")
    return run


def no_worker_warning(device_class):
    """Say so when no worker of the class is online (the job waits for one), else ""."""
    if device_class.online_devices().exists():
        return ""
    return f"No worker of class {device_class} is online: the check waits until one connects."
