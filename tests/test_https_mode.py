"""HTTPS mode: a device asks the hub for its class's work and never touches the broker.

`POST /api/v1/device/work` takes the class's oldest queued job for the device, or holds
the ask until one is queued; a real worker started without a broker URL runs a job end
to end through it (docs/protocol.md).
"""

import threading

import pytest
from django.db import connection

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.devices.models import Delivery, Device
from deployhub.jobs.actions import reap_expired_jobs
from deployhub.jobs.models import JobState
from tests.api_calls import call
from tests.conftest import job_finished, queued_benchmark

pytestmark = pytest.mark.django_db(transaction=True)


def queue(version, device_class, alice, n=1):
    return [queued_benchmark(version, device_class, alice) for _ in range(n)]


def asking_in_a_thread(client, token, wait, answers):
    """Start an ask in a thread of its own (its database connection closed as it ends)."""

    def ask_and_close():
        try:
            answers.append(ask(client, token, wait))
        finally:
            connection.close()

    thread = threading.Thread(target=ask_and_close)
    thread.start()
    return thread


def while_held(client, asks, action, wait=20):
    """Hold the asks ((device, token) pairs) in threads, run action() once the hub holds
    them all and they sleep; return the asks' answers and what action() returned."""
    from deployhub.jobs.waiting import WAITERS

    answers = []
    threads = [asking_in_a_thread(client, token, wait, answers) for _, token in asks]
    try:
        held = lambda: all(WAITERS.holds_ask_of(device.pk) for device, _ in asks)  # noqa: E731
        while not held() and all(thread.is_alive() for thread in threads):
            threading.Event().wait(0.01)
        threading.Event().wait(0.2)  # past their first look: asleep until there is news
        result = action()
    finally:
        for thread in threads:
            thread.join(wait + 10)
    assert len(answers) == len(asks), answers
    return answers, result


def ask(client, token, wait=0):
    response = call(client, token, "device/work", {"wait": wait})
    assert response.status_code == 200, response.content
    return response.json()


def test_an_idle_class_answers_no_job_and_counts_the_ask_as_a_heartbeat(client, make_device):
    device, token = make_device()
    answer = ask(client, token)
    assert answer["job"] is None and answer["state"] == "online"
    device.refresh_from_db()
    assert device.is_online and device.delivery == Delivery.HTTPS


def test_the_oldest_queued_job_of_the_class_is_claimed_for_the_device(
    client, make_device, version, device_class, alice
):
    device, token = make_device()
    ask(client, token)  # the device now takes work over HTTPS
    first, second = queue(version, device_class, alice, 2)
    answer = ask(client, token)
    assert answer["job"]["id"] == first.pk and answer["job"]["attempt"] == 1
    assert answer["job"]["inputs"]["model"]["url"].endswith(f"/jobs/{first.pk}/inputs/model")
    first.refresh_from_db()
    assert (first.state, first.device_id) == (JobState.RUNNING, device.pk)
    assert ask(client, token)["job"]["id"] == second.pk
    assert ask(client, token)["job"] is None


def test_a_job_queued_while_the_device_waits_reaches_it_in_the_same_ask(
    client, make_device, version, device_class, alice
):
    device, token = make_device()
    [answer], [job] = while_held(
        client, [(device, token)], lambda: queue(version, device_class, alice)
    )
    assert answer["job"] is not None and answer["job"]["id"] == job.pk


def test_a_draining_device_gets_no_job(client, make_device, version, device_class, alice):
    device, token = make_device()
    device.draining = True
    device.save()
    [job] = queue(version, device_class, alice)
    answer = ask(client, token, wait=5)
    assert answer["job"] is None and answer["state"] == "draining"
    assert answer["retry_after"] > 0
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_another_class_s_jobs_are_never_handed_over(
    client, make_device, version, device_class, alice, demo_team
):
    from deployhub.devices.models import DeviceClass

    other = DeviceClass.objects.create(team=demo_team, slug=f"{device_class.slug}-b", name="B")
    [job] = queue(version, other, alice)
    device, token = make_device()
    assert ask(client, token)["job"] is None
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_a_class_whose_devices_all_ask_over_https_puts_nothing_on_the_broker(
    client, make_device, version, device_class, alice, broker
):
    device, token = make_device()
    ask(client, token)
    [job] = queue(version, device_class, alice)
    assert broker.llen(device_class.queue) == 0
    job.refresh_from_db()
    assert job.sent_at is not None  # the reaper does not send it again
    reap_expired_jobs()
    assert broker.llen(device_class.queue) == 0


def test_a_class_with_a_broker_device_still_gets_its_messages(
    client, make_device, version, device_class, alice, broker
):
    make_device()  # registered by hand: broker mode until it says otherwise
    queue(version, device_class, alice)
    assert broker.llen(device_class.queue) == 1


def test_a_wait_and_a_delivery_of_the_wrong_type_are_refused(client, make_device):
    device, token = make_device()
    assert call(client, token, "device/work", {"wait": "soon"}).status_code == 400
    assert call(client, token, "device/work", {"wait": 600}).status_code == 400
    answer = call(client, token, "device/heartbeat", {"delivery": "pigeon"})
    assert answer.status_code == 400 and "delivery" in answer.json()["error"]


@pytest.mark.e2e
def test_a_worker_without_a_broker_runs_a_job_over_https(
    start_worker, make_device, version, device_class, alice
):
    device, token = make_device()
    worker = start_worker(device, token, mode="https")
    assert "over HTTPS" in worker.output()
    [job] = queue(version, device_class, alice)
    job = job_finished(job, worker)
    assert job.state == JobState.SUCCEEDED, job.error + worker.output()
    assert BenchmarkRun.objects.filter(job=job).exists()
    device.refresh_from_db()
    assert device.delivery == Delivery.HTTPS


def test_a_process_holding_all_the_asks_it_may_answers_at_once_with_a_jittered_retry(
    client, make_device, settings
):
    settings.DEPLOYHUB_POLL_MAX_WAITERS = 1
    first = make_device()
    _, second_token = make_device()
    _, answer = while_held(client, [first], lambda: ask(client, second_token, wait=20), wait=3)
    assert answer["job"] is None
    assert 1 <= answer["retry_after"] <= 5


def test_a_device_revoked_while_it_waits_is_handed_no_job(
    client, make_device, version, device_class, alice
):
    from django.utils import timezone

    device, token = make_device()

    def revoke_then_queue():
        Device.objects.filter(pk=device.pk).update(revoked_at=timezone.now())
        return queue(version, device_class, alice)

    [answer], [job] = while_held(client, [(device, token)], revoke_then_queue)
    assert answer["job"] is None
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.device is None


def test_a_device_api_with_many_threads_can_share_a_pool_of_connections():
    import json

    from tests.conftest import hub_started_with

    code = (
        "from django.conf import settings as s; d = s.DATABASES['default']; "
        "print(json.dumps([d['CONN_MAX_AGE'], d['OPTIONS'].get('pool')]))"
    )
    postgres = "postgres://deployhub@db.example:5432/deployhub"
    pooled = hub_started_with(code, DATABASE_URL=postgres, DATABASE_POOL_MAX_SIZE="20")
    assert pooled.returncode == 0, pooled.stderr[-2000:]
    max_age, pool = json.loads(pooled.stdout)
    assert max_age == 0 and pool["max_size"] == 20  # a pool, not a connection per thread
    kept = hub_started_with(code, DATABASE_URL=postgres, DATABASE_CONN_MAX_AGE="60")
    assert json.loads(kept.stdout) == [60, None]


def test_jobs_queued_together_reach_every_waiting_device(
    client, make_device, version, device_class, alice
):
    """PostgreSQL delivers identical notifications of one transaction once: auto mode queues
    its grid of builds in one, and every device waiting must hear of its job."""
    from django.db import transaction

    def queue_three_at_once():
        with transaction.atomic():
            return queue(version, device_class, alice, 3)

    devices = [make_device() for _ in range(3)]
    answers, jobs = while_held(client, devices, queue_three_at_once)
    assert sorted(a["job"]["id"] for a in answers if a["job"]) == sorted(j.pk for j in jobs)


def test_a_device_s_second_ask_is_not_held_while_its_first_is(client, make_device):
    device, token = make_device()
    _, answer = while_held(client, [(device, token)], lambda: ask(client, token, wait=20), wait=3)
    assert answer["job"] is None and 1 <= answer["retry_after"] <= 5


def test_a_device_deleted_while_it_waits_gets_an_answer_not_a_500(
    client, make_device, version, device_class, alice
):
    device, token = make_device()

    def delete_then_queue():
        Device.objects.filter(pk=device.pk).delete()
        queue(version, device_class, alice)

    [answer], _ = while_held(client, [(device, token)], delete_then_queue)
    assert answer["job"] is None
