"""The hub serves the exact worker it speaks: a wheel built from its own code, at a URL a
device installs from with nothing but pip and HTTPS to the hub."""

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import requests
from django.test import Client

from deployhub.core import worker_dist
from tests.conftest import ROOT
from tests.installed_worker import installed_worker, run
from workers.version import worker_version

WHEEL = f"deployhub-{worker_version()}-py3-none-any.whl"


@pytest.fixture
def own_var(settings, tmp_path):
    """A var folder of the test's own: the wheel is built there, from nothing kept."""
    settings.VAR_DIR = tmp_path / "var"
    settings.VAR_DIR.mkdir()
    return settings.VAR_DIR


def wheel_bytes(response):
    return b"".join(response.streaming_content)


def worker_requirements(metadata):
    """The Requires-Dist lines of a wheel's METADATA that its [worker] extra installs."""
    lines = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    return [line for line in lines if 'extra == "worker"' in line]


def test_anyone_downloads_the_wheel_of_the_hubs_version_without_signing_in(own_var):
    response = Client().get(f"/downloads/{WHEEL}")

    assert response.status_code == 200
    assert f'filename="{WHEEL}"' in response["Content-Disposition"]
    body = wheel_bytes(response)
    page = Client().get("/downloads/").content.decode()
    assert f'href="{WHEEL}#sha256={hashlib.sha256(body).hexdigest()}"' in page
    assert f"pip install &quot;deployhub[worker] @ http://testserver/downloads/{WHEEL}" in page


def test_the_wheel_holds_the_whole_worker_and_its_extra_needs_no_django(own_var, tmp_path):
    path = tmp_path / WHEEL
    path.write_bytes(wheel_bytes(Client().get(f"/downloads/{WHEEL}")))

    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        info = f"deployhub-{worker_version()}.dist-info"
        metadata = wheel.read(f"{info}/METADATA").decode()
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    for module in (ROOT / "workers").rglob("*.py"):
        assert module.relative_to(ROOT).as_posix() in names
    assert "workers/backends/onnxruntime.py" in names and "workers/tasks/detection.py" in names
    assert "deployhub-worker = workers.cli:main" in entry_points
    requirements = worker_requirements(metadata)
    assert 'Requires-Dist: onnxruntime==1.32.0; extra == "worker"' in requirements
    assert not [line for line in requirements if "django" in line.lower()]


def test_another_versions_wheel_is_a_404_naming_the_hubs_own(own_var):
    response = Client().get("/downloads/deployhub-0.0.1-py3-none-any.whl")

    assert response.status_code == 404
    assert f"/downloads/{WHEEL}" in response.content.decode()


def test_concurrent_first_requests_build_the_wheel_once(own_var, monkeypatch):
    builds = []
    build = worker_dist._build
    monkeypatch.setattr(worker_dist, "_build", lambda *args: builds.append(1) or build(*args))
    wheels = []

    threads = [
        threading.Thread(target=lambda: wheels.append(worker_dist.worker_wheel())) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(builds) == 1
    assert len({wheel.path for wheel in wheels}) == 1 and len(wheels) == 4


COUNT_BUILDS = """
import django
django.setup()
from deployhub.core import worker_dist
builds = []
build = worker_dist._build
worker_dist._build = lambda *args: builds.append(1) or build(*args)
print(worker_dist.worker_wheel().sha256, len(builds))
"""


def test_two_hub_processes_starting_together_build_the_wheel_once(own_var):
    env = {"DEPLOYHUB_VAR_DIR": str(own_var), "DJANGO_SETTINGS_MODULE": "deployhub.settings"}
    started = [
        subprocess.Popen(
            [sys.executable, "-c", COUNT_BUILDS],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    answers = [process.communicate(timeout=300)[0].split() for process in started]

    assert [process.returncode for process in started] == [0, 0]
    assert answers[0][0] == answers[1][0]
    assert sorted(count for _, count in answers) == ["0", "1"]


def test_a_hub_without_its_source_says_to_name_its_wheel(own_var, settings, tmp_path):
    settings.BASE_DIR = tmp_path / "site-packages"

    response = Client().get(f"/downloads/{WHEEL}")

    assert response.status_code == 503
    assert "set DEPLOYHUB_WORKER_WHEEL" in response.content.decode()


def test_a_failed_build_is_said_again_for_a_minute_without_building_again(
    own_var, settings, tmp_path, monkeypatch
):
    settings.BASE_DIR = tmp_path / "no-source"
    tries = []
    from_source = worker_dist._from_source
    monkeypatch.setattr(
        worker_dist, "_from_source", lambda root: tries.append(1) or from_source(root)
    )

    answers = [Client().get(f"/downloads/{WHEEL}").status_code for _ in range(5)]

    assert answers == [503] * 5 and len(tries) == 1  # an anonymous caller cannot make it build
    monkeypatch.setattr(worker_dist, "RETRY_FAILED_BUILD_S", 0)
    assert Client().get(f"/downloads/{WHEEL}").status_code == 503 and len(tries) == 2


def test_a_hub_serves_the_prebuilt_wheel_it_is_told_of(own_var, settings, tmp_path):
    prebuilt = tmp_path / "dist" / "any-name.whl"
    prebuilt.parent.mkdir()
    with zipfile.ZipFile(prebuilt, "w") as wheel:
        wheel.writestr(f"deployhub-{worker_version()}.dist-info/METADATA", _metadata())
    settings.DEPLOYHUB_WORKER_WHEEL = str(prebuilt)

    response = Client().get(f"/downloads/{WHEEL}")

    assert wheel_bytes(response) == prebuilt.read_bytes()
    assert not (own_var / "worker-wheel").exists()


def test_a_prebuilt_wheel_of_another_version_is_refused(own_var, settings, tmp_path):
    prebuilt = tmp_path / "deployhub-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(prebuilt, "w") as wheel:
        wheel.writestr("deployhub-9.9.9.dist-info/METADATA", _metadata("9.9.9"))
    settings.DEPLOYHUB_WORKER_WHEEL = str(prebuilt)

    response = Client().get(f"/downloads/{WHEEL}")

    assert response.status_code == 503
    assert f"deployhub 9.9.9, and this hub is deployhub {worker_version()}" in (
        response.content.decode()
    )


def _metadata(version=None):
    return f"Metadata-Version: 2.4\nName: deployhub\nVersion: {version or worker_version()}\n"


@pytest.mark.e2e
def test_a_device_installs_the_hubs_worker_from_the_hub_alone(live_server, tmp_path):
    """pip, the hub's URL and nothing of the checkout: the worker runs, without Django."""
    python = installed_worker(live_server.url, tmp_path)
    venv = python.parent.parent

    where = run([python, "-c", "import workers; print(workers.__file__)"], tmp_path).strip()
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(ROOT)
    assert "deployhub-worker" in run([venv / "bin" / "deployhub-worker", "--help"], tmp_path)
    fingerprint = json.loads(run([venv / "bin" / "deployhub-worker", "fingerprint"], tmp_path))
    assert fingerprint["onnxruntime"]["version"]
    no_django = "import workers.cli, workers.runner, sys; assert 'django' not in sys.modules"
    run([python, "-c", no_django], tmp_path)
    said = run([python, "-c", "import workers.version as v; print(v.user_agent())"], tmp_path)
    assert re.fullmatch(rf"deployhub-worker/{re.escape(worker_version())} protocol/\d+\n", said)


@pytest.mark.e2e
def test_the_hubs_wheel_url_is_what_pip_fetches(live_server):
    """The page's link and the install line name one file, the one the hub serves."""
    page = requests.get(f"{live_server.url}/downloads/", timeout=60).text
    wheel = requests.get(worker_dist.wheel_url(live_server.url), timeout=60)

    assert wheel.status_code == 200
    assert f"#sha256={hashlib.sha256(wheel.content).hexdigest()}" in page
