"""How a device runs its worker for good: `deployhub-worker service` (a systemd unit that runs
`deployhub-worker run` as an unprivileged user from the config file) and the worker's
container recipe (Dockerfile.worker, docker-compose.yml's https-worker).

`--install` is tested into a folder standing for / (DEPLOYHUB_SERVICE_ROOT); systemctl is
never run.
"""

import os
import pwd
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from workers import config, service
from workers.cli import main

ROOT = Path(__file__).resolve().parent.parent
ME = pwd.getpwuid(os.getuid()).pw_name
# What systemd before 254 says of the two keys that grow the delay between restarts.
OLD_SYSTEMD = re.compile(r"Unknown key '(RestartSteps|RestartMaxDelaySec)'")


@pytest.fixture
def enrolled(tmp_path, monkeypatch):
    """A config file as enroll writes it, where DEPLOYHUB_WORKER_CONFIG says; its path."""
    path = tmp_path / "etc" / "deployhub" / "worker.json"
    monkeypatch.setenv("DEPLOYHUB_WORKER_CONFIG", str(path))
    fields = {"hub": "https://hub.example", "token": "dht_secret", "device": 3, "name": "edge-1"}
    return config.save({**fields, "device_class": "jetson", "workdir": None}, path)


def unit(text):
    """Return {section: [(key, value), ...]} of a unit file's text (keys may repeat)."""
    sections, current = {}, None
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
            continue
        key, value = line.split("=", 1)
        current.append((key, value))
    return sections


def values(sections, section, key):
    return [value for name, value in sections[section] if name == key]


def printed(capsys, *argv):
    assert main(["service", *argv]) == 0
    return capsys.readouterr().out


def test_the_unit_runs_the_worker_as_an_unprivileged_user_from_the_config(enrolled, capsys):
    text = printed(capsys, "--user", "deployhub")
    sections = unit(text)

    assert values(sections, "Service", "User") == ["deployhub"]
    assert values(sections, "Service", "ExecStart") == [" ".join(service.worker_command()) + " run"]
    assert f"DEPLOYHUB_WORKER_CONFIG={enrolled}" in values(sections, "Service", "Environment")
    assert "dht_secret" not in text and "--token" not in text
    assert values(sections, "Install", "WantedBy") == ["multi-user.target"]
    assert "edge-1 (jetson) for https://hub.example" in values(sections, "Unit", "Description")[0]


def test_it_restarts_with_a_growing_delay_but_not_once_the_hub_refused_the_device(enrolled, capsys):
    sections = unit(printed(capsys, "--user", "deployhub"))

    assert values(sections, "Service", "Restart") == ["always"]
    assert values(sections, "Service", "RestartSec") == ["5s"]
    assert values(sections, "Service", "RestartMaxDelaySec") == ["5min"]
    assert values(sections, "Service", "RestartPreventExitStatus") == ["2"]  # revoked: enrol
    assert values(sections, "Unit", "StartLimitIntervalSec") == ["0"]


def test_it_is_confined_and_writes_only_where_jobs_work(enrolled, tmp_path, capsys):
    sections = unit(printed(capsys, "--user", "deployhub"))
    for key, value in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "read-only"),
        ("PrivateTmp", "yes"),
        ("StateDirectory", "deployhub-worker"),
        ("CacheDirectory", "deployhub-worker"),
    ]:
        assert values(sections, "Service", key) == [value], key
    assert "TMPDIR=/var/cache/deployhub-worker" in values(sections, "Service", "Environment")
    assert values(sections, "Service", "ReadWritePaths") == []
    assert values(sections, "Service", "DevicePolicy") == []  # GPUs stay reachable

    config.save({**config.load(enrolled), "workdir": str(tmp_path / "jobs")}, enrolled)
    sections = unit(printed(capsys, "--user", "deployhub"))
    assert values(sections, "Service", "ReadWritePaths") == [str(tmp_path / "jobs")]


def test_the_user_is_the_config_owner_unless_root(enrolled, tmp_path):
    owner = pwd.getpwuid(enrolled.stat().st_uid).pw_name
    assert service.default_user(enrolled) == ("deployhub" if owner == "root" else owner)
    assert service.default_user(tmp_path / "none.json") == "deployhub"


def test_a_path_with_a_space_is_quoted_for_systemd(tmp_path):
    text = service.unit_text("deployhub", tmp_path / "my config.json", command=["/opt/dh w/x"])

    assert f'DEPLOYHUB_WORKER_CONFIG="{tmp_path}/my config.json"' in text
    assert 'ExecStart="/opt/dh w/x" run' in text


def test_it_says_to_enrol_first_when_there_is_no_config(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DEPLOYHUB_WORKER_CONFIG", str(tmp_path / "none.json"))

    assert main(["service"]) == 0
    assert "enrol this machine first" in capsys.readouterr().err


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not here")
def test_systemd_reads_the_unit_without_a_complaint(enrolled, tmp_path, capsys):
    path = tmp_path / service.UNIT_NAME
    path.write_text(printed(capsys, "--user", ME))

    checked = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )

    complaints = [
        line
        for line in checked.stderr.splitlines()
        if str(path) in line and not OLD_SYSTEMD.search(line)
    ]
    assert complaints == []


# --install


@pytest.fixture
def fake_root(tmp_path, monkeypatch):
    """A folder that stands for / when installing."""
    root = tmp_path / "root"
    monkeypatch.setenv("DEPLOYHUB_SERVICE_ROOT", str(root))
    return root


def test_install_writes_the_unit_and_says_the_two_systemctl_commands(enrolled, fake_root, capsys):
    unit_text = printed(capsys, "--user", ME)

    assert main(["service", "--install", "--user", ME]) == 0

    target = fake_root / "etc/systemd/system/deployhub-worker.service"
    assert target.read_text() == unit_text
    assert target.stat().st_mode & 0o777 == 0o644
    out = capsys.readouterr().out
    assert f"wrote {target}" in out
    assert "sudo systemctl daemon-reload" in out
    assert "sudo systemctl enable --now deployhub-worker" in out
    assert enrolled.stat().st_mode & 0o777 == 0o600  # handed to the user, still private
    assert pwd.getpwuid(enrolled.stat().st_uid).pw_name == ME


def test_install_creates_the_workdir_for_the_user(enrolled, fake_root, tmp_path, capsys):
    config.save({**config.load(enrolled), "workdir": str(tmp_path / "jobs")}, enrolled)

    assert main(["service", "--install", "--user", ME]) == 0
    assert (tmp_path / "jobs").is_dir()
    assert (tmp_path / "jobs").stat().st_uid == os.getuid()


def test_install_is_refused_to_anyone_but_root(enrolled, monkeypatch, capsys):
    monkeypatch.delenv("DEPLOYHUB_SERVICE_ROOT", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)

    assert main(["service", "--install", "--user", ME]) == 2
    assert "run it as root (sudo)" in capsys.readouterr().err


def test_install_for_a_user_that_does_not_exist_says_how_to_make_one(enrolled, fake_root, capsys):
    assert main(["service", "--install", "--user", "no-such-user-here"]) == 2

    err = capsys.readouterr().err
    assert "there is no user no-such-user-here" in err and "useradd --system" in err
    assert not fake_root.exists()


def test_install_without_a_config_says_to_enrol_first(tmp_path, fake_root, monkeypatch, capsys):
    monkeypatch.setenv("DEPLOYHUB_WORKER_CONFIG", str(tmp_path / "none.json"))

    assert main(["service", "--install", "--user", ME]) == 2
    assert "enrol first" in capsys.readouterr().err
    assert not fake_root.exists()


# The container recipe


def compose_service(name):
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"][name]


def dockerfile(name):
    """Return [(instruction, arguments)] of a Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / name).read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def test_the_https_worker_enrols_itself_and_has_no_broker(capsys):
    worker = compose_service("https-worker")

    assert worker["build"] == {"context": ".", "dockerfile": "Dockerfile.worker"}
    assert worker["profiles"] == ["https-worker"]  # started only when asked for
    assert "CELERY_BROKER_URL" not in worker["environment"]
    assert {"DEPLOYHUB_HUB_URL", "DEPLOYHUB_ENROLMENT_TOKEN"} <= set(worker["environment"])
    assert any(volume.endswith(":/config") for volume in worker["volumes"])
    assert "command" not in worker  # the image's own: deployhub-worker run


def test_the_worker_image_runs_deployhub_worker_run_as_a_user_of_its_own():
    steps = dockerfile("Dockerfile.worker")
    instructions = dict(steps)  # the last of each

    assert instructions["ENTRYPOINT"] == '["deployhub-worker"]'
    assert instructions["CMD"] == '["run"]'
    assert instructions["USER"] == "deployhub"
    assert "DEPLOYHUB_WORKER_CONFIG=/config/worker.json" in instructions["ENV"]
    installs = [args for op, args in steps if op == "RUN" and "pip install" in args]
    assert installs == ['pip install ".[${EXTRAS}]" && rm -rf /src']
    assert "worker" in instructions["ARG"]  # EXTRAS=worker,openvino
    copied = " ".join(args for op, args in steps if op == "COPY")
    assert "workers" in copied and "deployhub" not in copied.split()  # no hub code
