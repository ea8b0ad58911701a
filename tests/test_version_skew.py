"""Version skew between a device's worker and the hub: a worker whose protocol the hub does not
speak is refused with the line that installs the hub's own worker; an older worker is shown
on the fleet page; a caller that is not a worker (curl, a script) is served as before."""

import html
import json
import os
import subprocess

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from deployhub.core.worker_dist import wheel_url
from deployhub.jobs.models import JobState
from tests.conftest import PASSWORD, ROOT, run_python
from workers.version import OLDEST_PROTOCOL, PROTOCOL, user_agent, worker_version


def agent(protocol, version="0.1.0"):
    return f"deployhub-worker/{version} protocol/{protocol}"


def device_call(client, token, user_agent=None, path="device"):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if user_agent is not None:
        headers["HTTP_USER_AGENT"] = user_agent
    return client.get(f"/api/v1/{path}", **headers)


def install_line():
    return f'pip install "deployhub[worker] @ {wheel_url("http://testserver")}"'


@pytest.mark.parametrize("protocol", [PROTOCOL + 97, OLDEST_PROTOCOL - 1])
def test_a_worker_speaking_a_protocol_the_hub_does_not_gets_426_with_the_install_line(
    client, make_device, protocol
):
    device, token = make_device()

    response = device_call(client, token, agent(protocol))

    assert response.status_code == 426
    assert response.json() == {
        "error": f"This hub speaks device protocol {OLDEST_PROTOCOL}–{PROTOCOL}; this worker "
        f"speaks {protocol}. Install the hub's worker: {install_line()}"
    }
    device.refresh_from_db()
    assert device.protocol_version == protocol


def test_the_hubs_own_worker_is_served_and_recorded(client, make_device):
    device, token = make_device()

    response = device_call(client, token, user_agent())

    assert response.status_code == 200
    device.refresh_from_db()
    assert (device.worker_version, device.protocol_version) == (worker_version(), PROTOCOL)


def test_every_protocol_the_hub_speaks_is_served(client, make_device):
    _, token = make_device()

    for protocol in range(OLDEST_PROTOCOL, PROTOCOL + 1):
        assert device_call(client, token, agent(protocol)).status_code == 200


def test_a_worker_from_before_versions_says_protocol_1_and_is_served(client, make_device):
    device, token = make_device()

    assert device_call(client, token, "deployhub-worker").status_code == 200
    device.refresh_from_db()
    assert (device.worker_version, device.protocol_version) == ("", 1)


@pytest.mark.parametrize("other", [None, "curl/8.5.0", "python-requests/2.34.2"])
def test_a_caller_that_is_not_a_worker_is_served_and_changes_nothing(client, make_device, other):
    device, token = make_device()

    assert device_call(client, token, other).status_code == 200
    device.refresh_from_db()
    assert (device.worker_version, device.protocol_version) == ("", None)


def test_a_worker_saying_the_same_again_costs_no_query(client, make_device):
    _, token = make_device()
    device_call(client, token, user_agent())

    with CaptureQueriesContext(connection) as plain:
        device_call(client, token)
    with CaptureQueriesContext(connection) as again:
        device_call(client, token, user_agent())
    with CaptureQueriesContext(connection) as changed:
        device_call(client, token, agent(PROTOCOL, "0.0.9"))

    assert len(again) == len(plain)
    updates = [q["sql"] for q in changed.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(changed) == len(plain) + 1 and len(updates) == 1


def test_a_refused_worker_cannot_claim_a_job(client, job, make_device):
    _, token = make_device()

    response = client.post(
        f"/api/v1/jobs/{job.pk}/claim",
        json.dumps({"attempt": 1}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
        HTTP_USER_AGENT=agent(PROTOCOL + 1),
    )

    assert response.status_code == 426
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_the_device_page_says_the_worker_was_refused_and_what_to_install(
    client, alice, make_device
):
    device, token = make_device()
    device_call(client, token, agent(99))

    client.login(username=alice.username, password=PASSWORD)
    page = html.unescape(client.get(f"/devices/{device.pk}/").content.decode())

    assert "Refused: protocol 99" in page
    assert install_line() in page


def test_the_fleet_page_marks_a_device_whose_worker_is_older_than_the_hub(
    client, alice, make_device
):
    old, old_token = make_device("old-box")
    current, current_token = make_device("new-box")
    device_call(client, old_token, agent(PROTOCOL, "0.0.9"))
    device_call(client, current_token, user_agent())

    client.login(username=alice.username, password=PASSWORD)
    page = html.unescape(client.get("/devices/").content.decode())

    assert f"older worker (0.0.9 < {worker_version()})" in page
    assert page.count("older worker") == 1
    device_page = html.unescape(client.get(f"/devices/{old.pk}/").content.decode())
    assert f"Worker 0.0.9, device protocol {PROTOCOL}." in device_page
    assert install_line() in device_page


# A worker of a release that speaks a protocol this hub does not: the real command line, with
# only its protocol number changed.
FUTURE_WORKER = (
    "import sys, workers.version as version; version.PROTOCOL = 99; "
    "from workers.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.e2e
def test_a_worker_the_hub_does_not_speak_stops_at_start_saying_what_to_install(
    live_server, make_device, tmp_path
):
    device, token = make_device()
    env = {**os.environ, "DEPLOYHUB_DEVICE_TOKEN": token, "CELERY_BROKER_URL": ""}

    command = [run_python(), "-c", FUTURE_WORKER, "run", "--hub", live_server.url]
    done = subprocess.run(
        [*command, "--workdir", tmp_path],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 1
    assert "this worker speaks 99" in done.stderr
    assert f'pip install "deployhub[worker] @ {wheel_url(live_server.url)}"' in done.stderr
    device.refresh_from_db()
    assert device.protocol_version == 99 and device.last_heartbeat_at is None


@pytest.mark.parametrize("protocol", ["²", "9" * 5000, "-1", "two"])
def test_a_protocol_that_is_not_a_number_is_read_as_none_never_a_500(client, job, protocol):
    response = client.post(
        f"/api/v1/jobs/{job.pk}/claim",
        json.dumps({"attempt": 1}),
        content_type="application/json",
        HTTP_AUTHORIZATION="Bearer dht_made-up",
        HTTP_USER_AGENT=agent(protocol),
    )
    assert response.status_code in (401, 426), response.content
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
