"""The worker's config file: which hub, this device's token and where it works.

`deployhub-worker enroll` writes it; `run` and `fetch-production` read what their flags
and environment leave out. JSON, mode 0600 in a 0700 folder:
`{"hub": url, "token": "dht_...", "workdir": path or null, "device": id, "name": ...,
"device_class": slug}`, at `$DEPLOYHUB_WORKER_CONFIG`, else `/etc/deployhub/worker.json`
for root, else `${XDG_CONFIG_HOME:-~/.config}/deployhub/worker.json`.
"""

import contextlib
import hashlib
import hmac
import json
import os
import tempfile
import uuid
from pathlib import Path

CONFIG_ENV = "DEPLOYHUB_WORKER_CONFIG"
SYSTEM_PATH = Path("/etc/deployhub/worker.json")
USER_FOLDER = "deployhub"
FILENAME = "worker.json"
FIELDS = ("hub", "token", "workdir", "device", "name", "device_class")
# systemd's and D-Bus's id of this installation of the OS, in the order systemd reads them.
MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))
# Where a machine without either keeps the random id it made up, beside the config.
MACHINE_ID_FILENAME = "machine-id"
# The machine id is sent hashed with this key, as systemd asks of applications: the hub never
# learns the raw id, which other software on the host uses too.
MACHINE_ID_APP_KEY = b"deployhub-worker"


class ConfigError(Exception):
    """The config file is there but is not a worker config."""


def default_path(environ=None, euid=None):
    """Return where the config file is: $DEPLOYHUB_WORKER_CONFIG, /etc for root, else the
    user's XDG config folder."""
    environ = os.environ if environ is None else environ
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV]).expanduser()
    if (os.geteuid() if euid is None else euid) == 0:
        return SYSTEM_PATH
    base = environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / USER_FOLDER / FILENAME


def load(path=None):
    """Return the config at path (default_path() when None), or None when there is none.

    Raise ConfigError when the file is not a JSON object with a hub and a token,
    OSError when it cannot be read.
    """
    path = Path(path) if path is not None else default_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        config = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"{path} is not JSON ({error}): enrol again to rewrite it") from error
    if not isinstance(config, dict) or not all(
        isinstance(config.get(key), str) and config[key] for key in ("hub", "token")
    ):
        raise ConfigError(f"{path} has no hub and token: enrol again to rewrite it")
    return config


def readable_by_others(path):
    """Tell whether users other than the owner may read the file at path."""
    return bool(Path(path).stat().st_mode & 0o077)


def save(config, path=None):
    """Write config to path atomically, mode 0600, creating its folder with mode 0700.

    Readers see the old file or the new one, never half of one. A file that was
    there keeps its owner (root re-enrolling keeps the service user's file readable
    by that user).
    """
    path = Path(path) if path is not None else default_path()
    fields = {key: config.get(key) for key in FIELDS}
    _write_private(path, json.dumps(fields, indent=2) + "\n")
    return path


def machine_id(config_path=None):
    """Return (this machine's id for the hub, whether it is new).

    The OS's machine id (hashed for this application) when the host has one;
    else the random id kept beside the config by an earlier enrolment; else a
    fresh one, new: keep it with keep_machine_id() once the hub has taken it, so
    enrolling again from this machine gives the same device.
    """
    for candidate in MACHINE_ID_FILES:
        raw = _read_stripped(candidate)
        if raw and raw != "uninitialized":  # systemd's word for an id not yet committed
            return hmac.new(raw.encode(), MACHINE_ID_APP_KEY, hashlib.sha256).hexdigest()[
                :32
            ], False
    kept = _read_stripped(machine_id_path(config_path))
    if kept:
        return kept, False
    return uuid.uuid4().hex, True


def machine_id_path(config_path=None):
    """Return the file beside the config where a made-up machine id is kept."""
    config_path = Path(config_path) if config_path is not None else default_path()
    return config_path.with_name(MACHINE_ID_FILENAME)


def keep_machine_id(value, config_path=None):
    """Keep a made-up machine id beside the config (mode 0600), for the next enrolment."""
    _write_private(machine_id_path(config_path), value + "\n")


def _read_stripped(path):
    """Return the file's text without surrounding whitespace, or "" when it is not there."""
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return ""


def _write_private(path, text):
    """Write text to path by rename, mode 0600, in a folder made 0700 when this creates it."""
    folder = path.parent
    if not folder.exists():
        folder.mkdir(parents=True, mode=0o700)
        folder.chmod(0o700)  # whatever the umask
    descriptor, partial = tempfile.mkstemp(prefix=f".{path.name}-", dir=folder)  # mode 0600
    try:
        with os.fdopen(descriptor, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        _keep_owner(path, partial)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        raise


def _keep_owner(path, partial):
    """Give the new file the owner of the one it replaces, when root writes it."""
    try:
        old = path.stat()
    except FileNotFoundError:
        return
    if os.geteuid() == 0 and (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
        os.chown(partial, old.st_uid, old.st_gid)
