"""API v1 for devices: the production engine of each model on the device's class.

A device follows production: it asks which engine to run and gets the production
release's build matched on its own compatibility key, or 409 saying what differs
and whether a rebuild is on its way (docs/protocol.md, "Devices follow production").
"""

from django.http import JsonResponse
from django.views.decorators.http import require_GET
from ninja import Router

from deployhub.api.auth import BadInput, device_required, error
from deployhub.engines.actions import compatibility, key_for
from deployhub.engines.models import Engine, EngineStatus
from deployhub.registry.models import Model
from deployhub.releases.actions import production_of
from deployhub.releases.evidence import queued_rebuild
from deployhub.releases.models import Release, ReleaseState

# Its django-ninja operations (api/openapi.py mounts it at /api/v1/).
router = Router(tags=["releases"])


def _model_id(request):
    value = request.GET.get("model")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise BadInput("model must be a model id (an integer).") from exc


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


@require_GET
@device_required
def device_class_production(request, device, slug):
    """Answer the production engine(s) this device can run on its own class."""
    device_class = device.device_class
    if slug != device_class.slug:
        return error(404, f"No device class {slug!r} for this device.")
    model_id = _model_id(request)
    if model_id is None:
        return _every_model(device)
    model = Model.objects.filter(pk=model_id, team=device_class.team).first()
    release = production_of(model, device_class) if model else None
    if release is None:
        return error(404, f"Model {model_id} has no production release on {device_class.slug}.")
    runs, body = production_entry(release, device)
    return JsonResponse(body, status=200 if runs else 409)


def _every_model(device):
    releases = Release.objects.filter(
        device_class=device.device_class, state=ReleaseState.PRODUCTION
    ).select_related("engine__model_version", "model", "device_class")
    if not releases:
        return error(404, f"No model has a production release on {device.device_class.slug}.")
    entries = []
    for release in releases:
        runs, body = production_entry(release, device)
        entries.append({"runnable": runs, **body})
    return JsonResponse({"device_class": device.device_class.slug, "releases": entries})
