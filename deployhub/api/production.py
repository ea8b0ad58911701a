"""API v1 for devices: the production engine of each model on the device's class.

A device follows production: it asks which engine to run and gets the production
release's build matched on its own compatibility key, or 409 saying what differs
and whether a rebuild is on its way (docs/protocol.md, "Devices follow production").
It is a device's call: its token is the device's own (DeviceToken), and its answer keeps
the shape workers of every protocol version read (not paged).
"""

from typing import Any

from django.http import JsonResponse
from ninja import Query, Router, Status
from ninja.security import HttpBearer

from deployhub.api import auth
from deployhub.api.auth import BIGINT
from deployhub.api.v1 import Schema, answers
from deployhub.engines.actions import compatibility, key_for
from deployhub.engines.models import Engine, EngineStatus
from deployhub.registry.models import Model
from deployhub.releases.evidence import queued_rebuild
from deployhub.releases.models import Release, ReleaseState
from deployhub.releases.queries import production_of

router = Router(tags=["releases"])


class DeviceToken(HttpBearer):
    """A device's own token (shown once when it was registered or enrolled)."""

    def __call__(self, request):
        device = auth.device_for(request)  # 401, 403, 426 or 429 otherwise
        auth.check_fields(request)
        return device

    def authenticate(self, request, token):  # pragma: no cover - __call__ reads the header
        raise NotImplementedError


class ProductionRelease(Schema):
    id: int
    engine_id: int
    promoted_at: str | None


class ProductionModel(Schema):
    id: int
    name: str


class ProductionVersion(Schema):
    id: int
    number: int


class ProductionEngineOut(Schema):
    id: int
    url: str
    sha256: str
    signature: str
    size: int
    backend: str
    build_config: dict[str, Any]
    compat_key: str


class ProductionOut(Schema):
    """The production release of one model and the build of its engine this device runs."""

    release: ProductionRelease
    model: ProductionModel
    version: ProductionVersion
    device_class: str
    engine: ProductionEngineOut


class ProductionEntryOut(Schema):
    """One model's entry: a ProductionOut (runnable) or a NotRunnableOut (not)."""

    runnable: bool
    release: ProductionRelease
    model: ProductionModel
    version: ProductionVersion
    device_class: str
    engine: ProductionEngineOut | None = None
    error: str | None = None
    differences: dict[str, list[Any]] | None = None
    rebuild_queued: bool | None = None
    rebuild_job: int | None = None


class EveryModelOut(Schema):
    device_class: str
    releases: list[ProductionEntryOut]


# The 409's body is the error body with the release's fields beside it (as an entry that is
# not runnable): answered as it is, not cut down to Error's fields.
NOT_RUNNABLE = {
    "responses": {
        409: {
            "description": "The device cannot run it: {error, release, model, version, "
            "device_class, differences, rebuild_queued, rebuild_job}"
        }
    }
}


def runnable_engine(release, fingerprint):
    """Return the build of the release's engine this fingerprint runs: its own or a rebuild."""
    engine = release.engine
    if compatibility(engine, fingerprint)[0]:
        return engine if engine.status not in EngineStatus.UNSERVED else None
    if not fingerprint:
        return None
    key, _ = key_for(engine.backend, engine.build_config, fingerprint)
    same_build = Engine.objects.runnable_by(release.device_class).filter(
        model_version=engine.model_version,
        backend=engine.backend,
        config_digest=engine.config_digest,
        compat_key=key,
    )
    return same_build.exclude(status__in=EngineStatus.UNSERVED).first()


def _engine_json(engine):
    return {
        "id": engine.pk,
        "url": f"/api/v1/engines/{engine.pk}/download",
        "sha256": engine.sha256,
        "signature": engine.signature,
        "size": engine.size,
        "backend": engine.backend,
        "build_config": engine.build_config,
        "compat_key": engine.compat_key,
    }


def _release_json(release):
    version = release.engine.model_version
    return {
        "release": {
            "id": release.pk,
            "engine_id": release.engine_id,
            "promoted_at": release.promoted_at.isoformat() if release.promoted_at else None,
        },
        "model": {"id": release.model_id, "name": release.model.name},
        "version": {"id": version.pk, "number": version.number},
        "device_class": release.device_class.slug,
    }


def _refusal(release, fingerprint):
    """Say why the device cannot run the release's engine, and whether a rebuild is queued."""
    runs, reason, diffs = compatibility(release.engine, fingerprint)
    if runs:  # the key matches: only a revocation or a corrupt file stops it
        reason = _unserved(release.engine)
    job = queued_rebuild(release.engine, release.device_class)
    queued = "A rebuild is queued." if job else "No rebuild is queued."
    reason = f"{reason.rstrip('.')}. {queued}"
    return {
        "error": reason,
        "differences": diffs,
        "rebuild_queued": job is not None,
        "rebuild_job": job.pk if job else None,
    }


def _unserved(engine):
    if engine.status == EngineStatus.CORRUPT:
        return f"The production engine #{engine.pk} is corrupt: {engine.status_reason}"
    return f"The production engine #{engine.pk} was revoked."


def production_entry(release, device):
    """Return (runs, body) of a production release for a device."""
    engine = runnable_engine(release, device.fingerprint)
    if engine is None:
        return False, {**_release_json(release), **_refusal(release, device.fingerprint)}
    return True, {**_release_json(release), "engine": _engine_json(engine)}


@router.get(
    "device-classes/{slug:slug}/production",
    response=answers(ProductionOut | EveryModelOut, also=(409, 426)),
    auth=DeviceToken(),
    url_name="api_device_class_production",
    exclude_unset=True,
    openapi_extra=NOT_RUNNABLE,
)
def device_class_production(request, slug: str, model: int | None = Query(None, ge=0, le=BIGINT)):
    """The production engine of each model (or of ?model=<id>) this device can run on its own
    class; 409 with what differs when it cannot run one. A device's call: its own token."""
    device = request.auth
    device_class = device.device_class
    if slug != device_class.slug:
        return Status(404, {"error": f"No device class {slug!r} for this device."})
    if model is None:
        return _every_model(device)
    chosen = Model.objects.filter(pk=model, team=device_class.team).first()
    release = production_of(chosen, device_class) if chosen else None
    if release is None:
        return Status(
            404, {"error": f"Model {model} has no production release on {device_class.slug}."}
        )
    runs, body = production_entry(release, device)
    return body if runs else JsonResponse(body, status=409)


def _every_model(device):
    releases = Release.objects.filter(
        device_class=device.device_class, state=ReleaseState.PRODUCTION
    ).select_related("engine__model_version", "model", "device_class")
    if not releases:
        return Status(
            404, {"error": f"No model has a production release on {device.device_class.slug}."}
        )
    entries = []
    for release in releases:
        runs, body = production_entry(release, device)
        entries.append({"runnable": runs, **body})
    return {"device_class": device.device_class.slug, "releases": entries}
