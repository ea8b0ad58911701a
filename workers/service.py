"""`deployhub-worker service`: the systemd unit that runs this machine's worker.

The unit runs `deployhub-worker run` as an unprivileged user, reading the hub and the
device token from the config file `enroll` wrote (never from its command line), restarts
it with a growing delay, and confines it: read-only system and homes, writable only
where jobs work. `--install` writes it to /etc/systemd/system and hands the config file
to that user; systemctl is left to the operator.
"""

import os
import pwd
import sys
import tempfile
from pathlib import Path

from workers import config

UNIT_NAME = "deployhub-worker.service"
UNIT_FOLDER = "etc/systemd/system"
# For tests (and image builds): a folder that stands for / when installing, as any user.
ROOT_ENV = "DEPLOYHUB_SERVICE_ROOT"
DEFAULT_USER = "deployhub"
# Made by systemd for the unit's user: its home (state) and the jobs' scratch space (cache).
STATE_FOLDER = "/var/lib/deployhub-worker"
CACHE_FOLDER = "/var/cache/deployhub-worker"
SYSTEMCTL = ("systemctl daemon-reload", "systemctl enable --now deployhub-worker")

UNIT = """\
# The DeployHub device worker, written by `deployhub-worker service`.
[Unit]
Description=DeployHub device worker{about}
Wants=network-online.target
After=network-online.target
# Never give up restarting: a hub away for an hour must not leave the device off for good.
StartLimitIntervalSec=0

[Service]
Type=simple
User={user}
# The hub and the device token come from the config file, never the command line (ps).
Environment=DEPLOYHUB_WORKER_CONFIG={config}
Environment=HOME={state} PYTHONUNBUFFERED=1
# Job scratch space when the config names no workdir (not /tmp, which may be in memory).
Environment=TMPDIR={cache}
ExecStart={command} run
WorkingDirectory={state}
StateDirectory=deployhub-worker
CacheDirectory=deployhub-worker
StateDirectoryMode=0700
CacheDirectoryMode=0700
UMask=0077
# Back off from 5 s to 5 min between restarts (RestartSteps needs systemd 254; an older one
# says it ignores the two keys, and waits 5 s each time).
Restart=always
RestartSec=5s
RestartSteps=10
RestartMaxDelaySec=5min
# Exit 2: the hub refused this device (revoked, or its token replaced by a new enrolment).
# Restarting changes nothing: enrol again, then systemctl restart deployhub-worker.
RestartPreventExitStatus=2
# SIGTERM to the worker, which stops between jobs; whatever is left is killed after 2 min.
KillMode=mixed
TimeoutStopSec=2min
# Confinement. No device policy: the worker needs /dev/nvidia* on a GPU host.
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
{writable}ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
LockPersonality=yes

[Install]
WantedBy=multi-user.target
"""


class ServiceError(Exception):
    """The unit cannot be installed here; nothing was written."""


def unit_text(user, config_path, saved=None, command=None):
    """Return the unit that runs `command run` as user with the config at config_path.

    saved is the config (for the description and its workdir, made writable);
    command is the worker's command line, this installation's by default.
    """
    saved = saved or {}
    about = ""
    if saved.get("name"):
        about = f" {saved['name']} ({saved.get('device_class')}) for {saved.get('hub')}"
    workdir = saved.get("workdir")
    return UNIT.format(
        about=about,
        user=user,
        config=_quoted(str(config_path)),
        state=STATE_FOLDER,
        cache=CACHE_FOLDER,
        command=" ".join(_quoted(word) for word in (command or worker_command())),
        writable=f"ReadWritePaths={_quoted(workdir)}\n" if workdir else "",
    )


def worker_command():
    """Return this installation's worker command: the deployhub-worker script beside this
    Python (its virtual environment), else this Python running the package."""
    script = Path(sys.executable).parent / "deployhub-worker"
    return [str(script)] if script.exists() else [sys.executable, "-m", "workers"]


def default_user(config_path):
    """The user the worker runs as: the config file's owner unless that is root, else
    DEFAULT_USER."""
    try:
        owner = Path(config_path).stat().st_uid
    except FileNotFoundError:
        return DEFAULT_USER
    return pwd.getpwuid(owner).pw_name if owner != 0 else DEFAULT_USER


def install(text, user, config_path, saved):
    """Write the unit to /etc/systemd/system (under $DEPLOYHUB_SERVICE_ROOT for tests), give
    the config file to user, and return (the unit's path, notes for the operator)."""
    root = os.environ.get(ROOT_ENV)
    if not root and os.geteuid() != 0:
        raise ServiceError("--install writes to /etc/systemd/system: run it as root (sudo)")
    account = _account(user)
    if saved is None:
        raise ServiceError(f"there is no config file at {config_path}: enrol first")
    _give_config(Path(config_path), account)
    notes = _prepare_workdir(saved.get("workdir"), account)
    target = Path(root or "/") / UNIT_FOLDER / UNIT_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_public(target, text)
    return target, notes


def _account(user):
    """Return the passwd entry of user; ServiceError saying how to create it when missing."""
    try:
        return pwd.getpwnam(user)
    except KeyError:
        create = f"useradd --system --home-dir {STATE_FOLDER} --shell /usr/sbin/nologin {user}"
        message = f"there is no user {user}: create it ({create}) or name another with --user"
        raise ServiceError(message) from None


def _give_config(config_path, account):
    """Make the account own the config file (still 0600), and its folder (0700) when that is
    the worker's own (named deployhub), never a shared one such as /etc."""
    _give(config_path, account)
    if config_path.parent.name == config.USER_FOLDER:
        _give(config_path.parent, account)


def _prepare_workdir(workdir, account):
    """Create a missing workdir for the account; return notes on one it may not write."""
    if not workdir:
        return []
    path = Path(workdir)
    if not path.exists():
        path.mkdir(parents=True, mode=0o700)
        _give(path, account)
        return []
    mode = path.stat()
    if mode.st_uid != account.pw_uid and not mode.st_mode & 0o002:
        return [
            f"{account.pw_name} may not write the workdir {path}: chown {account.pw_name} {path}"
        ]
    return []


def _give(path, account):
    """Make account the owner of path (its mode unchanged)."""
    stat = path.stat()
    if (stat.st_uid, stat.st_gid) != (account.pw_uid, account.pw_gid):
        os.chown(path, account.pw_uid, account.pw_gid)


def _write_public(path, text):
    """Write text to path by rename, mode 0644 (systemd reads units as any user)."""
    descriptor, partial = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)
    os.chmod(partial, 0o644)
    os.replace(partial, path)


def _quoted(word):
    """Quote a word for a unit file when it has a space or a quote."""
    if not any(char in word for char in " \t\"'\\"):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
