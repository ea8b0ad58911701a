"""The `deployhub-worker` command: run a device worker, show its fingerprint, self-test,
fetch the production engines this device may run."""

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from workers import config, enrolment, fingerprint, https_mode, scratch, selftest, service, signing
from workers.app import CONTEXT, app, configure
from workers.backends.known import BACKENDS, UnknownBackend
from workers.client import (
    RETRY_STATUSES,
    HubClient,
    HubError,
    HubUnreachable,
    HubUntrusted,
    Unauthorized,
)
from workers.config import ConfigError
from workers.enrolment import EnrolmentError
from workers.errors import JobError
from workers.service import ServiceError

logger = logging.getLogger("workers.cli")

DEFAULT_BROKER = "filesystem://var/broker"
HTTPS, BROKER = "https", "broker"
HUB_WAIT_SECONDS = 60
HUB_WAIT_PAUSE_SECONDS = 2
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
TOKEN_REQUIRED = (
    "--hub and --token are required (or DEPLOYHUB_HUB_URL, and DEPLOYHUB_DEVICE_TOKEN or "
    "--token-file)"
)
# A container's first start enrols with it (docker-compose.yml's https-worker), then reads the
# config file it wrote.
ENROLMENT_TOKEN_ENV = "DEPLOYHUB_ENROLMENT_TOKEN"
TOKEN_IN_ARGV = (
    "--token puts the device token where every user of this machine reads it (ps): "
    "set DEPLOYHUB_DEVICE_TOKEN or use --token-file instead"
)


def main(argv=None):
    """Run the command line; return the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    return args.func(args)


def run(args):
    """Serve this device's work until stopped (SIGTERM or Ctrl-C): over HTTPS, or from the
    broker when one is given (--broker, CELERY_BROKER_URL) or --mode broker says so."""
    client = _hub_client(args)
    if client is None:
        return 2
    _remove_dead_scratch(args.workdir)
    CONTEXT.delivery = _delivery(args)
    try:
        device = _wait_for_hub(client)
        CONTEXT.fingerprint = _fingerprint(args.fingerprint_override)
        client.heartbeat(CONTEXT.fingerprint, delivery=CONTEXT.delivery)
    except Unauthorized as error:
        _say(f"the hub refused this token: {error.message}")
        return 2
    except HubUntrusted as error:  # no wait mends it: the operator gives the CA
        _say(error.message)
        return 1
    except HubUnreachable as error:
        _say(f"gave up after waiting {HUB_WAIT_SECONDS} s: {error}")
        return 1
    except HubError as error:
        _say(f"cannot start: {error}")
        return 1
    CONTEXT.client, CONTEXT.workdir = client, args.workdir
    CONTEXT.signing_public_key = device.get("signing_public_key")
    if not CONTEXT.signing_public_key:
        _say("the hub sent no signing_public_key: jobs that load an engine will fail")
    stop = _start_device_heartbeat(client, device, args.fingerprint_override)
    try:
        if CONTEXT.delivery == HTTPS:
            return _ask_for_work(client, device, args.hub)
        _consume(device, args.broker or DEFAULT_BROKER)
    finally:
        stop.set()
    return 0


def _delivery(args):
    """How this worker takes work: --mode, else the broker when a broker URL is given."""
    return args.mode or (BROKER if args.broker else HTTPS)


def _ask_for_work(client, device, hub):
    """HTTPS mode: ask the hub for this device's jobs and run them (workers/https_mode.py)."""
    print(
        f"deployhub-worker: device {device['name']} (class {device['device_class']}) "
        f"ready: asking {hub} for work over HTTPS",
        flush=True,
    )
    asker = https_mode.Asker(client, CONTEXT)
    asker.stop_on_signals()
    try:
        asker.serve()
    except Unauthorized as error:
        _say(f"the hub refused this device: {error.message}")
        return 2
    except HubError as error:
        _say(f"stopped: {error}")
        return 1
    return 0


def _hub_client(args):
    """Return a client of the hub for this device, or None after saying what is missing.

    The token is --token, --token-file or DEPLOYHUB_DEVICE_TOKEN, else the config file's
    (`enroll` wrote it), whose hub and workdir fill in what --hub and --workdir (or their
    variables) leave out.
    """
    try:
        token = _token(args)
    except OSError as error:
        _say(f"cannot read the token file: {error}")
        return None
    try:
        token = token or _enrolled_token(args)
    except (OSError, ConfigError, EnrolmentError, HubError) as error:
        _say(f"cannot start: {error}")
        return None
    if not args.hub or not token:
        _say(
            f"{TOKEN_REQUIRED}; or enrol this machine first (deployhub-worker enroll, or "
            f"{ENROLMENT_TOKEN_ENV} for a container's first start)"
        )
        return None
    try:
        return HubClient(args.hub, token)
    except OSError as error:  # a CA bundle the environment names that is not there
        _say(f"cannot talk to the hub at {args.hub}: {error}")
        return None


def _token(args):
    """Return the device token: --token, else --token-file, else DEPLOYHUB_DEVICE_TOKEN.

    A token given as --token is in the command line, which every user of the machine
    reads with `ps`: it still works, with a warning.
    """
    if args.token:
        _say(TOKEN_IN_ARGV)
        return args.token
    if args.token_file:
        return _read_token_file(Path(args.token_file))
    return os.environ.get("DEPLOYHUB_DEVICE_TOKEN")


def _enrolled_token(args):
    """Return the config file's device token, filling in args.hub and args.workdir from it;
    None without a config file.

    A container's first start, with DEPLOYHUB_ENROLMENT_TOKEN and no config file yet,
    enrols first and writes one: later starts read it.
    """
    path = Path(args.config) if args.config else config.default_path()
    saved = config.load(path)
    if saved is None and os.environ.get(ENROLMENT_TOKEN_ENV) and args.hub:
        saved, path, answer = enrolment.enrol(
            args.hub, os.environ[ENROLMENT_TOKEN_ENV], config_path=path
        )
        _say(enrolment.summary(saved, path, answer))
    if saved is None:
        return None
    if config.readable_by_others(path):
        _say(f"{path} is readable by other users: chmod 600 {path}")
    args.hub = args.hub or saved["hub"]
    if hasattr(args, "workdir"):
        args.workdir = args.workdir or saved.get("workdir")
    return saved["token"]


def _read_token_file(path):
    """Return the token a file holds (surrounding whitespace dropped); warn when others may read
    it."""
    if path.stat().st_mode & 0o077:
        _say(f"{path} is readable by other users: chmod 600 {path}")
    return path.read_text().strip()


def _remove_dead_scratch(root):
    """Remove the job folders that workers killed mid-job left on this host, and say so."""
    removed = scratch.remove_dead(root)
    if removed:
        megabytes = sum(size for _, size in removed) / 1e6
        names = ", ".join(path.name for path, _ in removed[:5])
        logger.info(
            "removed %d job folder(s) of stopped workers (%.1f MB): %s",
            len(removed),
            megabytes,
            names + (", ..." if len(removed) > 5 else ""),
        )


def show_fingerprint(args):
    """Print this device's fingerprint as JSON."""
    print(json.dumps(_fingerprint(args.fingerprint_override), indent=2))
    return 0


def run_selftest(args):
    """Build, load and run a tiny model with each backend; print one JSON document.

    Exit 0 when every backend asked for works, 1 when one is missing or fails,
    2 for a backend name that does not exist.
    """
    try:
        backends = selftest.backends_named(args.backend)
    except UnknownBackend as error:
        _say(str(error))
        return 2
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON document only
        document = selftest.run(backends)
    print(json.dumps(document, indent=2, ensure_ascii=False))
    return 0 if selftest.all_ok(document) else 1


def fetch_production(args):
    """Download the production engines this device may run, verify them, write them to --out.

    All or nothing: every engine is downloaded and its size, sha256 and the hub's
    signature checked in a scratch folder beside --out before anything lands
    there, then each engine and its manifest (model-<id>.json, written last) are
    moved in by rename. Exit 1 with the reason when the hub has no production
    release, the device cannot run one (409), or a file fails a check; 2 for a
    missing or refused token.
    """
    client = _hub_client(args)
    if client is None:
        return 2
    try:
        device = client.whoami()
        if not device.get("has_fingerprint"):  # a device that never ran a worker: say what it is
            client.heartbeat(_fingerprint(None))
        entries = _production_entries(client, device, args.model)
        written = _fetch_all(client, entries, device.get("signing_public_key"), args)
    except Unauthorized as error:
        _say(f"the hub refused this token: {error.message}")
        return 2
    except (HubError, JobError, OSError) as error:
        _say(f"nothing fetched: {error}")
        return 1
    for manifest in written:
        print(
            f"model {manifest['model']['name']} v{manifest['version']['number']}: engine "
            f"{manifest['engine']} of release {manifest['release']} -> {manifest['file']}"
        )
    return 0


def _production_entries(client, device, model):
    """Return the hub's production entries; raise JobError when one may not run here."""
    answer = client.production(device["device_class"], model)
    entries = [answer] if model is not None else answer.get("releases") or []
    refused = [entry for entry in entries if not entry.get("engine")]
    if refused:
        raise JobError("; ".join(f"{e['model']['name']}: {e['error']}" for e in refused))
    return entries


def _fetch_all(client, entries, public_key, args):
    """Download and verify every engine in a scratch folder beside args.out, then move them in."""
    if not public_key:
        raise JobError("the hub sent no signing_public_key: engines cannot be verified")
    out = Path(args.out)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        files = [_download_verified(client, entry, public_key, scratch) for entry in entries]
        out.mkdir(exist_ok=True)
        return [
            _move_in(entry, path, out, args.hub) for entry, path in zip(entries, files, strict=True)
        ]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _download_verified(client, entry, public_key, scratch):
    """Download one entry's engine into scratch; check size, sha256 and signature."""
    engine = entry["engine"]
    path = scratch / f"engine-{engine['id']}"
    client.download_engine(engine["id"], path, engine["sha256"], engine["size"])
    signing.verify(engine["sha256"], engine.get("signature") or "", public_key)
    return path


def _move_in(entry, path, out, hub):
    """Rename the verified engine into out, then write its manifest the same way; return it."""
    engine = entry["engine"]
    os.replace(path, out / path.name)
    manifest = {
        "release": entry["release"]["id"],
        "engine": engine["id"],
        "file": path.name,
        "backend": engine["backend"],
        "build_config": engine["build_config"],
        "sha256": engine["sha256"],
        "signature": engine["signature"],
        "size": engine["size"],
        "model": entry["model"],
        "version": entry["version"],
        "device_class": entry["device_class"],
        "fetched_at": datetime.now(UTC).isoformat(),
        "hub": hub,
    }
    target = out / f"model-{entry['model']['id']}.json"
    partial = path.with_name(target.name)
    partial.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(partial, target)
    return manifest


def _parser():
    """Return the argument parser of the command and its subcommands."""
    parser = argparse.ArgumentParser(prog="deployhub-worker", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="command")
    run_parser = commands.add_parser("run", help="consume this device class's jobs")
    env = os.environ.get
    run_parser.add_argument("--hub", default=env("DEPLOYHUB_HUB_URL"), help="hub base URL")
    _token_arguments(run_parser)
    run_parser.add_argument(
        "--broker",
        default=env("CELERY_BROKER_URL"),
        help="Celery broker URL: take work from the broker (inside the hub's own network); "
        "without one the worker asks the hub for work over HTTPS",
    )
    run_parser.add_argument(
        "--mode",
        choices=(HTTPS, BROKER),
        help=f"how to take work (default: {BROKER} when a broker URL is given, else {HTTPS}); "
        f"{BROKER} without a URL uses {DEFAULT_BROKER}",
    )
    run_parser.add_argument("--workdir", help="folder for job scratch space (default: system temp)")
    run_parser.set_defaults(func=run)
    print_parser = commands.add_parser("fingerprint", help="print this device's fingerprint")
    print_parser.set_defaults(func=show_fingerprint)
    for sub in (run_parser, print_parser):
        sub.add_argument(
            "--fingerprint-override",
            default=env("DEPLOYHUB_FINGERPRINT_OVERRIDE"),
            metavar="FILE",
            help="JSON merged over the collected fingerprint (tests, upgrade rehearsals)",
        )
    fetch_parser = commands.add_parser(
        "fetch-production", help="download and verify the production engines this device runs"
    )
    fetch_parser.add_argument("--hub", default=env("DEPLOYHUB_HUB_URL"), help="hub base URL")
    _token_arguments(fetch_parser)
    fetch_parser.add_argument("--out", required=True, metavar="DIR", help="folder to write to")
    fetch_parser.add_argument(
        "--model", type=int, metavar="ID", help="this model only (default: every model)"
    )
    fetch_parser.set_defaults(func=fetch_production)
    selftest_parser = commands.add_parser(
        "selftest", help="build, load and run a tiny model with each backend; print JSON"
    )
    selftest_parser.add_argument(
        "--backend",
        action="append",
        metavar="NAME",
        help=f"a backend to check, repeatable (default: all of {', '.join(BACKENDS)})",
    )
    selftest_parser.set_defaults(func=run_selftest)
    _enrolment_parsers(commands)
    return parser


def _token_arguments(parser):
    """Add the ways to give the device token; DEPLOYHUB_DEVICE_TOKEN is read when none is used."""
    parser.add_argument(
        "--token-file",
        default=os.environ.get("DEPLOYHUB_DEVICE_TOKEN_FILE"),
        metavar="FILE",
        help="read the device token from FILE (mode 600)",
    )
    parser.add_argument(
        "--token",
        help="device token (visible to other users in ps: prefer DEPLOYHUB_DEVICE_TOKEN "
        "or --token-file)",
    )
    _config_argument(
        parser, "read the hub, the device token and the workdir from PATH when no token is given"
    )


def _config_argument(parser, purpose):
    """Add --config: where the config file is, when not where config.default_path() says."""
    parser.add_argument(
        "--config",
        metavar="PATH",
        help=f"{purpose} (default: $DEPLOYHUB_WORKER_CONFIG, {config.SYSTEM_PATH} for root, "
        "else ~/.config/deployhub/worker.json)",
    )


def _enrolment_parsers(commands):
    """Add the enroll and service commands."""
    env = os.environ.get
    enroll_parser = commands.add_parser(
        "enroll", help="register this machine with an enrolment token; write the config file"
    )
    enroll_parser.add_argument("--hub", default=env("DEPLOYHUB_HUB_URL"), help="hub base URL")
    enroll_parser.add_argument(
        "--token",
        default=env(ENROLMENT_TOKEN_ENV),
        help=f"enrolment token (dhe_..., from the device class's page; or {ENROLMENT_TOKEN_ENV})",
    )
    enroll_parser.add_argument(
        "--name", help="device name (default: DEPLOYHUB_DEVICE_NAME, else the host name)"
    )
    enroll_parser.add_argument(
        "--workdir", help="folder for job scratch space, kept in the config (default: system temp)"
    )
    _config_argument(enroll_parser, "write the config file to PATH")
    enroll_parser.add_argument(
        "--fingerprint-override",
        default=env("DEPLOYHUB_FINGERPRINT_OVERRIDE"),
        metavar="FILE",
        help="JSON merged over the fingerprint sent with the enrolment",
    )
    enroll_parser.set_defaults(func=enroll)
    service_parser = commands.add_parser(
        "service", help="print the systemd unit that runs this worker (--install writes it)"
    )
    service_parser.add_argument(
        "--install", action="store_true", help=f"write it to /{service.UNIT_FOLDER} (as root)"
    )
    service_parser.add_argument(
        "--user",
        help="unprivileged user the worker runs as (default: the config file's owner, "
        f"or {service.DEFAULT_USER} when that is root)",
    )
    _config_argument(service_parser, "the config file the service reads")
    service_parser.set_defaults(func=print_service)


def enroll(args):
    """Enrol this machine with an enrolment token and write the config file `run` reads.

    Exit 2, writing nothing, when the hub refuses the token (revoked, expired, used
    up, unknown) or the name; 1 when the hub cannot be reached.
    """
    if not args.hub or not args.token:
        _say(
            f"--hub and --token (an enrolment token, dhe_...) are required, or "
            f"DEPLOYHUB_HUB_URL and {ENROLMENT_TOKEN_ENV}"
        )
        return 2
    fingerprint_now = _fingerprint(args.fingerprint_override)
    try:
        saved, path, answer = enrolment.enrol(
            args.hub, args.token, args.name, args.workdir, args.config, fingerprint_now
        )
    except EnrolmentError as error:
        _say(str(error))
        return 2
    except HubUnreachable as error:
        _say(error.message)
        return 1
    except HubError as error:
        if error.status in (400, 401, 403, 409):
            _say(f"enrolment refused: {error.message}")
            return 2
        _say(f"enrolment failed: {error}")
        return 1
    except OSError as error:
        _say(f"enrolment failed: {error}")
        return 1
    print(enrolment.summary(saved, path, answer), flush=True)
    return 0


def print_service(args):
    """Print the systemd unit that runs `deployhub-worker run` as an unprivileged user;
    --install writes it and says which systemctl commands start it."""
    path = (Path(args.config) if args.config else config.default_path()).absolute()
    try:
        saved = config.load(path)
    except (OSError, ConfigError) as error:
        _say(str(error))
        return 1
    user = args.user or service.default_user(path)
    text = service.unit_text(user, path, saved)
    if not args.install:
        print(text, end="", flush=True)
        if saved is None:
            _say(f"no config file at {path} yet: enrol this machine first")
        return 0
    try:
        target, notes = service.install(text, user, path, saved)
    except ServiceError as error:
        _say(f"nothing installed: {error}")
        return 2
    except OSError as error:
        _say(f"nothing installed: {error}")
        return 1
    for note in notes:
        _say(note)
    print(f"wrote {target}; start the worker now and at every boot with:")
    for command in service.SYSTEMCTL:
        print(f"  sudo {command}")
    return 0


def _wait_for_hub(client):
    """Return whoami(), waiting up to HUB_WAIT_SECONDS for a hub that is not up yet (or that
    throttles this address for a while: 429)."""
    deadline = time.monotonic() + HUB_WAIT_SECONDS
    while True:
        try:
            return client.whoami()
        except HubError as error:
            starting = isinstance(error, HubUnreachable) or error.status in RETRY_STATUSES
            if not starting or isinstance(error, HubUntrusted) or time.monotonic() >= deadline:
                raise
            _say(f"waiting for the hub ({error})")
        time.sleep(HUB_WAIT_PAUSE_SECONDS)


def _fingerprint(override_path):
    """Return the collected fingerprint, with the override file merged over it if given."""
    return fingerprint.load_override(override_path) if override_path else fingerprint.collect()


def _start_device_heartbeat(client, device, override_path):
    """Heartbeat the device from a daemon thread; return the Event that stops it."""
    stop = threading.Event()
    interval = device.get("heartbeat_interval") or 10
    args = (client, interval, override_path, stop)
    threading.Thread(
        target=_heartbeat_device, args=args, name="device-heartbeat", daemon=True
    ).start()
    return stop


def _heartbeat_device(client, interval, override_path, stop):
    """Send the current fingerprint every interval seconds until stop is set; never raise.

    The fingerprint is collected again each time (the slow parts, torch and
    OpenVINO, once per process) and the override file re-read, so a driver
    upgrade, or an edited override rehearsing one, reaches the hub at the next beat.
    """
    while not stop.wait(interval):
        try:
            current = _fingerprint(override_path)
            if CONTEXT.asking and current == CONTEXT.fingerprint:
                continue  # an open ask for work is the hub's heartbeat of this device
            answer = client.heartbeat(current, delivery=CONTEXT.delivery)
        except Exception as error:
            logger.warning("device heartbeat failed: %s", error)
            continue
        CONTEXT.fingerprint = current
        _follow_drain(answer.get("state"))
        interval = answer.get("heartbeat_interval") or interval


def _follow_drain(state):
    """Take no new jobs while the hub says this device is draining."""
    draining = state == "draining"
    if draining != CONTEXT.draining:
        logger.info("device %s", "draining: no new jobs" if draining else "accepting jobs again")
    CONTEXT.draining = draining


def _consume(device, broker_url):
    """Run the Celery worker in this process on the device class's queue only."""
    from kombu.utils.url import maybe_sanitize_url

    queue = device["queue"]
    print(
        f"deployhub-worker: device {device['name']} (class {device['device_class']}) "
        f"consuming {queue} from {maybe_sanitize_url(broker_url)}",
        flush=True,
    )
    configure(broker_url)
    app.worker_main(
        ["worker", "-Q", queue, "-P", "solo", "-c", "1", "-l", "INFO", "-n", f"{device['name']}@%h"]
        + ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    )


def _say(message):
    """Print a message for the operator on stderr."""
    print(f"deployhub-worker: {message}", file=sys.stderr, flush=True)
