"""API v1 for devices: the job protocol (docs/protocol.md)."""

import functools
import json

from django.conf import settings
from django.core.files.storage import default_storage
from django.http import FileResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from deployhub.devices.models import Device
from deployhub.jobs import actions
from deployhub.jobs.artifacts import store_artifact
from deployhub.jobs.models import Job, JobState
from deployhub.registry.inspect import InvalidModel
from deployhub.registry.models import VersionFormat


def error(status, message):
    return JsonResponse({"error": message}, status=status)


def device_required(view):
    """Authenticate the device by its bearer token and pass it to the view."""

    @csrf_exempt
    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return error(401, "A device token is required: Authorization: Bearer <token>.")
        device = Device.objects.by_token(header.removeprefix("Bearer ").strip())
        if device is None:
            return error(401, "This device token is not valid.")
        try:
            return view(request, device, *args, **kwargs)
        except actions.WrongDevice as exc:
            return error(403, str(exc))
        except actions.JobConflict as exc:
            return error(409, str(exc))
        except (BadRequest, InvalidModel) as exc:
            return error(400, str(exc))
        except Job.DoesNotExist:
            return error(404, "No such job.")

    return wrapper


class BadRequest(Exception):
    """The request body is not what the protocol says (HTTP 400)."""


def _body(request):
    try:
        body = json.loads(request.body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"The body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object.")
    return body


def _attempt(value):
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise BadRequest("attempt must be an integer.") from exc


def _job_for(device, job_id):
    """Return a job of the device's class; 404 for anything else, so ids do not leak."""
    return get_object_or_404(Job, pk=job_id, device_class__team=device.device_class.team)


def _device_json(device):
    return {
        "id": device.pk,
        "name": device.name,
        "device_class": device.device_class.slug,
        "queue": device.device_class.queue,
        "team": device.device_class.team.slug,
        "state": device.state,
        "heartbeat_interval": settings.DEPLOYHUB_HEARTBEAT_INTERVAL,
        "job_lease_seconds": settings.DEPLOYHUB_JOB_LEASE_SECONDS,
    }


def _input_filename(version):
    return f"{version.model.name}-v{version.number}{VersionFormat.EXTENSIONS[version.format]}"


def _inputs(job):
    version = job.model_version
    if version is None:
        return {}
    return {
        "model": {
            "url": f"/api/v1/jobs/{job.pk}/inputs/model",
            "sha256": version.sha256,
            "size": version.size,
            "filename": _input_filename(version),
        }
    }


def _job_json(job):
    return {
        "id": job.pk,
        "kind": job.kind,
        "attempt": job.attempt,
        "params": job.params,
        "lease_seconds": settings.DEPLOYHUB_JOB_LEASE_SECONDS,
        "lease_expires_at": job.lease_expires_at.isoformat() if job.lease_expires_at else None,
        "cancel_requested": job.cancel_requested,
        "inputs": _inputs(job),
    }


@require_GET
@device_required
def whoami(request, device):
    return JsonResponse(_device_json(device))


@require_POST
@device_required
def device_heartbeat(request, device):
    fingerprint = _body(request).get("fingerprint")
    if fingerprint is not None and not isinstance(fingerprint, dict):
        raise BadRequest("fingerprint must be a JSON object.")
    device.record_heartbeat(fingerprint)
    return JsonResponse(
        {"state": device.state, "heartbeat_interval": settings.DEPLOYHUB_HEARTBEAT_INTERVAL}
    )


@require_POST
@device_required
def claim(request, device, job_id):
    job = actions.claim_job(job_id, device, _attempt(_body(request).get("attempt")))
    device.record_heartbeat()
    return JsonResponse(_job_json(job))


@require_POST
@device_required
def job_heartbeat(request, device, job_id):
    body = _body(request)
    job = actions.heartbeat_job(
        job_id,
        device,
        _attempt(body.get("attempt")),
        progress=body.get("progress"),
        message=body.get("message"),
        log=str(body.get("log") or ""),
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
    body = _body(request)
    state = body.get("state")
    if state not in JobState.FINAL:
        raise BadRequest(f"state must be one of: {', '.join(JobState.FINAL)}.")
    result = body.get("result") or {}
    if not isinstance(result, dict):
        raise BadRequest("result must be a JSON object.")
    try:
        job = actions.complete_job(
            job_id,
            device,
            _attempt(body.get("attempt")),
            state,
            result=result,
            error=str(body.get("error") or ""),
            log=str(body.get("log") or ""),
        )
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    return JsonResponse({"id": job.pk, "state": job.state, "attempt": job.attempt})


@require_GET
@device_required
def job_input(request, device, job_id, name):
    job = _job_for(device, job_id)
    if job.device_id != device.pk or job.state != JobState.RUNNING:
        return error(403, "Inputs are served only to the device running the job.")
    if name != "model" or job.model_version is None:
        return error(404, f"This job has no input named {name!r}.")
    version = job.model_version
    return FileResponse(
        default_storage.open(version.file.name, "rb"),
        as_attachment=True,
        filename=_input_filename(version),
    )


@require_POST
@device_required
def upload_artifact(request, device, job_id):
    job = _job_for(device, job_id)
    upload = request.FILES.get("file")
    if upload is None or not request.POST.get("name"):
        raise BadRequest("Send multipart fields 'attempt' and 'name' and a file 'file'.")
    artifact = store_artifact(
        job, device, _attempt(request.POST.get("attempt")), request.POST["name"], upload
    )
    return JsonResponse(
        {
            "id": artifact.pk,
            "name": artifact.name,
            "sha256": artifact.sha256,
            "size": artifact.size,
        },
        status=201,
    )
