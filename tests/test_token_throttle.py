"""Guessing tokens is throttled: 30 made-up API or device tokens from one address lock it out.

For 10 minutes that address gets 429 with Retry-After and the JSON error, whatever
token it presents; other addresses, and callers with a right token elsewhere, are
not touched. A request without a token is not a guess and is not counted, nor is a
token the hub knows sent to the wrong call (403): counting those locked make run's
worker out of the address it shares with every local script.
"""

import logging
from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from deployhub.jobs.actions import submit_job
from deployhub.jobs.models import Job, JobKind, JobState
from deployhub.teams.models import Event, TokenFailures
from tests.api_calls import token_for
from tests.conftest import wait_until

GUESSER = "10.0.0.66"
NEIGHBOUR = "10.0.0.67"
LOCKED = "Too many failed token authentications from this address: try again in 10 minutes."


def get(client, path, token=None, address=GUESSER):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.get(f"/api/v1/{path}", REMOTE_ADDR=address, **headers)


def test_it_locks_an_address_out_after_30_made_up_api_tokens(client, alice):
    right = token_for(alice)["HTTP_AUTHORIZATION"].removeprefix("Bearer ")

    answers = [get(client, "models", f"dhu_made-up-{n}") for n in range(50)]

    assert [a.status_code for a in answers[:30]] == [401] * 30
    assert {a.status_code for a in answers[30:]} == {429}
    assert answers[30].json() == {"error": LOCKED}
    assert 590 <= int(answers[30]["Retry-After"]) <= 600
    # The right token from the locked address is refused too: the guesser learns nothing.
    assert get(client, "models", right).status_code == 429
    assert get(client, "models", right, address=NEIGHBOUR).status_code == 200


def test_it_locks_an_address_out_after_30_made_up_device_tokens(client, make_device):
    _, right = make_device("edge-1")

    answers = [get(client, "device", f"dht_made-up-{n}") for n in range(31)]

    assert [a.status_code for a in answers[:30]] == [401] * 30
    assert answers[30].status_code == 429 and answers[30].json() == {"error": LOCKED}
    # The device's own token on its own calls is still served: a script's made-up tokens on
    # the worker's address must not cost the worker its heartbeats and its job.
    assert get(client, "device", right).status_code == 200
    assert post(client, "device/heartbeat", right).status_code == 200
    assert get(client, "device", f"dht_made-up-{99}").status_code == 429


def test_it_counts_api_and_device_tokens_together(client, alice):
    for n in range(15):
        get(client, "models", f"dhu_made-up-{n}")
        get(client, "device", f"dht_made-up-{n}")

    assert get(client, "models", "dhu_one-more").status_code == 429


def test_it_lets_the_address_in_again_when_the_lockout_is_over(client, alice):
    right = token_for(alice)["HTTP_AUTHORIZATION"].removeprefix("Bearer ")
    for n in range(30):
        get(client, "models", f"dhu_made-up-{n}")
    assert get(client, "models", right).status_code == 429

    # 10 minutes later.
    earlier = timezone.now() - timedelta(minutes=10, seconds=1)
    TokenFailures.objects.update(window_started_at=earlier, locked_until=earlier)

    assert get(client, "models", right).status_code == 200
    assert get(client, "models", "dhu_made-up").status_code == 401
    assert TokenFailures.objects.get(address=GUESSER).failures == 1


def test_it_counts_only_presented_tokens_not_missing_ones(client, alice):
    answers = [get(client, "models") for _ in range(40)] + [get(client, "device")] * 5

    assert {a.status_code for a in answers} == {401}
    assert not TokenFailures.objects.exists()


def test_a_right_token_writes_no_count(client, alice, make_device):
    right = token_for(alice)["HTTP_AUTHORIZATION"].removeprefix("Bearer ")
    _, device_token = make_device("edge-1")

    for _ in range(40):
        assert get(client, "models", right).status_code == 200
        assert get(client, "device", device_token).status_code == 200

    assert not TokenFailures.objects.exists()


def test_it_logs_one_line_when_it_locks_an_address_out(client, alice, caplog):
    with caplog.at_level(logging.WARNING, logger="deployhub.security"):
        for n in range(45):
            get(client, "models", f"dhu_made-up-{n}")

    lines = [r.getMessage() for r in caplog.records if r.name == "deployhub.security"]
    assert lines == [
        f"token authentication locked out for 600 s: {GUESSER} after 30 made-up tokens "
        "(last on /api/v1/models)"
    ]


def test_it_takes_the_limit_and_the_lockout_from_settings(client, alice, settings):
    settings.DEPLOYHUB_TOKEN_FAILURE_LIMIT = 3
    settings.DEPLOYHUB_TOKEN_LOCKOUT_SECONDS = 120

    statuses = [get(client, "models", f"dhu_made-up-{n}").status_code for n in range(4)]

    assert statuses == [401, 401, 401, 429]
    assert 110 <= int(get(client, "models", "dhu_x")["Retry-After"]) <= 120


def test_it_counts_by_the_address_the_proxy_saw_when_told_there_is_one(client, alice, settings):
    settings.DEPLOYHUB_PROXY_COUNT = 1
    behind_proxy = {"REMOTE_ADDR": "10.0.0.1"}
    for n in range(30):
        client.get(
            "/api/v1/models",
            HTTP_AUTHORIZATION=f"Bearer dhu_made-up-{n}",
            HTTP_X_FORWARDED_FOR=f"203.0.113.9, {GUESSER}",
            **behind_proxy,
        )

    assert set(TokenFailures.objects.values_list("address", flat=True)) == {GUESSER}
    right = token_for(alice)
    assert client.get("/api/v1/models", HTTP_X_FORWARDED_FOR=GUESSER, **right).status_code == 429
    assert client.get("/api/v1/models", HTTP_X_FORWARDED_FOR=NEIGHBOUR, **right).status_code == 200
    # A header that is not an address is not trusted: the peer is counted instead.
    client.get("/api/v1/models", HTTP_AUTHORIZATION="Bearer x", HTTP_X_FORWARDED_FOR="junk")
    assert TokenFailures.objects.filter(address="127.0.0.1").exists()


def post(client, path, token, address=GUESSER):
    return client.post(
        f"/api/v1/{path}",
        "{}",
        content_type="application/json",
        REMOTE_ADDR=address,
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def test_it_answers_a_known_token_at_the_wrong_call_403_and_never_counts_it(
    client, alice, make_device
):
    # Valid tokens sent where they do not belong once locked the worker's address out.
    _, device_token = make_device("edge-1")
    personal = token_for(alice)["HTTP_AUTHORIZATION"].removeprefix("Bearer ")
    pipeline = token_for(alice, "pipeline")["HTTP_AUTHORIZATION"].removeprefix("Bearer ")

    answers = [post(client, "models", device_token) for _ in range(15)]
    answers += [post(client, "device/heartbeat", pipeline) for _ in range(10)]
    answers += [get(client, "device", personal) for _ in range(10)]
    answers += [post(client, "jobs/1/claim", pipeline) for _ in range(5)]

    assert {a.status_code for a in answers} == {403}
    assert "device token" in answers[0].json()["error"]
    assert "personal API token" in answers[-1].json()["error"]
    assert not TokenFailures.objects.exists()
    assert post(client, "device/heartbeat", device_token).status_code == 200
    assert get(client, "models", personal).status_code == 200


def test_a_known_token_at_the_wrong_call_is_refused_429_from_a_locked_address(
    client, alice, make_device
):
    _, device_token = make_device("edge-1")
    for n in range(30):
        get(client, "models", f"dhu_made-up-{n}")

    answer = post(client, "models", device_token)

    assert answer.status_code == 429 and answer.json() == {"error": LOCKED}
    assert TokenFailures.objects.get(address=GUESSER).failures == 30


def submit(version, device_class, alice, kind, **params):
    return submit_job(
        team=version.team,
        kind=kind,
        device_class=device_class,
        user=alice,
        model_version=version,
        params=params,
    )


def finished_once(job_id, worker):
    """Wait for the job to end; return it and what befell it after it was queued (events)."""
    job = wait_until(
        lambda: (j := Job.objects.get(pk=job_id)).is_final and j,
        60,
        f"job {job_id} to finish",
        on_timeout=worker.output,
    )
    events = Event.objects.filter(target_type="job", target_id=job_id).order_by("pk")
    return job, [verb for verb in events.values_list("verb", flat=True) if verb != "job.queued"]


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_worker_sharing_the_address_of_wrong_calls_finishes_its_job_once(
    live_server, version, device_class, make_device, start_worker, alice
):
    # As it was reported: make run's worker shares 127.0.0.1 with every local script.
    device, device_token = make_device()
    worker = start_worker(device, device_token)
    running = submit(version, device_class, alice, JobKind.BENCHMARK, duration_s=3, warmup_s=0.2)
    wait_until(lambda: Job.objects.get(pk=running.pk).progress > 0, 60, "the job to run", 0.05)
    pipeline = token_for(alice, "pipeline")["HTTP_AUTHORIZATION"]

    # 30 valid tokens where they do not belong, from the worker's address.
    wrong = [("POST", "models", f"Bearer {device_token}")] * 15
    wrong += [("POST", "device/heartbeat", pipeline)] * 15
    answers = [
        requests.request(
            method,
            f"{live_server.url}/api/v1/{path}",
            json={},
            headers={"Authorization": header},
            timeout=30,
        ).status_code
        for method, path, header in wrong
    ]
    after_calls = timezone.now()
    queued = submit(version, device_class, alice, JobKind.NOOP)

    assert set(answers) == {403}
    for job_id in (running.pk, queued.pk):
        job, verbs = finished_once(job_id, worker)
        assert job.state == JobState.SUCCEEDED and job.attempt == 1, job.log + job.error
        assert verbs == ["job.claimed", "job.succeeded"]
    device.refresh_from_db()
    assert device.last_heartbeat_at > after_calls  # online: its calls go through
    assert not TokenFailures.objects.exists()
