"""Enrolment: this machine registers itself with an enrolment token and keeps its device token.

`deployhub-worker enroll` calls `POST /api/v1/enrol` (docs/protocol.md) and writes the
hub's answer to the config file (workers/config.py) that `run` reads. The machine is
known to the hub by a stable id, so enrolling again from it gives the same device.
"""

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from workers import config
from workers.client import HubClient, HubError


class EnrolmentError(Exception):
    """Enrolment cannot start here: nothing was sent and nothing written."""


def enrol(hub, token, name=None, workdir=None, config_path=None, fingerprint=None):
    """Enrol this machine at hub with an enrolment token; return (written config, its path,
    the hub's answer).

    Nothing is written unless the hub enrolled the device: a refused token raises
    the client's HubError (Unauthorized for 401 and 403) and leaves no file.
    """
    path = Path(config_path) if config_path else config.default_path()
    _check_hub(hub)
    _check_writable(path)
    machine, new = config.machine_id(path)
    client = HubClient(hub)
    answer = client.enrol(token, name or default_name(), machine, fingerprint)
    saved = _device_config(hub, answer, workdir)
    config.save(saved, path)
    if new:
        config.keep_machine_id(machine, path)
    return saved, path, answer


def _device_config(hub, answer, workdir):
    """The config file's fields from the hub's answer; HubError when the answer lacks them."""
    try:
        device = answer["device"]
        return {
            "hub": hub.rstrip("/"),
            "token": answer["token"],
            "workdir": str(Path(workdir).expanduser().absolute()) if workdir else None,
            "device": device["id"],
            "name": device["name"],
            "device_class": device["device_class"],
        }
    except (KeyError, TypeError) as error:
        message = f"the hub's enrolment answer has no {error}: is it a DeployHub hub?"
        raise HubError(None, message) from error


def default_name():
    """The device's name when none is given: DEPLOYHUB_DEVICE_NAME, else the host's name."""
    return os.environ.get("DEPLOYHUB_DEVICE_NAME") or socket.gethostname()


def summary(saved, path, answer):
    """The one line that says which device of which class this machine became, and where the
    config went."""
    again = not answer.get("created", True)
    return (
        f"enrolled{' again' if again else ''} as device {saved['name']} (#{saved['device']}) of "
        f"class {saved['device_class']} at {saved['hub']}; config written to {path}"
        + ("; the device's previous token no longer works" if again else "")
    )


def _check_hub(hub):
    """Refuse a hub that is not an http(s) URL, before anything is sent."""
    parts = urlsplit(hub or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EnrolmentError(
            f"--hub must be the hub's URL, such as https://hub.example.com, not {hub!r}"
        )


def _check_writable(path):
    """Refuse a config path this user cannot write, before the hub spends a token use on it."""
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        hint = " (run as root, or set DEPLOYHUB_WORKER_CONFIG or --config)" if os.geteuid() else ""
        raise EnrolmentError(f"cannot write the config file {path}: {folder} is not writable{hint}")
