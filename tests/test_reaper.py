"""The reaper: expired leases are re-queued, bounded, and re-published on the broker."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from deployhub.jobs.actions import claim_job, reap_expired_jobs, submit_job
from deployhub.jobs.models import Job, JobKind, JobState


@pytest.fixture
def running_job(version, device_class, alice, make_device):
    job = submit_job(
        team=version.team,
        kind=JobKind.BENCHMARK,
        device_class=device_class,
        user=alice,
        model_version=version,
    )
    device, _ = make_device()
    return claim_job(job.pk, device, 1)


def expire(job):
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


@pytest.mark.django_db(transaction=True)
def test_it_requeues_a_job_whose_lease_expired_and_publishes_it(running_job, broker):
    queue = running_job.device_class.queue
    broker.delete(queue)
    expire(running_job)
    reap_expired_jobs()
    job = Job.objects.get(pk=running_job.pk)
    assert job.state == JobState.QUEUED and job.attempt == 2 and job.device is None
    assert "lease expired" in job.log
    assert broker.llen(queue) == 1  # the new attempt is on the device class's queue
    assert job.sent_at is not None


def test_it_leaves_a_job_with_a_live_lease_alone(running_job):
    reap_expired_jobs()
    job = Job.objects.get(pk=running_job.pk)
    assert job.state == JobState.RUNNING and job.attempt == 1


def test_it_fails_a_job_past_its_attempts_with_worker_lost(running_job):
    Job.objects.filter(pk=running_job.pk).update(attempt=3, max_attempts=3)
    expire(running_job)
    reap_expired_jobs()
    job = Job.objects.get(pk=running_job.pk)
    assert job.state == JobState.FAILED
    assert "worker lost" in job.error


def test_it_cancels_an_expired_job_whose_cancel_was_requested(running_job):
    Job.objects.filter(pk=running_job.pk).update(cancel_requested=True)
    expire(running_job)
    reap_expired_jobs()
    assert Job.objects.get(pk=running_job.pk).state == JobState.CANCELLED


def test_the_hub_worker_runs_the_reaper_on_a_schedule():
    from deployhub.celery import app

    app.loader.import_default_modules()  # what a starting worker does
    entry = app.conf.beat_schedule["reap-expired-leases"]
    assert entry["task"] == "deployhub.jobs.reap"
    assert "deployhub.jobs.reap" in app.tasks


def a_lease_later():
    return timezone.now() + timedelta(seconds=settings.DEPLOYHUB_JOB_LEASE_SECONDS + 1)


@pytest.mark.django_db(transaction=True)
def test_it_sends_again_a_queued_job_whose_message_the_broker_lost(job, broker):
    queue = job.device_class.queue
    assert broker.llen(queue) == 1
    broker.delete(queue)  # Redis restarted without its data (the soak's redis-restart fault)

    reap_expired_jobs(now=a_lease_later())

    assert broker.llen(queue) == 1
    job = Job.objects.get(pk=job.pk)
    assert job.state == JobState.QUEUED and job.attempt == 1
    assert "its message is not on the broker: sent again" in job.log


@pytest.mark.django_db(transaction=True)
def test_it_leaves_a_queued_job_whose_message_waits_alone(job, broker):
    reap_expired_jobs(now=a_lease_later())

    assert broker.llen(job.device_class.queue) == 1
    assert "sent again" not in Job.objects.get(pk=job.pk).log


@pytest.mark.django_db(transaction=True)
def test_it_waits_a_lease_before_it_calls_a_message_lost(job, broker):
    broker.delete(job.device_class.queue)  # a worker took it and is claiming it right now

    reap_expired_jobs()

    assert broker.llen(job.device_class.queue) == 0
