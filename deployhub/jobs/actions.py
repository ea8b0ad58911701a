"""State changes of a job. Each checks who may act, changes state, and writes the audit event.

The database is the source of truth: every change happens under a row lock, and
a worker's claim, heartbeat and completion are fenced by the attempt number.
"""

import functools
import logging
from datetime import timedelta

from django.conf import settings
from django.db import NotSupportedError, connection, transaction
from django.utils import timezone

from deployhub.core.json_input import tail
from deployhub.devices.models import DeviceClass
from deployhub.jobs import kinds, waiting
from deployhub.jobs.errors import JobConflict, ResultRejected, StaleAttempt, WrongDevice
from deployhub.jobs.models import (
    FAILURE_CATEGORIES,
    ClaimRefusalReason,
    ClaimRefusals,
    Job,
    JobState,
)
from deployhub.teams.models import Event
from deployhub.teams.webhooks import announce_on_commit

logger = logging.getLogger(__name__)

__all__ = ["JobConflict", "ResultRejected", "WrongDevice"]


def send_job(job_id, attempt, queue, countdown=None):
    """Publish the job id on its device class's queue; on failure the reaper resends it."""
    from deployhub.celery import app

    try:
        app.send_task("deployhub.run_job", args=[job_id, attempt], queue=queue, countdown=countdown)
    except Exception as exc:
        logger.warning("could not publish job %s: %s", job_id, exc)
        return
    Job.objects.filter(pk=job_id, attempt=attempt).update(sent_at=timezone.now())


def _enqueue(job):
    """Publish the job once its transaction commits: on its class's broker queue when a
    device of the class takes work from the broker, and always to the devices that ask
    for work over HTTPS (waiting.announce)."""
    device_class = job.device_class
    waiting.announce(device_class.pk, job.pk)  # on PostgreSQL: leaves at commit, with the job
    if device_class.delivers_by_broker():
        transaction.on_commit(lambda: send_job(job.pk, job.attempt, device_class.queue))
    else:  # nothing consumes the queue: the database carries the job to its devices
        job.sent_at = timezone.now()
        Job.objects.filter(pk=job.pk).update(sent_at=job.sent_at)


def submit_job(*, team, kind, device_class, user, model_version=None, params=None, engine=None):
    """Create a queued job and publish it once the transaction commits."""
    with transaction.atomic():
        job = Job.objects.create(
            team=team,
            kind=kind,
            device_class=device_class,
            model_version=model_version,
            engine=engine,
            params=params or {},
            created_by=user,
            max_attempts=settings.DEPLOYHUB_JOB_MAX_ATTEMPTS,
        )
        job.append_log(f"queued on {device_class.queue} by {user or 'the system'}")
        job.save(update_fields=["log"])
        # First, so the message goes out before other on-commit work (the event's webhooks).
        _enqueue(job)
        Event.record(
            team,
            user,
            "job.queued",
            job,
            kind=kind,
            device_class=device_class.slug,
            before=None,
            after=JobState.QUEUED,
        )
    return job


def _locked(job_id, device=None):
    """Lock and return the job; a device sees only its own team's jobs (others: DoesNotExist)."""
    # Only the job's row: a lock on the joined class row too would queue every claim,
    # heartbeat and completion of a class behind each other.
    jobs = Job.objects.select_for_update(of=("self",)).select_related("device_class")
    if device is None:
        return jobs.get(pk=job_id)
    job = jobs.filter(team_id=device.device_class.team_id).get(pk=job_id)
    job.team = device.device_class.team  # the same row, loaded with the device: no query
    return job


def _check_attempt(job, device, attempt):
    """Refuse a device of another class, or an attempt that is not the job's current one."""
    if job.device_class_id != device.device_class_id:
        raise WrongDevice("This job belongs to another device class.")
    if attempt != job.attempt:
        raise StaleAttempt(f"Attempt {attempt} is stale: the job is on attempt {job.attempt}.")


def check_holder(job, device, attempt):
    """Refuse a device that is not running the current attempt of the job."""
    _check_attempt(job, device, attempt)
    if job.device_id != device.pk:
        raise WrongDevice("This job is held by another device.")


# A draining device that claims anyway gets a 409; the job goes back on the queue after this.
DRAINING_RESEND_SECONDS = 2


def claim_job(job_id, device, attempt):
    """Give the job to the device for this attempt, under a fresh lease.

    One statement takes the row when it can be claimed (queued, on this attempt, of the
    device's class): every job's dispatch waits on it. Only when it takes nothing is the
    row read, to say why.
    """
    if device.draining:
        _send_back(job_id, device, attempt)
        ClaimRefusals.count_one(ClaimRefusalReason.DRAINING)
        raise JobConflict("This device is draining: it takes no new jobs.")
    try:
        with transaction.atomic():
            job = Job.objects.take(job_id, device, attempt, lease_expires_at=_lease_end())
            if job is None:
                _refuse_claim(_locked(job_id, device), device, attempt)
                # Nothing to refuse: queued again since the statement; ours now, under the lock.
                job = Job.objects.take(job_id, device, attempt, lease_expires_at=_lease_end())
            if job is None:
                raise JobConflict("The job changed while it was claimed.")
            _record_claim(job, device, attempt)
    except (JobConflict, WrongDevice) as exc:
        # Counted after the rollback, so the count stays: /metrics shows refusals by reason.
        ClaimRefusals.count_one(_refusal_reason(exc))
        raise
    return job


def _send_back(job_id, device, attempt):
    """Put the job a draining device was offered back on its class's queue for another
    device: only a queued job of the device's own class. Any other id it names is not its
    to send (a message on its queue, and a sent_at that keeps the reaper from resending a
    job whose message was lost)."""
    offered = Job.objects.filter(
        pk=job_id, device_class_id=device.device_class_id, attempt=attempt, state=JobState.QUEUED
    )
    if offered.exists():
        send_job(job_id, attempt, device.device_class.queue, countdown=DRAINING_RESEND_SECONDS)


def _refusal_reason(refusal):
    if isinstance(refusal, StaleAttempt):
        return ClaimRefusalReason.STALE_ATTEMPT
    if isinstance(refusal, WrongDevice):
        return ClaimRefusalReason.WRONG_CLASS
    return ClaimRefusalReason.NOT_QUEUED


# How many of its class's oldest queued jobs a device asking for work tries to take: others
# asking at the same moment take some of them first.
NEXT_JOB_CANDIDATES = 8


class Outrun(Exception):
    """Every queued job take_next_job found was taken by other devices first: look again."""


def take_next_job(device):
    """Give the device its class's oldest queued job, claimed as claim_job does; or None.

    The same cost whatever the backlog: an index holds only queued jobs, by class and age.
    On PostgreSQL one statement finds, takes and records it (devices asking at the same
    moment take different jobs). Elsewhere (SQLite, one writer at a time) two: the oldest
    few queued jobs of the class, then a take of the first one still free; it raises
    Outrun when it found jobs but others took them all first.
    """
    if device.draining:
        return None
    if connection.vendor == "postgresql":
        return _take_oldest(device)
    candidates = _oldest_queued(device)
    for job_id, attempt in candidates:
        with transaction.atomic():
            job = Job.objects.take(job_id, device, attempt, lease_expires_at=_lease_end())
            if job is not None:
                _record_claim(job, device, attempt)
                return job
    if candidates:
        raise Outrun(f"{len(candidates)} queued job(s) taken by others first")
    return None


def _take_oldest(device):
    """take_next_job on PostgreSQL: one statement takes the oldest queued job and records
    its claim (Job.objects.take_oldest), outside a transaction of its own; the team's
    webhooks hear of it as of every event."""
    try:
        taken = Job.objects.take_oldest(device, lease_expires_at=_lease_end())
    except NotSupportedError:
        # The prepared statement outlived a change of a column's type (a migration while
        # the hub ran): PostgreSQL refuses it. A rollback makes psycopg deallocate the
        # connection's statements (as claim_for_token's does); the take is prepared again.
        with transaction.atomic():
            Job.objects.exists()
            transaction.set_rollback(True)
        taken = Job.objects.take_oldest(device, lease_expires_at=_lease_end())
    if taken is None:
        return None
    job, event, webhooks = taken
    job.team = device.device_class.team  # the same row, loaded with the device: no query
    if webhooks:
        announce_on_commit(event)  # no transaction here: at once
    return job


def _oldest_queued(device):
    """The (id, attempt) of the class's oldest queued jobs, none when the device is draining
    or revoked now (it may have been drained while its ask waited)."""
    with connection.cursor() as cursor:
        cursor.execute(*oldest_queued_query(device))
        return cursor.fetchall()


def oldest_queued_query(device):
    """The statement _oldest_queued runs, and its parameters. Written out: every ask for work
    runs it, and the ORM took twice as long to compile it as the database to run it."""
    quote = connection.ops.quote_name
    jobs, devices = quote(Job._meta.db_table), quote(type(device)._meta.db_table)
    sql = (
        f"SELECT id, attempt FROM {jobs} WHERE device_class_id = %s AND state = %s "
        f"AND EXISTS (SELECT 1 FROM {devices} WHERE id = %s AND NOT draining "
        f"AND revoked_at IS NULL) ORDER BY created_at, id LIMIT {NEXT_JOB_CANDIDATES}"
    )
    return sql, [device.device_class_id, JobState.QUEUED, device.pk]


def claim_for_token(job_id, token, address, attempt):
    """Claim the job for the device holding the token in one statement that authenticates it
    too, when the claim is sure to be granted (Job.objects.take_for_token): return (the job,
    the device), or None, and the caller authenticates the device and calls claim_job."""
    try:
        with transaction.atomic():
            taken = Job.objects.take_for_token(
                job_id, token, address, attempt, lease_expires_at=_lease_end()
            )
            if taken is not None:
                job, device = taken
                _record_claim(job, device, attempt)
    except NotSupportedError:
        # The prepared statement outlived a change of a column's type (a migration while the
        # hub ran): PostgreSQL refuses it once on each connection, and it is prepared again.
        return None
    return taken


def _lease_end():
    return timezone.now() + timedelta(seconds=settings.DEPLOYHUB_JOB_LEASE_SECONDS)


def _record_claim(job, device, attempt):
    job.team = device.device_class.team  # the same row, loaded with the device: no query
    Event.record(
        job.team,
        f"device:{device}",
        "job.claimed",
        job,
        attempt=attempt,
        before=JobState.QUEUED,
        after=job.state,
    )


def _refuse_claim(job, device, attempt):
    """Raise why the device may not claim this attempt of the job (nothing: it may)."""
    _check_attempt(job, device, attempt)
    if job.state != JobState.QUEUED:
        raise JobConflict(f"The job is {job.state}; it cannot be claimed.")


def heartbeat_job(job_id, device, attempt, progress=None, message=None, log=""):
    """Extend the lease and record progress; return the job (see its cancel_requested)."""
    with transaction.atomic():
        job = _locked(job_id, device)
        check_holder(job, device, attempt)
        if job.state != JobState.RUNNING:
            raise JobConflict(f"The job is {job.state}.")
        job.lease_expires_at = timezone.now() + timedelta(
            seconds=settings.DEPLOYHUB_JOB_LEASE_SECONDS
        )
        if progress is not None:
            job.progress = min(max(float(progress), 0.0), 1.0)
        if message is not None:
            job.message = str(message)[:200]
        job.append_log(log, source=None)
        job.save()
    device.record_heartbeat()
    return job


def _is_repeat(job, device, attempt, state):
    return (
        job.is_final
        and job.state == state
        and job.device_id == device.pk
        and job.attempt == attempt
    )


def complete_job(
    job_id, device, attempt, state, result=None, error="", log="", failure_category=""
):
    """Finish the current attempt; a repeat of the same completion changes nothing.

    failure_category is how the worker classified a failed build (FAILURE_CATEGORIES).
    """
    if state not in JobState.FINAL:
        raise ValueError(f"state must be one of {', '.join(JobState.FINAL)}")
    if failure_category and failure_category not in FAILURE_CATEGORIES:
        raise ValueError(f"failure_category must be one of {', '.join(FAILURE_CATEGORIES)}")
    refused = _precheck(job_id, device, attempt, state, result or {})
    with transaction.atomic():
        job = _locked(job_id, device)
        if _is_repeat(job, device, attempt, state):
            return job
        check_holder(job, device, attempt)
        if job.state != JobState.RUNNING:
            raise JobConflict(f"The job is {job.state}; it cannot be completed.")
        job.append_log(log, source=None)
        if state == JobState.SUCCEEDED and refused:
            state, error = JobState.FAILED, refused
        elif state == JobState.SUCCEEDED:
            state, error = _store_result(job, result or {})
        if state == JobState.FAILED:
            job.failure_category = failure_category or ""
        _finish(job, state, error=error)
        Event.record(
            job.team,
            f"device:{device}",
            f"job.{state}",
            job,
            attempt=attempt,
            before=JobState.RUNNING,
            after=state,
        )
        for callback in kinds.finished_callbacks():
            transaction.on_commit(functools.partial(callback, job))
    return job


def _precheck(job_id, device, attempt, state, result):
    """Run the kind's slow checks of a result before the row is locked; return a refusal or ""."""
    if state != JobState.SUCCEEDED:
        return ""
    holder = {"device": device, "attempt": attempt, "state": JobState.RUNNING}
    job = Job.objects.filter(pk=job_id, **holder).first()
    if job is None:
        return ""  # not this device's running attempt: the locked path answers it
    try:
        kinds.check(job, result)
    except ResultRejected as exc:
        return str(exc)
    return ""


def _store_result(job, result):
    """Store the result of a succeeded attempt; a rejected result fails the job instead."""
    try:
        with transaction.atomic():
            kinds.record(job, result)
    except ResultRejected as exc:
        return JobState.FAILED, str(exc)
    return JobState.SUCCEEDED, ""


def _finish(job, state, error=""):
    job.state = state
    job.error = tail(str(error or ""), settings.DEPLOYHUB_MAX_TEXT_CHARS)
    job.finished_at = timezone.now()
    job.lease_expires_at = None
    job.message = JobState.label(state)
    if state == JobState.SUCCEEDED:
        job.progress = 1.0
    job.append_log(f"{state}" + (f": {job.error}" if job.error else ""))
    job.save()


def cancel_job(job_id, user):
    """Cancel a queued job now, or ask the worker running it to stop."""
    with transaction.atomic():
        job = _locked(job_id)
        before = job.state
        if job.is_final:
            raise JobConflict(f"The job is already {job.state}.")
        if job.state == JobState.QUEUED:
            _finish(job, JobState.CANCELLED, error=f"cancelled by {user}")
        else:
            job.cancel_requested = True
            job.message = "cancel requested"
            job.append_log(f"cancel requested by {user}")
            job.save()
        after = job.state if job.is_final else f"{job.state}, cancel requested"
        Event.record(job.team, user, "job.cancel", job, before=before, after=after)
    return job


def _reap(job, now):
    before = job.state
    if job.cancel_requested:
        _finish(job, JobState.CANCELLED, error="cancelled; the worker stopped answering")
    elif job.attempt < job.max_attempts:
        _requeue(job, f"lease expired on device {job.device}")
    else:
        _finish(job, JobState.FAILED, error=f"worker lost after {job.attempt} attempts")
    Event.record(
        job.team,
        "reaper",
        f"job.reaped.{job.state}",
        job,
        attempt=job.attempt,
        before=before,
        after=job.state,
    )


def _requeue(job, why):
    """Put a running job back on its queue as its next attempt: its device will not finish it."""
    job.state = JobState.QUEUED
    job.attempt += 1
    job.device = None
    job.lease_expires_at = None
    job.sent_at = None
    job.message = f"re-queued: {why}"[: Job._meta.get_field("message").max_length]
    job.append_log(f"{why}; re-queued as attempt {job.attempt}")
    job.save()
    _enqueue(job)


def take_back_from_revoked(device, user=None, why=None):
    """Put the job a revoked device was running back on the queue at once, rather than when
    its lease expires (or end it as the reaper would: a cancel was asked for, or it has
    no attempt left). Return the jobs taken back."""
    running = Job.objects.filter(device=device, state=JobState.RUNNING)
    taken = []
    for job_id in running.values_list("pk", flat=True):
        with transaction.atomic():
            job = _locked(job_id)
            if job.state == JobState.RUNNING and job.device_id == device.pk:
                _take_back(job, why or f"device {device} was revoked", user)
                taken.append(job)
    return taken


def _take_back(job, why, user):
    before = job.state
    if job.cancel_requested:
        _finish(job, JobState.CANCELLED, error=f"cancelled; {why}")
    elif job.attempt < job.max_attempts:
        _requeue(job, why)
    else:
        _finish(job, JobState.FAILED, error=f"{why} during attempt {job.attempt}, its last")
    verb = f"job.device_revoked.{job.state}"
    Event.record(job.team, user, verb, job, attempt=job.attempt, before=before, after=job.state)


def reap_expired_jobs(now=None):
    """Re-queue (or fail, past max attempts) running jobs whose lease expired; resend lost sends."""
    now = now or timezone.now()
    expired = Job.objects.filter(state=JobState.RUNNING, lease_expires_at__lt=now)
    reaped = []
    for job_id in expired.values_list("pk", flat=True):
        with transaction.atomic():
            job = _locked(job_id)
            if job.state == JobState.RUNNING and job.lease_expires_at < now:
                _reap(job, now)
                reaped.append(job)
    _resend_unsent(now)
    _resend_lost(now)
    return reaped


def _resend_unsent(now):
    stale = now - timedelta(seconds=settings.DEPLOYHUB_REAPER_INTERVAL)
    unsent = Job.objects.filter(state=JobState.QUEUED, sent_at__isnull=True, created_at__lt=stale)
    for job in unsent.select_related("device_class"):
        send_job(job.pk, job.attempt, job.device_class.queue)


def _resend_lost(now):
    """Resend queued jobs whose messages the broker no longer holds.

    A broker restarted without its data, or a worker that took a message and died (or
    gave up on a hub answering 503) before claiming, leaves a job queued that no
    message names: nothing would ever run it. When a queue holds fewer messages than
    its sent, unclaimed jobs, the ones sent longest ago (over a lease's length) go
    again. A job whose message was there after all gets two: the second claim is
    refused (409) and dropped.
    """
    stale = now - timedelta(seconds=settings.DEPLOYHUB_JOB_LEASE_SECONDS)
    sent = Job.objects.filter(state=JobState.QUEUED, sent_at__isnull=False)
    late = DeviceClass.objects.filter(jobs__in=sent.filter(sent_at__lt=stale)).distinct()
    for device_class in late:
        if not device_class.delivers_by_broker():
            continue  # its devices take their jobs from the database, over HTTPS
        jobs = sent.filter(device_class=device_class)
        waiting = queue_depth(device_class.queue)
        missing = 0 if waiting is None else jobs.count() - waiting
        oldest = jobs.filter(sent_at__lt=stale).order_by("sent_at")[: max(missing, 0)]
        for job_id in oldest.values_list("pk", flat=True):
            _send_again(job_id)


def _send_again(job_id):
    with transaction.atomic():
        job = _locked(job_id)
        if job.state == JobState.QUEUED:
            job.append_log("its message is not on the broker: sent again")
            job.save(update_fields=["log"])
            _enqueue(job)


def queue_depth(queue):
    """Return how many messages wait in a queue, or None when the broker does not answer."""
    from kombu.exceptions import ChannelError, OperationalError

    from deployhub.celery import app

    with app.connection_for_write() as connection:
        try:
            connection.ensure_connection(max_retries=1, timeout=2)
            with connection.channel() as channel:
                return channel.queue_declare(queue=queue, passive=True).message_count
        except ChannelError:  # no such queue: nothing waits in it
            return 0
        except (OperationalError, *connection.connection_errors) as exc:
            logger.warning("cannot count the messages in %s: %s", queue, exc)
            return None
