"""`make run`'s embedded mode: SQLite, the filesystem broker, hub worker and local worker."""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys

import psutil
import pytest
import requests

from deployhub.demo.management.commands.seed_demo import demo_password
from tests.conftest import ROOT, wait_until

pytestmark = pytest.mark.e2e


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def embedded(tmp_path):
    """Start `manage.py run_embedded` with nothing configured but a fresh var/ folder."""
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")
    }
    env.update(DEPLOYHUB_VAR_DIR=str(tmp_path / "var"), PYTHONUNBUFFERED="1")
    log = open(tmp_path / "run.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_embedded", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    output = lambda: (tmp_path / "run.log").read_text(errors="replace")  # noqa: E731
    wait_until(
        lambda: "DeployHub is running at" in output(),
        120,
        "run_embedded to start",
        on_timeout=output,
    )
    yield {
        "url": f"http://127.0.0.1:{port}",
        "process": process,
        "output": output,
        "var": tmp_path / "var",
    }
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever is left of the session
    log.close()


def login(url):
    session = requests.Session()
    session.get(f"{url}/login/")
    response = session.post(
        f"{url}/login/",
        data={
            "username": "alice",
            "password": demo_password(),
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
    )
    assert response.url.endswith("/models/"), "alice could not log in with the printed password"
    return session


def test_make_run_serves_the_demo_and_runs_a_benchmark(embedded):
    url = embedded["url"]
    assert f"{url}/" in embedded["output"]() and "alice" in embedded["output"]()
    health = wait_until(
        lambda: (h := requests.get(f"{url}/healthz").json())["workers_online"] and h,
        60,
        "the local worker to come online",
        on_timeout=embedded["output"],
    )
    assert health["database"] == "ok" and health["broker"] == "ok" and health["embedded"]
    assert (embedded["var"] / "deployhub.sqlite3").exists()
    assert (embedded["var"] / "broker").is_dir()

    session = login(url)
    models_page = session.get(f"{url}/models/").text
    model_url = re.search(r'href="(/models/\d+/)">digits-cnn', models_page).group(1)
    version_url = re.search(r'href="(/versions/\d+/)">v2', session.get(url + model_url).text).group(
        1
    )
    page = session.get(url + version_url).text
    class_id = re.search(r'<option value="(\d+)"[^>]*>local-cpu', page).group(1)
    response = session.post(
        f"{url}{version_url}benchmark",
        allow_redirects=False,
        data={
            "device_class": class_id,
            "batch_size": 1,
            "warmup_iterations": 5,
            "iterations": 200,
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
    )
    job_id = re.search(r"#job-(\d+)$", response.headers["Location"]).group(1)
    status = wait_until(
        lambda: (s := session.get(f"{url}/jobs/{job_id}/status").json())["final"] and s,
        60,
        "the benchmark to finish",
        on_timeout=embedded["output"],
    )
    assert status["state"] == "succeeded", status["log"]
    assert "p50 ms" in session.get(f"{url}{version_url}results").text


def test_stopping_make_run_stops_every_process(embedded):
    parent = psutil.Process(embedded["process"].pid)
    children = parent.children(recursive=True)
    assert len(children) >= 3  # web, hub worker (with beat), local worker
    embedded["process"].send_signal(signal.SIGINT)
    embedded["process"].wait(timeout=30)
    gone, alive = psutil.wait_procs(children, timeout=15)
    assert alive == []


def test_killing_make_run_outright_takes_its_processes_down(embedded):
    children = psutil.Process(embedded["process"].pid).children(recursive=True)
    embedded["process"].kill()
    embedded["process"].wait(timeout=10)
    gone, alive = psutil.wait_procs(children, timeout=20)
    assert alive == []
