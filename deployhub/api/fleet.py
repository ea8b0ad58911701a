"""API v1 for people and pipelines: engines (list, read, compile, rebuild, compatibility with
a fingerprint) and devices (read, drain, revoke).

A pipeline token may read, compile, rebuild and check compatibility (auth=PIPELINES);
draining and revoking a device need a full token and a team admin.
"""

from typing import Any

from django.core.files.storage import default_storage
from django.shortcuts import get_object_or_404
from ninja import Query, Router, Status
from ninja.pagination import paginate
from pydantic import Field

from deployhub.api.auth import BadInput
from deployhub.api.fields import Name, RequiredName
from deployhub.api.protocol import reported_fingerprint
from deployhub.api.v1 import PIPELINES, Listed, Page, Schema, Strict, answers, file_answer
from deployhub.core.downloads import file_download
from deployhub.devices.access import get_device_for_user
from deployhub.devices.actions import revoke_device, set_draining
from deployhub.engines import signing
from deployhub.engines.access import engines_for_user, get_engine_for_user
from deployhub.engines.actions import (
    BuildRefused,
    compatibility,
    rebuild,
    request_compile,
    serving_refusal,
)
from deployhub.engines.gates import release_gates
from deployhub.engines.models import Engine
from deployhub.registry.access import get_version_for_user
from deployhub.teams.access import require_role
from deployhub.teams.models import Role
from workers.backends.known import DEFAULT_BACKEND

# Its django-ninja operations (api/openapi.py mounts it at /api/v1/).
router = Router(tags=["engines and devices"])


class VersionCompileIn(Strict):
    device_class: RequiredName = Field(description="The slug of one of the team's classes.")
    backend: Name = DEFAULT_BACKEND
    build_config: dict[str, Any] = Field(default_factory=dict)


class DrainIn(Strict):
    draining: bool = Field(True, description="true: no new jobs; false: take jobs again.")


class FingerprintIn(Strict):
    fingerprint: dict[str, Any] = Field(
        description="A device's fingerprint, as its worker reports it (docs/protocol.md)."
    )


class EngineFilter(Schema):
    model: int | None = Field(None, ge=1, description="Only the engines of this model (its id).")
    version: int | None = Field(None, ge=1, description="Only the engines of this version.")
    device_class: Name | None = Field(None, description="Only those built for this class.")
    backend: Name | None = Field(None, description="Only those of this backend.")


class EngineGateOut(Schema):
    gate: str
    status: str
    reason: str
    run: int | None


class StoredEngineOut(Schema):
    id: int
    model_version: int
    device_class: str
    backend: str
    build_config: dict[str, Any]
    compat_key: str
    compat_fields: dict[str, Any]
    sha256: str
    size: int
    signature: str
    signing_public_key: str
    status: str
    status_reason: str
    accuracy_flags: list[str]
    quantised_nothing: bool
    release_gates: list[EngineGateOut]
    tool_versions: dict[str, Any]
    build_seconds: float | None
    built_on: str | None
    created_at: str


class DeviceRuns(Schema):
    device: str
    runs: bool
    reason: str


class StoredEngineDetailOut(StoredEngineOut):
    devices: list[DeviceRuns]


class CompileJob(Schema):
    id: int
    state: str


class CompileOut(Schema):
    reused: bool
    engine: StoredEngineOut | None = None
    job: CompileJob | None = None


class CompatibilityOut(Schema):
    runs: bool
    reason: str
    differences: dict[str, Any]


class FingerprintChangeOut(Schema):
    at: str
    summary: list[str]


class DeviceRecordOut(Schema):
    id: int
    name: str
    device_class: str
    state: str
    draining: bool
    last_heartbeat_at: str | None
    fingerprint: dict[str, Any] | None
    revoked_at: str | None


class DeviceDetailOut(DeviceRecordOut):
    changes: list[FingerprintChangeOut]


# A compile's answer: 200 with the stored engine, or 202 with the job that builds it.
COMPILED = {**answers(CompileOut), 202: CompileOut}


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
        # The hub's Ed25519 signature of the sha256, and the key that checks it (GET
        # engines/<id>/file: what a person or a pipeline downloads can be verified).
        "signature": engine.signature,
        "signing_public_key": signing.public_key_hex(),
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


def _compiled(engine, job):
    """200 with the engine the store has, or 202 with the compile job queued for it."""
    if engine is not None:
        return Status(200, {"reused": True, "engine": engine_json(engine)})
    return Status(202, {"reused": False, "job": {"id": job.pk, "state": job.state}})


@router.get(
    "engines", response=answers(list[StoredEngineOut]), auth=PIPELINES, url_name="api_engines"
)
@paginate(Page)
def engines(request, filters: Query[EngineFilter]):
    """The engines of the caller's teams, newest first; ?model=, ?version= (ids),
    ?device_class= (a slug) and ?backend= keep the matching ones."""
    found = engines_for_user(request.user)
    if filters.model is not None:
        found = found.filter(model_version__model_id=filters.model)
    if filters.version is not None:
        found = found.filter(model_version_id=filters.version)
    if filters.device_class is not None:
        found = found.filter(device_class__slug=filters.device_class)
    if filters.backend is not None:
        found = found.filter(backend=filters.backend)
    return Listed(found, engine_json)


@router.get(
    "engines/{int:pk}",
    response=answers(StoredEngineDetailOut),
    auth=PIPELINES,
    url_name="api_engine",
)
def engine_detail(request, pk: int):
    """The engine: its build, compatibility key, sha256, status, flags and release gates,
    and whether each device of its class runs it."""
    engine = get_engine_for_user(request, pk)
    body = engine_json(engine)
    body["devices"] = [
        {"device": device.name, "runs": runs, "reason": reason}
        for device in engine.device_class.devices.all()
        for runs, reason, _ in [compatibility(engine, device.fingerprint)]
    ]
    return body


@router.get(
    "engines/{int:pk}/file",
    response=answers(None, also=(409,)),
    auth=PIPELINES,
    url_name="api_engine_file",
    openapi_extra=file_answer("application/octet-stream", "The engine file, as an attachment."),
)
def engine_file(request, pk: int):
    """The engine's file, for a person or a pipeline to deploy or inspect: check it against
    the engine's sha256 and signature (GET engines/<id>). A revoked or corrupt engine is
    refused (409), as it is to devices; devices fetch theirs with GET
    engines/<id>/download, which also checks their toolchain runs it."""
    engine = get_engine_for_user(request, pk)
    if refusal := serving_refusal(engine, person=request.user):
        return Status(409, {"error": refusal})
    return file_download(default_storage.open(engine.file.name, "rb"), f"engine-{engine.pk}")


@router.post(
    "engines/{int:pk}/compatibility",
    response=answers(CompatibilityOut),
    auth=PIPELINES,
    url_name="api_engine_compatibility",
)
def engine_compatibility(request, pk: int, payload: FingerprintIn):
    """Whether a machine with this fingerprint runs the engine: its compatibility key for the
    engine's backend and build config is the engine's. Else the reason and the fields that
    differ ({field: [the engine's, the fingerprint's]}). Stores nothing."""
    engine = get_engine_for_user(request, pk)
    fingerprint = reported_fingerprint({"fingerprint": payload.fingerprint})
    runs, reason, differences = compatibility(engine, fingerprint)
    return {"runs": runs, "reason": reason, "differences": differences}


@router.post(
    "engines/{int:pk}/rebuild", response=COMPILED, auth=PIPELINES, url_name="api_engine_rebuild"
)
def engine_rebuild(request, pk: int):
    """Ask for the same build again on the engine's class (an engineer): 200 with the engine
    the store has for the class's devices now, or 202 with the compile job."""
    engine = get_engine_for_user(request, pk)
    require_role(request.user, engine.team, Role.ENGINEER)
    try:
        return _compiled(*rebuild(engine, request.user))
    except BuildRefused as exc:
        raise BadInput(str(exc)) from exc


@router.get(
    "versions/{int:pk}/engines",
    response=answers(list[StoredEngineOut]),
    auth=PIPELINES,
    url_name="api_version_engines",
)
@paginate(Page)
def version_engines(request, pk: int):
    """The version's engines on every class, newest first."""
    version = get_version_for_user(request, pk)
    found = Engine.objects.for_version(version).with_gate_runs().order_by("-created_at", "-pk")
    return Listed(found, engine_json)


@router.post(
    "versions/{int:pk}/engines", response=COMPILED, auth=PIPELINES, url_name="api_version_engines"
)
def version_compile(request, pk: int, payload: VersionCompileIn):
    """Build the version for one of its team's classes (an engineer): 200 with the engine
    when the store has that build for the class's devices, else 202 with the compile job.
    An unknown class is 404; a backend or build config it cannot build is 400."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    device_class = get_object_or_404(version.team.device_classes, slug=payload.device_class)
    try:
        return _compiled(
            *request_compile(
                version, device_class, payload.backend, payload.build_config, request.user
            )
        )
    except BuildRefused as exc:
        raise BadInput(str(exc)) from exc


@router.get(
    "devices/{int:pk}", response=answers(DeviceDetailOut), auth=PIPELINES, url_name="api_device"
)
def device_detail(request, pk: int):
    """The device: its class, state, last heartbeat, fingerprint and its last 50 changes."""
    return device_json(get_device_for_user(request, pk), changes=True)


@router.post(
    "devices/{int:pk}/drain", response=answers(DeviceRecordOut), url_name="api_device_drain"
)
def device_drain(request, pk: int, payload: DrainIn):
    """Stop (draining: true, the default) or resume giving the device new jobs (an admin);
    the job it runs goes on."""
    device = get_device_for_user(request, pk)
    set_draining(device, payload.draining, request.user)
    return device_json(device)


@router.post(
    "devices/{int:pk}/revoke", response=answers(DeviceRecordOut), url_name="api_device_revoke"
)
def device_revoke(request, pk: int):
    """Revoke the device (an admin): its token stops working and its running job goes back
    on the queue."""
    device = get_device_for_user(request, pk)
    revoke_device(device, request.user)
    return device_json(device)
