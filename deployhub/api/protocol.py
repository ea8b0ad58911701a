"""API v1 for devices: the job protocol (docs/protocol.md)."""

import random
import time

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import connection
from django.http import JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from deployhub.api.auth import (
    BadInput,
    device_required,
    error,
    field_length,
    integer,
    json_body,
    json_object,
    number,
    plain_device_call,
    text,
)
from deployhub.core.downloads import file_download
from deployhub.core.json_input import size_problem
from deployhub.devices.models import Delivery
from deployhub.engines import signing
from deployhub.engines.actions import compatibility, record_fingerprint, serving_refusal
from deployhub.engines.models import Engine
from deployhub.jobs import actions, kinds, waiting
from deployhub.jobs.artifacts import store_artifact
from deployhub.jobs.models import Artifact, Job, JobState
from workers.fingerprint import shape_problem


def _attempt(data):
    """The attempt a call is for: required, an integer (a form sends its digits)."""
    attempt = integer(data, "attempt")
    if attempt is None:
        raise BadInput("attempt must be an integer.")
    return attempt


def _job_for(device, job_id):
    """Return a job of the device's class; 404 for anything else, so ids do not leak."""
    return get_object_or_404(Job, pk=job_id, device_class__team=device.device_class.team)


def device_json(device):
    """What GET device answers: who the device is and how it talks to the hub (enrolment too)."""
    return {
        "id": device.pk,
        "name": device.name,
        "device_class": device.device_class.slug,
        "queue": device.device_class.queue,
        "team": device.device_class.team.slug,
        "state": device.state,
        "has_fingerprint": bool(device.fingerprint),
        "heartbeat_interval": settings.DEPLOYHUB_HEARTBEAT_INTERVAL,
        "job_lease_seconds": settings.DEPLOYHUB_JOB_LEASE_SECONDS,
        "signing_public_key": signing.public_key_hex(),
    }


def _file_input(job, name, sha256, size, filename):
    return {
        "url": f"/api/v1/jobs/{job.pk}/inputs/{name}",
        "sha256": sha256,
        "size": size,
        "filename": filename,
    }


def _engine_input(engine):
    return {
        "url": f"/api/v1/engines/{engine.pk}/download",
        "id": engine.pk,
        "sha256": engine.sha256,
        "size": engine.size,
        "signature": engine.signature,
        "backend": engine.backend,
        "build_config": engine.build_config,
        "compat_key": engine.compat_key,
        "filename": f"engine-{engine.pk}",
    }


def _inputs(job, device=None):
    """Return the files a job needs, as its kind declares them (jobs/kinds.py)."""
    return {
        name: (
            _engine_input(found.engine)
            if isinstance(found, kinds.EngineInput)
            else _file_input(job, name, found.sha256, found.size, found.filename)
        )
        for name, found in kinds.inputs_of(job, device).items()
    }


def _job_json(job, device=None):
    return {
        "id": job.pk,
        "kind": job.kind,
        "attempt": job.attempt,
        "params": job.params,
        "lease_seconds": settings.DEPLOYHUB_JOB_LEASE_SECONDS,
        "lease_expires_at": job.lease_expires_at.isoformat() if job.lease_expires_at else None,
        "cancel_requested": job.cancel_requested,
        "inputs": _inputs(job, device),
        "model_io": _model_io(job.model_version),
    }


def _model_io(version):
    """Return the signature and contract every feed of the version is made from, or None."""
    if version is None:
        return None
    return {"inputs": version.inputs, "outputs": version.outputs, "contract": version.contract}


@require_GET
@device_required
def whoami(request, device):
    return JsonResponse(device_json(device))


def reported_fingerprint(data):
    """The fingerprint a heartbeat reports, None when none; BadInput when it is bigger than
    the hub keeps or has a field the hub cannot read (workers/fingerprint.py SHAPE).
    Enrolment reads its fingerprint with it too."""
    fingerprint = json_object(data, "fingerprint")
    if fingerprint is None:
        return None
    limit = settings.DEPLOYHUB_MAX_FINGERPRINT_BYTES
    if problem := size_problem(fingerprint, "The fingerprint", limit):
        raise BadInput(f"{problem} A worker's own is a few KiB: check its override file.")
    if problem := shape_problem(fingerprint):
        raise BadInput(f"{problem}.")
    return fingerprint


@require_POST
@device_required
def device_heartbeat(request, device):
    body = json_body(request, scrub=True)
    fingerprint = reported_fingerprint(body)
    delivery = text(body, "delivery")
    if delivery is not None and delivery not in Delivery.VALUES:
        raise BadInput(f"delivery must be one of: {', '.join(Delivery.VALUES)}.")
    if fingerprint is not None:
        record_fingerprint(device, fingerprint)
    if delivery is not None and delivery != device.delivery:
        _record_delivery(device, delivery)
    device.record_heartbeat()
    return JsonResponse(
        {"state": device.state, "heartbeat_interval": settings.DEPLOYHUB_HEARTBEAT_INTERVAL}
    )


def _record_delivery(device, delivery):
    """Keep how the device now takes work; a class that gains a broker consumer gets its
    queued jobs on the broker again from the reaper (jobs/actions.py _resend_lost)."""
    device.delivery = delivery
    device.save(update_fields=["delivery"])


@require_POST
@device_required
def device_work(request, device):
    """HTTPS mode: take the device's class's oldest queued job for it, waiting up to `wait`
    seconds (at most DEPLOYHUB_POLL_SECONDS) for one. Asking counts as a heartbeat."""
    body = json_body(request, scrub=True)
    wait = number(body, "wait", 0.0, low=0, high=60)
    wait = min(wait, settings.DEPLOYHUB_POLL_SECONDS)
    device.record_heartbeat()
    if device.delivery != Delivery.HTTPS:
        _record_delivery(device, Delivery.HTTPS)
    job, retry_after = _next_job(device, wait)
    return JsonResponse(
        {
            "job": None if job is None else _job_json(job, device),
            "state": device.state,
            "heartbeat_interval": settings.DEPLOYHUB_HEARTBEAT_INTERVAL,
            "retry_after": retry_after,
        }
    )


def _next_job(device, wait):
    """Return (the job taken for the device or None, seconds before it should ask again)."""
    if device.draining:
        return None, settings.DEPLOYHUB_HEARTBEAT_INTERVAL
    waiters = waiting.WAITERS
    held = waiters.holds_ask_of(device.pk)  # a second ask of one device is never held
    if wait and (held or waiters.count >= waiting.max_waiters()):
        # Every thread this process may hold is holding an ask, or one of this device's
        # (one device never takes the threads every team's devices share): answer now,
        # and spread the askers' return over a few seconds.
        job = _take_next(device)
        return job, 0 if job is not None else round(random.uniform(1, 5), 1)
    deadline = time.monotonic() + wait
    woken = False
    with waiters.registered(device.device_class_id, device.pk) as condition:
        while True:
            job = _take_next(device)  # none for a device drained or revoked now
            if job is None and woken and _taken_off(device):
                waiters.wake(device.device_class_id)  # the news was for a device that may run it
                return None, settings.DEPLOYHUB_HEARTBEAT_INTERVAL
            remaining = deadline - time.monotonic()
            if job is not None or remaining <= 0:
                return job, 0
            # A thousand held asks must not hold a thousand database connections: this
            # one is opened again when there is news.
            if not connection.in_atomic_block:
                connection.close()
            woken = waiters.wait(device.device_class_id, condition, remaining)
            if not woken:
                return None, 0


def _take_next(device):
    """The class's next job for the device, looking again while others outrun it to the
    jobs it found (a burst of jobs woke more devices than the look could offer)."""
    while True:
        try:
            return actions.take_next_job(device)
        except actions.Outrun:
            continue


def _taken_off(device):
    """True when the device was drained, revoked or deleted while its ask waited."""
    try:
        device.refresh_from_db(fields=["draining", "revoked_at"])
    except type(device).DoesNotExist:
        return True
    return device.draining or device.revoked_at is not None


@require_POST
@csrf_exempt
def claim(request, job_id):
    """Claim a job for the calling device. Every job's dispatch waits on this call: a claim
    sure to be granted is one statement that authenticates the device too (on PostgreSQL:
    jobs/models.py); any other goes the way of every device call, which says why not."""
    return _claim_in_one_statement(request, job_id) or _claim(request, job_id=job_id)


def _claim_in_one_statement(request, job_id):
    if (call := plain_device_call(request)) is None:
        return None
    token, address, body = call
    try:
        attempt = _attempt(body)
    except BadInput:
        return None  # said after the token is checked, as for any device call
    taken = actions.claim_for_token(job_id, token, address, attempt)
    return None if taken is None else _claimed(*taken)


@device_required
def _claim(request, device, job_id):
    job = actions.claim_job(job_id, device, _attempt(json_body(request, scrub=True)))
    return _claimed(job, device)


def _claimed(job, device):
    device.record_heartbeat()
    return JsonResponse(_job_json(job, device))


@require_POST
@device_required
def job_heartbeat(request, device, job_id):
    body = json_body(request, scrub=True)
    job = actions.heartbeat_job(
        job_id,
        device,
        _attempt(body),
        progress=number(body, "progress"),  # heartbeat_job clamps it into 0..1
        message=text(body, "message"),
        log=text(body, "log", ""),
    )
    return JsonResponse(
        {
            "lease_expires_at": job.lease_expires_at.isoformat(),
            "cancel_requested": job.cancel_requested,
        }
    )


@require_POST
@device_required
def complete(request, device, job_id):
    body = json_body(request, scrub=True)
    state = text(body, "state")
    if state not in JobState.FINAL:
        raise BadInput(f"state must be one of: {', '.join(JobState.FINAL)}.")
    try:
        job = actions.complete_job(
            job_id,
            device,
            _attempt(body),
            state,
            result=json_object(body, "result", {}),
            error=text(body, "error", ""),
            log=text(body, "log", ""),
            failure_category=text(body, "failure_category", ""),
        )
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    return JsonResponse({"id": job.pk, "state": job.state, "attempt": job.attempt})


@require_GET
@device_required
def job_input(request, device, job_id, name):
    job = _job_for(device, job_id)
    if job.device_id != device.pk or job.state != JobState.RUNNING:
        return error(403, "Inputs are served only to the device running the job.")
    found = kinds.inputs_of(job, device).get(name)
    if isinstance(found, kinds.FileInput):
        return _attachment(found.storage_name, found.filename)
    return error(404, f"This job has no input named {name!r}.")


def _attachment(storage_name, filename):
    return file_download(default_storage.open(storage_name, "rb"), filename)


@require_GET
@device_required
def engine_download(request, device, engine_id):
    """Serve an engine only to a device whose toolchain can run it: 409 says what differs."""
    # Its own class's engines, or a trusted class's (of its team): nothing else is handed over.
    engine = get_object_or_404(Engine.objects.runnable_by(device.device_class), pk=engine_id)
    runs, reason, diffs = compatibility(engine, device.fingerprint)
    if not runs:
        return JsonResponse({"error": reason, "differences": diffs}, status=409)
    if refusal := serving_refusal(engine, device):  # revoked, or its stored bytes changed
        return error(409, refusal)
    return _attachment(engine.file.name, f"engine-{engine.pk}")


@require_POST
@device_required
def upload_artifact(request, device, job_id):
    job = _job_for(device, job_id)
    upload = request.FILES.get("file")
    name = text(request.POST, "name", max_length=field_length(Artifact, "name"))
    if upload is None or not name:
        raise BadInput("Send multipart fields 'attempt' and 'name' and a file 'file'.")
    artifact = store_artifact(job, device, _attempt(request.POST), name, upload)
    return JsonResponse(
        {
            "id": artifact.pk,
            "name": artifact.name,
            "sha256": artifact.sha256,
            "size": artifact.size,
        },
        status=201,
    )
