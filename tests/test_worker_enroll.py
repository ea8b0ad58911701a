"""`deployhub-worker enroll`: a machine registers itself with an enrolment token, keeps its
device token in a config file only its user reads, and `run` needs no flags afterwards.

The config file's place (root, a user, the environment) and the machine id's fallbacks
are unit-tested; a live hub enrols real `python -m workers` processes.
"""

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from deployhub.devices.models import Device, EnrolmentToken
from tests.conftest import ROOT, wait_until
from workers import config
from workers.cli import _hub_client, _parser, main
from workers.client import HubClient, Unauthorized
from workers.version import PROTOCOL, user_agent, worker_version

live = pytest.mark.django_db(transaction=True)
TOKEN_VARIABLES = ("DEPLOYHUB_HUB_URL", "DEPLOYHUB_DEVICE_TOKEN", "DEPLOYHUB_DEVICE_TOKEN_FILE")


def saved_config(tmp_path, **fields):
    """Write a config file as enroll does; return its path."""
    values = {"hub": "https://hub.example", "token": "dht_saved", "workdir": None, "device": 7}
    return config.save({**values, **fields}, tmp_path / "deployhub" / "worker.json")


def mode(path):
    return path.stat().st_mode & 0o777


# Where the config file is


def test_root_keeps_the_config_in_etc():
    assert config.default_path(environ={}, euid=0) == Path("/etc/deployhub/worker.json")


def test_a_user_keeps_it_in_the_xdg_config_folder(tmp_path, monkeypatch):
    environ = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert config.default_path(environ, euid=1000) == tmp_path / "xdg/deployhub/worker.json"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config.default_path({}, euid=1000) == tmp_path / "home/.config/deployhub/worker.json"


def test_the_environment_names_another_config_for_root_and_users(tmp_path):
    environ = {"DEPLOYHUB_WORKER_CONFIG": str(tmp_path / "w.json"), "XDG_CONFIG_HOME": "/x"}
    assert config.default_path(environ, euid=0) == tmp_path / "w.json"
    assert config.default_path(environ, euid=1000) == tmp_path / "w.json"


def test_the_config_is_written_0600_in_a_0700_folder_and_read_back(tmp_path):
    path = saved_config(tmp_path, name="edge-1", device_class="jetson")

    assert (mode(path), mode(path.parent)) == (0o600, 0o700)
    assert config.load(path) == {
        "hub": "https://hub.example",
        "token": "dht_saved",
        "workdir": None,
        "device": 7,
        "name": "edge-1",
        "device_class": "jetson",
    }
    assert sorted(p.name for p in path.parent.iterdir()) == ["worker.json"]  # no partial file


def test_writing_it_again_replaces_it_whole(tmp_path):
    saved_config(tmp_path, token="dht_old")
    path = saved_config(tmp_path, token="dht_new")

    assert config.load(path)["token"] == "dht_new"
    assert mode(path) == 0o600


def test_a_missing_config_is_none_and_a_broken_one_says_to_enrol_again(tmp_path):
    assert config.load(tmp_path / "none.json") is None
    broken = tmp_path / "worker.json"
    broken.write_text("{not json")
    with pytest.raises(config.ConfigError, match="enrol again"):
        config.load(broken)
    broken.write_text('{"hub": "https://hub.example"}')
    with pytest.raises(config.ConfigError, match="no hub and token"):
        config.load(broken)


# The machine id


@pytest.fixture
def machine_files(tmp_path, monkeypatch):
    """The OS's machine-id files, made to be files under tmp_path (absent until written)."""
    files = (tmp_path / "etc-machine-id", tmp_path / "dbus-machine-id")
    monkeypatch.setattr(config, "MACHINE_ID_FILES", files)
    return files


def test_the_machine_id_is_the_os_one_hashed_for_this_application(machine_files, tmp_path):
    machine_files[0].write_text("3d1219c7c4c5404aaa1f6d2a48adfda4\n")
    first, new = config.machine_id(tmp_path / "worker.json")

    assert not new
    assert first != "3d1219c7c4c5404aaa1f6d2a48adfda4"  # the raw id never leaves the host
    assert config.machine_id(tmp_path / "elsewhere.json")[0] == first


def test_without_etc_machine_id_dbus_s_is_read(machine_files, tmp_path):
    machine_files[0].write_text("uninitialized\n")  # systemd's first boot
    machine_files[1].write_text("0123456789abcdef0123456789abcdef\n")
    from_dbus, _ = config.machine_id(tmp_path / "worker.json")
    machine_files[1].write_text("fedcba9876543210fedcba9876543210\n")

    assert config.machine_id(tmp_path / "worker.json")[0] != from_dbus


def test_without_either_a_random_id_is_kept_beside_the_config(machine_files, tmp_path):
    path = tmp_path / "deployhub" / "worker.json"
    made_up, new = config.machine_id(path)
    assert new and not path.parent.exists()  # kept only once the hub has enrolled the machine

    config.keep_machine_id(made_up, path)

    assert config.machine_id(path) == (made_up, False)
    assert mode(path.with_name("machine-id")) == 0o600


# Flags and environment first, then the config file


def run_args(*argv):
    return _parser().parse_args(["run", *argv])


@pytest.fixture
def no_token_variables(monkeypatch):
    for name in TOKEN_VARIABLES + ("DEPLOYHUB_ENROLMENT_TOKEN",):
        monkeypatch.delenv(name, raising=False)


def test_run_without_flags_takes_the_hub_token_and_workdir_from_the_config(
    tmp_path, no_token_variables
):
    path = saved_config(tmp_path, workdir=str(tmp_path / "jobs"))
    args = run_args("--config", str(path))

    client = _hub_client(args)

    assert client.base_url == "https://hub.example"
    assert client.session.headers["Authorization"] == "Bearer dht_saved"
    assert args.workdir == str(tmp_path / "jobs")


def test_flags_and_the_environment_win_over_the_config(tmp_path, no_token_variables, monkeypatch):
    path = saved_config(tmp_path, workdir=str(tmp_path / "jobs"))
    args = run_args("--config", str(path), "--hub", "https://other.example", "--workdir", "/w")
    client = _hub_client(args)
    assert (client.base_url, args.workdir) == ("https://other.example", "/w")
    assert client.session.headers["Authorization"] == "Bearer dht_saved"

    monkeypatch.setenv("DEPLOYHUB_DEVICE_TOKEN", "dht_from_env")
    client = _hub_client(run_args("--config", str(path), "--hub", "https://other.example"))
    assert client.session.headers["Authorization"] == "Bearer dht_from_env"


def test_run_says_what_is_missing_without_a_token_or_a_config(tmp_path, no_token_variables, capsys):
    assert main(["run", "--config", str(tmp_path / "none.json")]) == 2
    assert "or enrol this machine first (deployhub-worker enroll" in capsys.readouterr().err


def test_a_config_others_may_read_is_used_with_a_warning(tmp_path, no_token_variables, capsys):
    path = saved_config(tmp_path)
    path.chmod(0o644)

    assert _hub_client(run_args("--config", str(path))) is not None
    assert f"chmod 600 {path}" in capsys.readouterr().err


def test_every_call_says_which_worker_and_protocol_it_is():
    client = HubClient("http://127.0.0.1:9", "dht_x")

    assert client.session.headers["User-Agent"] == user_agent()
    assert client.kept.headers["User-Agent"] == user_agent()
    assert user_agent() == f"deployhub-worker/{worker_version()} protocol/{PROTOCOL}"
    assert "Authorization" not in HubClient("http://127.0.0.1:9").session.headers  # enrolment


# Enrolling, before anything is sent


def test_an_unreachable_hub_is_one_line_and_exit_1_writing_nothing(tmp_path, capsys):
    path = tmp_path / "deployhub" / "worker.json"
    argv = ["enroll", "--hub", "http://127.0.0.1:9", "--token", "dhe_x", "--config", str(path)]

    assert main(argv) == 1

    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [
        "deployhub-worker: cannot reach the hub at http://127.0.0.1:9: [Errno 111] Connection "
        "refused"
    ]
    assert not path.parent.exists()


def test_a_hub_that_is_not_a_url_is_refused_before_anything_is_sent(tmp_path, capsys):
    path = tmp_path / "worker.json"
    argv = ["enroll", "--hub", "hub.example.com", "--token", "dhe_x", "--config", str(path)]

    assert main(argv) == 2
    assert "--hub must be the hub's URL, such as https://" in capsys.readouterr().err
    assert not path.exists()


# Against a live hub


def enrolment_token(device_class, user, **fields):
    """A usable enrolment token of the class; return (its row, its secret)."""
    record = EnrolmentToken(device_class=device_class, created_by=user, **fields)
    secret = record.issue()
    record.save()
    return record, secret


def worker_env(tmp_path):
    """The environment of a worker on a machine of its own: its config under tmp_path."""
    env = {k: v for k, v in os.environ.items() if k not in TOKEN_VARIABLES}
    env.pop("CELERY_BROKER_URL", None)
    home = tmp_path / "home"
    return {
        **env,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        # Tests may run as root, whose config would be /etc/deployhub/worker.json.
        "DEPLOYHUB_WORKER_CONFIG": str(home / ".config/deployhub/worker.json"),
        "PYTHONUNBUFFERED": "1",
    }


def worker(env, *argv, timeout=120):
    """Run `python -m workers` with argv in env; return the finished process."""
    command = [sys.executable, "-m", "workers", *argv]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def enroll(live_server, env, secret, *argv):
    return worker(env, "enroll", "--hub", live_server.url, "--token", secret, *argv)


def run_until(env, log, seen, what):
    """Start `python -m workers run` with no flags in env; stop it once its output (kept in
    log) has `seen`; return that output."""
    with open(log, "wb") as out:
        started = subprocess.Popen(
            [sys.executable, "-m", "workers", "run"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: seen in log.read_text(), 90, what, on_timeout=log.read_text)
    finally:
        started.terminate()
        try:
            started.wait(timeout=30)
        except subprocess.TimeoutExpired:
            started.kill()
            started.wait()
    return log.read_text()


@live
def test_a_machine_enrols_and_runs_with_nothing_but_its_config(
    live_server, tmp_path, device_class, alice
):
    record, secret = enrolment_token(device_class, alice)
    env = worker_env(tmp_path)
    path = Path(env["DEPLOYHUB_WORKER_CONFIG"])

    done = enroll(live_server, env, secret, "--name", "edge-1")

    assert done.returncode == 0, done.stderr
    device = Device.objects.get(device_class=device_class)
    assert done.stdout.strip() == (
        f"enrolled as device edge-1 (#{device.pk}) of class {device_class.slug} at "
        f"{live_server.url}; config written to {path}"
    )
    assert (mode(path), mode(path.parent)) == (0o600, 0o700)
    saved = json.loads(path.read_text())
    assert saved["token"].startswith("dht_") and saved["hub"] == live_server.url
    assert (saved["device"], saved["name"], saved["device_class"]) == (
        device.pk,
        "edge-1",
        device_class.slug,
    )
    assert device.enrolled_with == record and device.machine_id
    assert (device.worker_version, device.protocol_version) == (worker_version(), PROTOCOL)

    ready = f"device edge-1 (class {device_class.slug})"
    output = run_until(env, tmp_path / "run.log", ready, "the worker with no flags to start")

    assert Device.objects.get(pk=device.pk).last_heartbeat_at is not None
    assert "--token" not in output


@live
def test_enrolling_again_from_the_same_machine_gives_the_same_device_and_a_new_token(
    live_server, tmp_path, device_class, alice
):
    _, secret = enrolment_token(device_class, alice)
    env = worker_env(tmp_path)
    path = Path(env["DEPLOYHUB_WORKER_CONFIG"])
    assert enroll(live_server, env, secret, "--name", "edge-1").returncode == 0
    first = json.loads(path.read_text())

    again = enroll(live_server, env, secret, "--name", "edge-1")

    assert again.returncode == 0, again.stderr
    assert "enrolled again as device edge-1" in again.stdout
    second = json.loads(path.read_text())
    assert second["device"] == first["device"] and second["token"] != first["token"]
    assert Device.objects.filter(device_class=device_class).count() == 1
    with pytest.raises(Unauthorized):  # the token it replaced no longer works
        HubClient(live_server.url, first["token"]).whoami()


@live
@pytest.mark.parametrize(
    "fields, words",
    [
        ({"revoked_at": timezone.now()}, "was revoked"),
        ({"expires_at": timezone.now() - timedelta(minutes=1)}, "expired"),
        ({"max_devices": 1, "uses": 1}, "has enrolled its 1 device"),
    ],
)
def test_a_refused_enrolment_token_exits_2_and_writes_nothing(
    live_server, tmp_path, device_class, alice, fields, words
):
    _, secret = enrolment_token(device_class, alice, **fields)
    env = worker_env(tmp_path)

    refused = enroll(live_server, env, secret)

    assert refused.returncode == 2
    assert refused.stderr.startswith("deployhub-worker: enrolment refused: This enrolment token")
    assert words in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "home/.config").exists()
    assert not Device.objects.filter(device_class=device_class).exists()


@live
def test_an_unknown_enrolment_token_exits_2_and_writes_nothing(live_server, tmp_path):
    env = worker_env(tmp_path)

    refused = enroll(live_server, env, "dhe_not-a-token-anyone-made")

    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "deployhub-worker: enrolment refused: This enrolment token is not valid."
    )
    assert not (tmp_path / "home/.config").exists()


@live
def test_a_name_another_machine_has_exits_2_and_says_how_to_choose_another(
    live_server, tmp_path, device_class, alice, make_device
):
    make_device(name="edge-1")
    _, secret = enrolment_token(device_class, alice)

    refused = enroll(live_server, worker_env(tmp_path), secret, "--name", "edge-1")

    assert refused.returncode == 2
    assert "--name" in refused.stderr
    assert not (tmp_path / "home/.config").exists()


@live
def test_a_container_s_first_start_enrols_with_the_token_in_its_environment(
    live_server, tmp_path, device_class, alice
):
    _, secret = enrolment_token(device_class, alice)
    env = {
        **worker_env(tmp_path),
        "DEPLOYHUB_HUB_URL": live_server.url,
        "DEPLOYHUB_ENROLMENT_TOKEN": secret,
        "DEPLOYHUB_DEVICE_NAME": "container-1",
    }
    ready = f"device container-1 (class {device_class.slug})"
    output = run_until(env, tmp_path / "run.log", ready, "the container's worker to start")

    device = Device.objects.get(device_class=device_class)
    assert device.name == "container-1" and device.last_heartbeat_at is not None
    assert "enrolled as device container-1" in output
    assert config.load(env["DEPLOYHUB_WORKER_CONFIG"])["device"] == device.pk
