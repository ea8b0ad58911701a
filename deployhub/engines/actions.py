"""The engine store: build once per toolchain, serve only where it runs, mark what went stale.

Compatibility is decided by the same pure functions the workers use
(workers/backends): a device may run an engine only when its compatibility
key for the engine's backend and build config equals the engine's key.
"""

import hashlib

from django.conf import settings
from django.core.cache import cache
from django.core.files.storage import default_storage
from django.db import transaction

from deployhub.core.json_input import tail
from deployhub.engines.inspection import artifact_problem
from deployhub.engines.models import CalibrationCache, Engine, EngineStatus, TimingCache
from deployhub.engines.preflight import quantised_source
from deployhub.engines.signing import sign
from deployhub.jobs.actions import submit_job
from deployhub.jobs.errors import ResultRejected
from deployhub.jobs.kinds import EngineInput, FileInput
from deployhub.jobs.models import JobKind
from deployhub.registry.models import Dataset
from deployhub.teams.models import Event
from workers.backends.base import compat_key, describe_differences, differences, digest
from workers.backends.known import BACKENDS
from workers.errors import JobError
from workers.kinds import (
    CALIBRATION_CACHE_ARTIFACT,
    CALIBRATION_CACHE_INPUT,
    CALIBRATION_INPUT,
    ENGINE_ARTIFACT,
    TIMING_CACHE_ARTIFACT,
    TIMING_CACHE_INPUT,
    compared_engine_input,
)


class BuildRefused(ValueError):
    """The build cannot be asked for as it stands; the message says why and what to do."""


def backend_class(name):
    """Return the backend class of that name; raise BuildRefused for anything else."""
    if not isinstance(name, str) or name not in BACKENDS:
        raise BuildRefused(f"There is no backend named {name!r}; known: {', '.join(BACKENDS)}.")
    return BACKENDS[name]


def key_for(backend, build_config, fingerprint):
    """Return (compat_key, compat_fields) of a backend build on a device with this fingerprint."""
    fields = backend_class(backend).compat_fields(fingerprint, build_config)
    return compat_key(backend, fields), fields


def canonical_config(backend, build_config):
    """Return the build config as the backend builds it: every default filled, aliases resolved.

    Its digest keys the engine store, so the compile form, the API and auto mode
    asking for one build in different words get one engine.
    """
    backend = backend_class(backend)
    if not isinstance(build_config, dict):
        raise BuildRefused("The build config must be a JSON object.")
    return backend.canonical_config(build_config)


def config_digest(backend, build_config):
    """Return the digest the store keys a build on: the sha256 of its canonical config."""
    return digest(canonical_config(backend, build_config))


def compatibility(engine, fingerprint):
    """Return (runs, reason, differences) of an engine on a device with this fingerprint."""
    if not fingerprint:
        return False, "The device has not reported a fingerprint yet.", {}
    key, fields = key_for(engine.backend, engine.build_config, fingerprint)
    if key == engine.compat_key:
        return True, "", {}
    diffs = differences(engine.compat_fields, fields)
    reason = "This engine was built for another toolchain: " + describe_differences(diffs)
    return False, reason, diffs


def reference_device(device_class):
    """Return the online device of the class that heartbeated last, with a fingerprint."""
    online = device_class.devices.online().exclude(fingerprint={}).exclude(draining=True)
    return online.order_by("-last_heartbeat_at").first()


def existing_engine(version, device_class, backend, build_config):
    """Return the valid engine a build on the class's reference device would produce, if stored."""
    device = reference_device(device_class)
    if device is None:
        return None
    key, _ = key_for(backend, build_config, device.fingerprint)
    return (
        Engine.objects.runnable_by(device_class)
        .filter(
            model_version=version,
            backend=backend,
            config_digest=config_digest(backend, build_config),
            compat_key=key,
            status=EngineStatus.VALID,
        )
        .first()
    )


def calibration_for(version, build_config):
    """Return the calibration dataset an INT8 build uses: the model's newest, if any."""
    if build_config.get("precision") != "int8":
        return None
    return version.model.datasets.filter(kind="calibration").order_by("-created_at").first()


def builds_from(version, backend):
    """Return True when the backend builds from this version's format (ONNX, or a .pt2)."""
    wanted = BACKENDS[backend].source_format
    return version.format == wanted or (wanted == "onnx" and version.is_onnx)


def check_source(version, backend):
    """Refuse a build from a version in another format than the backend builds from."""
    if builds_from(version, backend):
        return
    if version.format == "pt2":
        raise BuildRefused(
            f"{backend} builds from ONNX: compile the ONNX version exported from this .pt2."
        )
    raise BuildRefused(
        f"{backend} builds from {BACKENDS[backend].source_label}: compile the version "
        "this one was exported from."
    )


def with_contract(version, backend, build_config):
    """A backend that specialises builds to the contract gets it in the build config."""
    if BACKENDS[backend].builds_from_contract and "contract" not in build_config:
        return {**build_config, "contract": version.contract} if version.contract else build_config
    return build_config


def request_compile(version, device_class, backend, build_config, user):
    """Return (engine, None) when the store has it already, else (None, the queued compile job)."""
    backend_class(backend)
    check_source(version, backend)
    if not isinstance(build_config, dict):
        raise BuildRefused("The build config must be a JSON object.")
    build_config = with_contract(version, backend, build_config)
    try:
        backend_class(backend).check_config(build_config)
    except JobError as exc:
        raise BuildRefused(str(exc)) from exc
    build_config = canonical_config(backend, build_config)
    calibrates = BACKENDS[backend].needs_calibration(build_config)
    if calibrates and (why := quantised_source(version)):
        raise BuildRefused(f"{version} is {why}.")
    if calibrates and not calibration_for(version, build_config):
        raise BuildRefused(
            f"An INT8 {backend} build calibrates on data: attach a calibration dataset to "
            f"{version.model} first (version page, Datasets)."
        )
    if engine := existing_engine(version, device_class, backend, build_config):
        Event.record(version.team, user, "engine.reused", engine)
        return engine, None
    params = {"backend": backend, "build_config": build_config}
    if calibration := calibration_for(version, build_config):
        params["calibration_dataset"] = calibration.pk
    job = submit_job(
        team=version.team,
        kind=JobKind.COMPILE,
        device_class=device_class,
        user=user,
        model_version=version,
        params=params,
    )
    return None, job


def calibration_of(job):
    """Return the calibration dataset a compile job was given, if any."""
    dataset_id = job.params.get("calibration_dataset") if job.kind == JobKind.COMPILE else None
    return (
        Dataset.objects.filter(pk=dataset_id, model=job.model_version.model).first()
        if (dataset_id)
        else None
    )


def compared_engines(job):
    """Return the engines a compare job times side by side, in the order it lists them.

    Only engines of the job's version that its device class runs (built there, or on a
    class it trusts) count, so a job cannot name another team's or class's engine.
    """
    if job.kind != JobKind.COMPARE:
        return []
    ids = [pk for pk in job.params.get("engines") or () if isinstance(pk, int)]
    engines = (
        Engine.objects.runnable_by(job.device_class)
        .filter(pk__in=ids, model_version=job.model_version)
        .in_bulk()
    )
    return [engines[pk] for pk in ids if pk in engines]


def timing_cache_for(job, device):
    """Return the timing cache a compile job should start from on this device, if any."""
    if job.kind != JobKind.COMPILE or not device.fingerprint:
        return None
    params = job.params
    key, _ = key_for(params["backend"], params.get("build_config") or {}, device.fingerprint)
    return TimingCache.objects.filter(device_class=job.device_class, compat_key=key).first()


def calibration_cache_key(job, fingerprint):
    """Return (key, toolchain version) of the calibration cache a compile job on a device with
    this fingerprint uses, or None when its backend keeps none (backend.calibration_cache)."""
    backend = BACKENDS.get(job.params.get("backend"))
    dataset = calibration_of(job)
    if backend is None or dataset is None:
        return None
    return backend.calibration_cache(
        job.params.get("build_config") or {},
        fingerprint,
        job.model_version.sha256,
        dataset.sha256,
    )


def calibration_cache_for(job, device):
    """Return the calibration cache an INT8 build on this device can start from, if any."""
    found = calibration_cache_key(job, device.fingerprint)
    if not found:
        return None
    classes = job.device_class.builder_classes()
    return CalibrationCache.objects.filter(key=found[0], device_class__in=classes).first()


def calibration_input(job, device=None):
    """A compile job's calibration dataset, when its build calibrates."""
    dataset = calibration_of(job)
    return {CALIBRATION_INPUT: FileInput.of(dataset, "calibration.npz")} if dataset else {}


def compared_engine_inputs(job, device=None):
    """The engines a compare job times side by side, each as engine-<id>."""
    return {
        compared_engine_input(engine.pk): EngineInput(engine) for engine in compared_engines(job)
    }


def timing_cache_input(job, device=None):
    """The timing cache the device that claimed a compile job starts from, if any."""
    cache = timing_cache_for(job, device) if device is not None else None
    return {TIMING_CACHE_INPUT: FileInput.of(cache, "timing.cache")} if cache else {}


def calibration_cache_input(job, device=None):
    """The calibration cache the device that claimed a compile job starts from, if any."""
    cache = calibration_cache_for(job, device) if device is not None else None
    return {CALIBRATION_CACHE_INPUT: FileInput.of(cache, "calibration.cache")} if cache else {}


def _store_calibration_cache(job, fingerprint, result):
    if not result.get("calibration_cache_sha256"):
        return
    found = calibration_cache_key(job, fingerprint)
    if found is None:
        raise ResultRejected("A calibration cache came back from a build that calibrates nothing.")
    key, version = found
    artifact = _artifact(job, CALIBRATION_CACHE_ARTIFACT, result["calibration_cache_sha256"])
    CalibrationCache.objects.update_or_create(
        key=key,
        device_class=job.device_class,
        defaults={
            "model_version": job.model_version,
            "dataset": calibration_of(job),
            "tensorrt_version": version,
            "file": artifact.file.name,
            "sha256": artifact.sha256,
            "size": artifact.size,
        },
    )


def _artifact(job, name, sha256):
    artifact = job.artifacts.filter(attempt=job.attempt, name=name).last()
    if artifact is None:
        raise ResultRejected(f"The compile finished without uploading its {name} file.")
    if sha256 not in (None, artifact.sha256):
        raise ResultRejected(f"The uploaded {name} does not match the sha256 the worker reported.")
    return artifact


def _store_timing_cache(job, key, result):
    if not result.get("timing_cache_sha256"):
        return
    artifact = _artifact(job, TIMING_CACHE_ARTIFACT, result["timing_cache_sha256"])
    TimingCache.objects.update_or_create(
        device_class=job.device_class,
        compat_key=key,
        defaults={"file": artifact.file.name, "sha256": artifact.sha256, "size": artifact.size},
    )


def record_engine(job, result):
    """Store the engine a compile job built, and name it on the job: the job page draws the
    engine's flags from there, and an auto run takes its build from its compile job."""
    job.engine = _stored_engine(job, result)
    return job.engine


def _stored_engine(job, result):
    """The engine a compile built, stored now; an identical engine already stored is kept."""
    params = job.params
    backend = params["backend"]
    build_config = canonical_config(backend, params.get("build_config") or {})
    fingerprint = builder_fingerprint(job, backend, build_config, result.get("fingerprint"))
    key, fields = key_for(backend, build_config, fingerprint)
    # the bytes check_engine read
    artifact = _artifact(job, ENGINE_ARTIFACT, result.get("artifact_sha256"))
    _store_timing_cache(job, key, result)
    _store_calibration_cache(job, fingerprint, result)
    lookup = {
        "model_version": job.model_version,
        "backend": backend,
        "config_digest": digest(build_config),
        "compat_key": key,
        "device_class": job.device_class,
    }
    if engine := Engine.objects.filter(**lookup).exclude(status=EngineStatus.CORRUPT).first():
        return engine
    engine = Engine.objects.create(
        **lookup,
        build_config=build_config,
        compat_fields=fields,
        file=artifact.file.name,
        sha256=artifact.sha256,
        size=artifact.size,
        signature=sign(artifact.sha256),
        fingerprint=fingerprint,
        tool_versions=result.get("tool_versions") or {},
        build_seconds=result.get("build_seconds"),
        build_log=tail(str(result.get("build_log") or ""), settings.DEPLOYHUB_MAX_LOG_CHARS),
        graph_report=_graph_report(result),
        built_on=job.device,
        job=job,
    )
    Event.record(
        job.team,
        f"device:{job.device}",
        "engine.built",
        engine,
        compat_key=key,
        before=None,
        after=engine.status,
    )
    return engine


def check_engine(job, result):
    """Refuse a compile's engine that is not what its backend builds (before the job is locked).

    The hub signs what a device uploads; this format check (Backend.artifact_problem, in a
    capped child) keeps files that are no engine at all out of the store. The artifact is
    named by its sha256, so record_engine stores the very bytes checked here.
    """
    if not result.get("artifact_sha256"):
        raise ResultRejected("artifact_sha256 is required: the sha256 of the uploaded engine.")
    backend = job.params["backend"]
    artifact = _artifact(job, ENGINE_ARTIFACT, result["artifact_sha256"])
    if problem := artifact_problem(backend, artifact.file.name):
        raise ResultRejected(f"The uploaded engine is not a {backend} engine: {problem}.")


def builder_fingerprint(job, backend, build_config, reported):
    """Return the fingerprint an engine is keyed on: the hub's record of the device that
    claimed the job (its last heartbeat), never what the completion reports.

    A report whose toolchain differs from the record is refused, not believed: a device
    must not plant an engine under another machine's compatibility key.
    """
    recorded = job.device.fingerprint if job.device else None
    if not recorded:
        raise ResultRejected(
            f"{job.device} has not reported a fingerprint: its worker heartbeats one at start."
        )
    if reported is None:
        return recorded
    if not isinstance(reported, dict):
        raise ResultRejected("fingerprint must be an object (docs/protocol.md).")
    (ours, our_fields), (theirs, their_fields) = (
        key_for(backend, build_config, recorded),
        key_for(backend, build_config, reported),
    )
    if theirs != ours:
        diffs = describe_differences(differences(our_fields, their_fields))
        raise ResultRejected(
            f"The build reports a toolchain other than {job.device}'s last heartbeat ({diffs}): "
            "the engine is keyed on what the hub knows of the device; let the worker "
            "heartbeat, then build again."
        )
    return recorded


def _graph_report(result):
    report = result.get("graph_report") or {}
    if not isinstance(report, dict):
        raise ResultRejected("graph_report must be an object (docs/protocol.md).")
    return report


def stored_file_intact(engine):
    """Return True when the stored engine's bytes still hash to its sha256."""
    return not stored_file_problem(engine)


# How long an engine file found intact is trusted without reading it again (same
# modification time and size); a change of either is noticed at once.
INTACT_FOR = 3600


def stored_file_problem(engine):
    """Say what is wrong with the engine's stored file ("" when it hashes to its sha256).

    A file found intact is not read again while its modification time and size stay
    the same (kept in the process's cache for INTACT_FOR seconds: a multi-GB engine that
    every device of a fleet fetches is hashed once an hour per process, not every five
    minutes), so serving an engine usually costs a stat, not a read.
    """
    name = engine.file.name
    if not default_storage.exists(name):
        return "its stored file is missing"
    stamp = (default_storage.get_modified_time(name).timestamp(), default_storage.size(name))
    key = f"engine-intact:{engine.pk}:{engine.sha256}:{digest([name, *stamp])}"
    if cache.get(key):
        return ""
    found = _sha256_of(name)
    if found != engine.sha256:
        return f"its stored file hashes to {found[:16]}…, not its sha256 {engine.sha256[:16]}…"
    cache.set(key, True, timeout=INTACT_FOR)
    return ""


def _sha256_of(name):
    hashed = hashlib.sha256()
    with default_storage.open(name, "rb") as handle:
        for chunk in iter(lambda: handle.read(1024 * 1024), b""):
            hashed.update(chunk)
    return hashed.hexdigest()


def serving_refusal(engine, device=None, person=None):
    """Say why the hub will not hand the engine's file to a device, or to a person who asks
    for it through the API ("" when it will).

    A revoked or corrupt engine is refused. The stored file is checked against the
    engine's sha256 first: bytes changed in the store mark the engine corrupt (an
    event), so no one is handed a file a device would refuse, and pages show it.
    """
    if engine.status not in EngineStatus.UNSERVED and (problem := stored_file_problem(engine)):
        engine = mark_corrupt(engine, problem, device, person)
    if engine.status == EngineStatus.CORRUPT:
        return f"Engine #{engine.pk} is corrupt: {engine.status_reason}"
    if engine.status == EngineStatus.REVOKED:
        return "This engine was revoked."
    return ""


def mark_corrupt(engine, problem, device=None, person=None):
    """Mark the engine corrupt, saying what its file showed when served to the device (or
    the person); an event."""
    served_to = device or person
    with transaction.atomic():
        engine = Engine.objects.select_for_update().get(pk=engine.pk)
        if engine.status == EngineStatus.CORRUPT:
            return engine
        before, engine.status = engine.status, EngineStatus.CORRUPT
        engine.status_reason = (
            f"{problem[0].upper()}{problem[1:]} (found when it was served to {served_to}): "
            "the hub does not serve it. Rebuild it."
        )
        engine.save(update_fields=["status", "status_reason"])
        Event.record(
            engine.team,
            f"device:{device}" if device else person,
            "engine.corrupt",
            engine,
            reason=problem,
            device=device.pk if device else None,
            before=before,
            after=EngineStatus.CORRUPT,
        )
    return engine


def mark_stale(device, before, after):
    """Mark stale the class's engines the device could run before the change and cannot now."""
    stale = []
    engines = Engine.objects.filter(device_class=device.device_class, status=EngineStatus.VALID)
    for engine in engines:
        ran_before = compatibility(engine, before)[0]
        runs_now, reason, _ = compatibility(engine, after)
        if ran_before and not runs_now:
            engine.status = EngineStatus.STALE
            engine.status_reason = f"{device} changed. {reason}"
            engine.save(update_fields=["status", "status_reason"])
            Event.record(
                engine.team,
                f"device:{device}",
                "engine.stale",
                engine,
                reason=reason,
                device=device.pk,
                before=EngineStatus.VALID,
                after=EngineStatus.STALE,
            )
            stale.append(engine)
    if stale and device.device_class.auto_rebuild:
        for engine in stale:
            _auto_rebuild(engine)
    return stale


def _auto_rebuild(engine):
    try:
        rebuild(engine, None)
    except BuildRefused as exc:
        Event.record(engine.team, None, "engine.rebuild_refused", engine, reason=str(exc))


def rebuild(engine, user):
    """Ask for the same build again on the engine's class: (engine, None) or (None, job)."""
    return request_compile(
        engine.model_version, engine.device_class, engine.backend, engine.build_config, user
    )


def compatibility_matrix(version, device_class, engines=None):
    """Return rows of (engine, [(device, runs, reason)]) for the class's devices: the version's
    engines on the class, or the ones given (a page that loaded them already)."""
    devices = list(device_class.devices.all())
    if engines is None:
        engines = Engine.objects.for_version(version).filter(device_class=device_class)
    return [
        (engine, [(device, *compatibility(engine, device.fingerprint)[:2]) for device in devices])
        for engine in engines
    ]


# A change's summary, in its history and the team's audit trail: the first lines, each cut.
SUMMARY_LINES, SUMMARY_LINE_CHARS = 50, 300


def _brief(lines):
    """Return a change's first SUMMARY_LINES lines, each cut, and how many more there were."""
    kept = [line[:SUMMARY_LINE_CHARS] + "…" * (len(line) > SUMMARY_LINE_CHARS) for line in lines]
    if len(kept) > SUMMARY_LINES:
        return kept[:SUMMARY_LINES] + [f"… and {len(kept) - SUMMARY_LINES} more changes"]
    return kept


def record_fingerprint(device, fingerprint):
    """Store a reported fingerprint; a change goes to history and marks engines stale."""
    from workers.fingerprint import diff

    before = device.fingerprint
    if fingerprint == before:
        return None
    with transaction.atomic():
        device.fingerprint = fingerprint
        device.save(update_fields=["fingerprint"])
        if not before:
            return None
        change = device.fingerprint_changes.create(
            before=before, after=fingerprint, summary=_brief(diff(before, fingerprint))
        )
        Event.record(
            device.team,
            f"device:{device}",
            "device.fingerprint_changed",
            device,
            summary=change.summary,
        )
        mark_stale(device, before, fingerprint)
    return change
