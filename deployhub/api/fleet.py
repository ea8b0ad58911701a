"""API v1 for people and scripts: devices, fingerprints, engines and compiles."""

from django.http import JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_http_methods
from ninja import Router

from deployhub.api.auth import (
    BadInput,
    flag,
    for_pipelines,
    json_body,
    json_object,
    text,
    token_required,
)
from deployhub.devices.access import get_device_for_user
from deployhub.devices.actions import revoke_device, set_draining
from deployhub.engines.access import get_engine_for_user
from deployhub.engines.actions import BuildRefused, compatibility, rebuild, request_compile
from deployhub.engines.gates import release_gates
from deployhub.engines.models import Engine
from deployhub.registry.access import get_version_for_user
from deployhub.teams.access import require_role
from deployhub.teams.models import Role
from workers.backends.known import DEFAULT_BACKEND

# Its django-ninja operations (api/openapi.py mounts it at /api/v1/).
router = Router(tags=["engines and devices"])


def device_json(device, changes=False):
    body = {
        "id": device.pk,
        "name": device.name,
        "device_class": device.device_class.slug,
        "state": device.state,
        "draining": device.draining,
        "last_heartbeat_at": device.last_heartbeat_at.isoformat()
        if device.last_heartbeat_at
        else None,
        "fingerprint": device.fingerprint,
        "revoked_at": device.revoked_at.isoformat() if device.revoked_at else None,
    }
    if changes:
        body["changes"] = [
            {"at": c.changed_at.isoformat(), "summary": c.summary}
            for c in device.fingerprint_changes.all()[:50]
        ]
    return body


def engine_json(engine):
    return {
        "id": engine.pk,
        "model_version": engine.model_version_id,
        "device_class": engine.device_class.slug,
        "backend": engine.backend,
        "build_config": engine.build_config,
        "compat_key": engine.compat_key,
        "compat_fields": engine.compat_fields,
        "sha256": engine.sha256,
        "size": engine.size,
        "status": engine.status,
        "status_reason": engine.status_reason,
        "accuracy_flags": engine.accuracy_flags,
        "quantised_nothing": engine.quantised_nothing,
        "release_gates": [gate.as_json() for gate in release_gates(engine)],
        "tool_versions": engine.tool_versions,
        "build_seconds": engine.build_seconds,
        "built_on": engine.built_on.name if engine.built_on else None,
        "created_at": engine.created_at.isoformat(),
    }


def _compile_answer(engine, job):
    if engine is not None:
        return JsonResponse({"reused": True, "engine": engine_json(engine)})
    return JsonResponse({"reused": False, "job": {"id": job.pk, "state": job.state}}, status=202)


@require_http_methods(["GET"])
@token_required
@for_pipelines
def device_detail(request, pk):
    device = get_device_for_user(request, pk)
    return JsonResponse(device_json(device, changes=True))


@require_http_methods(["POST"])
@token_required
def device_drain(request, pk):
    """Body {"draining": true|false}: stop or resume giving the device new jobs."""
    device = get_device_for_user(request, pk)
    set_draining(device, flag(json_body(request), "draining", True), request.user)
    return JsonResponse(device_json(device))


@require_http_methods(["POST"])
@token_required
def device_revoke(request, pk):
    """Revoke the device: its token stops working and its running job goes back on the queue."""
    device = get_device_for_user(request, pk)
    revoke_device(device, request.user)
    return JsonResponse(device_json(device))


@require_http_methods(["GET", "POST"])
@token_required
@for_pipelines
def version_engines(request, pk):
    """GET: the version's engines. POST {"device_class", "backend", "build_config"}: compile."""
    version = get_version_for_user(request, pk)
    if request.method == "GET":
        return JsonResponse(
            {"engines": [engine_json(e) for e in Engine.objects.for_version(version)]}
        )
    require_role(request.user, version.team, Role.ENGINEER)
    body = json_body(request)
    slug = text(body, "device_class", required=True)
    device_class = get_object_or_404(version.team.device_classes, slug=slug)
    backend = body.get("backend", DEFAULT_BACKEND)  # request_compile names the known ones
    build_config = json_object(body, "build_config", {})
    try:
        return _compile_answer(
            *request_compile(version, device_class, backend, build_config, request.user)
        )
    except BuildRefused as exc:
        raise BadInput(str(exc)) from exc


@require_http_methods(["GET"])
@token_required
@for_pipelines
def engine_detail(request, pk):
    engine = get_engine_for_user(request, pk)
    body = engine_json(engine)
    body["devices"] = [
        {"device": device.name, "runs": runs, "reason": reason}
        for device in engine.device_class.devices.all()
        for runs, reason, _ in [compatibility(engine, device.fingerprint)]
    ]
    return JsonResponse(body)


@require_http_methods(["POST"])
@token_required
@for_pipelines
def engine_rebuild(request, pk):
    engine = get_engine_for_user(request, pk)
    require_role(request.user, engine.team, Role.ENGINEER)
    return _compile_answer(*rebuild(engine, request.user))
