"""A release's evidence pack: what its stored runs say, item by item, each linked to its run.

collect(release) reads the engine's gates, its compatibility with the class's
online devices, memory, stability, the comparison with the current production
release and the deployment checklist into one JSON-able dict; the release keeps
it (Release.evidence) from when it enters review, refreshed on demand.
Every status is a GateStatus value; a link is a URL path to the run behind it.
"""

from django.urls import reverse
from django.utils import timezone

from deployhub.core import accuracy
from deployhub.core.gates import GateStatus
from deployhub.engines.actions import compatibility, key_for
from deployhub.engines.gates import accuracy_gate, performance_gate, release_gates
from deployhub.engines.models import Engine, EngineStatus
from deployhub.engines.preflight import preflight
from deployhub.jobs.models import Job, JobKind, JobState
from deployhub.parity.gates import parity_gate
from deployhub.releases.queries import approvals, production_of
from workers.backends.base import describe_differences, differences
from workers.backends.known import BACKENDS

PASSED, FAILED = GateStatus.PASSED, GateStatus.FAILED
MISSING, NOT_REQUIRED = GateStatus.MISSING, GateStatus.NOT_REQUIRED


def item(key, title, status, sentence, link, **details):
    """One line of evidence: what, its status, a sentence and the URL path of the run behind it."""
    return {"key": key, "title": title, "status": status, "sentence": sentence, "link": link} | (
        {"details": details} if details else {}
    )


def collect(release):
    """Return the release's evidence pack, computed from the stored runs."""
    engine = release.engine
    gates = [_gate_item(gate, engine) for gate in release_gates(engine)]
    devices = [_device_item(engine, device) for device in release.device_class.online_devices()]
    memory, stability = memory_item(engine), stability_item(engine)
    return {
        "computed_at": timezone.now().isoformat(),
        "checklist": checklist(release, memory),
        "gates": gates,
        "compatibility": _compatibility_item(release, devices),
        "devices": devices,
        "memory": memory,
        "stability": stability,
        "production": comparison_item(release),
    }


def store(release):
    """Recompute the release's evidence and keep it on the release; return the release."""
    release.evidence = collect(release)
    release.evidence_at = timezone.now()
    release.save(update_fields=["evidence", "evidence_at"])
    return release


def latest_benchmark(engine):
    """Return the engine's latest benchmark on its own class, or None."""
    runs = engine.benchmarks.filter(device_class=engine.device_class)
    return runs.select_related("job", "device_class").order_by("-created_at", "-pk").first()


def latest_accuracy(engine):
    """Return the engine's latest evaluation, or None."""
    return engine.accuracy.select_related("job").order_by("-created_at", "-pk").first()


def rebuild_for(engine, fingerprint):
    """Return a valid build of the engine's version, backend and config for this fingerprint."""
    key, _ = key_for(engine.backend, engine.build_config, fingerprint)
    return (
        Engine.objects.runnable_by(engine.device_class)
        .filter(
            model_version=engine.model_version,
            backend=engine.backend,
            config_digest=engine.config_digest,
            compat_key=key,
            status=EngineStatus.VALID,
        )
        .first()
    )


def queued_rebuild(engine, device_class):
    """Return the queued or running compile job of the engine's build on the class, if any."""
    return Job.objects.filter(
        kind=JobKind.COMPILE,
        state__in=(JobState.QUEUED, JobState.RUNNING),
        device_class=device_class,
        model_version=engine.model_version,
        params__backend=engine.backend,
        params__build_config=engine.build_config,
    ).first()


def _run_link(run):
    return run.job.get_absolute_url() if run is not None and run.job_id else None


def _gate_item(gate, engine):
    link = _run_link(gate.run)
    if link is None:
        on_version = gate.name == "parity"
        link = (engine.model_version if on_version else engine).get_absolute_url()
    return item(
        f"gate:{gate.name}", f"{gate.name.capitalize()} gate", gate.status, gate.reason, link
    )


def _device_item(engine, device):
    link = reverse("device_detail", args=[device.pk])
    runs, reason, diffs = compatibility(engine, device.fingerprint)
    if runs:
        return item(f"device:{device.pk}", device.name, PASSED, "Runs this engine.", link)
    if not device.fingerprint:
        return item(f"device:{device.pk}", device.name, MISSING, reason, link)
    rebuild = rebuild_for(engine, device.fingerprint)
    queued = None if rebuild else queued_rebuild(engine, device.device_class)
    if rebuild:
        reason += f" A compatible rebuild exists: engine #{rebuild.pk}."
    else:
        reason += (
            " A rebuild is queued." if queued else " No compatible rebuild exists or is queued."
        )
    return item(
        f"device:{device.pk}",
        device.name,
        FAILED,
        reason,
        link,
        differences=diffs,
        rebuild=rebuild.pk if rebuild else None,
        rebuild_link=rebuild.get_absolute_url() if rebuild else None,
        queued_job=queued.pk if queued else None,
        queued_link=queued.get_absolute_url() if queued else None,
    )


def _compatibility_item(release, devices):
    link = release.device_class.get_absolute_url()
    title = "Online devices of the class"
    if not devices:
        return item("compatibility", title, MISSING, "No device of the class is online.", link)
    failing = [device["title"] for device in devices if device["status"] != PASSED]
    if failing:
        sentence = f"{len(failing)} of {len(devices)} online device(s) cannot run it yet: "
        return item("compatibility", title, FAILED, sentence + ", ".join(failing) + ".", link)
    return item(
        "compatibility", title, PASSED, f"All {len(devices)} online device(s) run it.", link
    )


def memory_item(engine):
    """Return the engine's peak memory, from its latest benchmark, against the class's limit."""
    limit, run = engine.device_class.memory_limit_mb, latest_benchmark(engine)
    title = "Peak memory"
    if run is None or run.peak_memory_mb is None:
        sentence = "No benchmark has measured its peak memory yet."
        return item("memory", title, MISSING, sentence, _run_link(run) or engine.get_absolute_url())
    peak, link = run.peak_memory_mb, _run_link(run)
    if not limit:
        sentence = f"Peak {peak:g} MB; the class sets no memory limit."
        return item("memory", title, NOT_REQUIRED, sentence, link, peak_mb=peak, limit_mb=None)
    status = PASSED if peak <= limit else FAILED
    word = "within" if status == PASSED else "over"
    sentence = f"Peak {peak:g} MB is {word} the class's limit of {limit} MB (benchmark #{run.pk})."
    return item("memory", title, status, sentence, link, peak_mb=peak, limit_mb=limit)


def stability_item(engine):
    """Return whether the engine's latest benchmark on its class was stable."""
    run, title = latest_benchmark(engine), "Stable benchmark"
    if run is None:
        return item("stability", title, MISSING, "No benchmark yet.", engine.get_absolute_url())
    if run.stable is None:
        sentence = f"Benchmark #{run.pk} did not check its stability: measure again."
        return item("stability", title, MISSING, sentence, _run_link(run))
    if run.stable:
        sentence = f"Benchmark #{run.pk} was stable."
        return item("stability", title, PASSED, sentence, _run_link(run))
    reasons = "; ".join((run.stability or {}).get("reasons") or []) or "unstable"
    sentence = f"Benchmark #{run.pk} was unstable ({reasons}): measure again."
    return item("stability", title, FAILED, sentence, _run_link(run))


def production_to_compare(release):
    """Return the production release the candidate is compared with (the one it replaced when it
    is production itself), or None."""
    current = production_of(release.model, release.device_class)
    return release.replaced if current is not None and current.pk == release.pk else current


def comparison_item(release):
    """Return the candidate against the production release: deltas and toolchain differences.

    Its status says whether the comparison is complete (passed) or lacks a run
    (missing); the gates judge the candidate, this item only compares.
    """
    title = "Against production"
    current = production_to_compare(release)
    if current is None:
        sentence = "No production release of the model on the class: nothing to compare with."
        return item("production", title, NOT_REQUIRED, sentence, None)
    candidate, production = release.engine, current.engine
    deltas = {
        **_benchmark_deltas(latest_benchmark(candidate), latest_benchmark(production)),
        "accuracy": _accuracy_delta(latest_accuracy(candidate), latest_accuracy(production)),
    }
    toolchain = differences(production.tool_versions, candidate.tool_versions)
    fingerprint = differences(production.compat_fields, candidate.compat_fields)
    status = MISSING if any(value is None for value in deltas.values()) else PASSED
    sentence = _comparison_sentence(current, deltas, toolchain, fingerprint)
    return item(
        "production",
        title,
        status,
        sentence,
        current.get_absolute_url(),
        release=current.pk,
        engine=production.pk,
        deltas=deltas,
        toolchain=toolchain,
        fingerprint=fingerprint,
    )


def _delta(candidate, production):
    if candidate is None or production is None:
        return None
    return {"candidate": candidate, "production": production, "delta": candidate - production}


def _benchmark_deltas(candidate, production):
    both = candidate is not None and production is not None
    return {
        name: _delta(getattr(candidate, field), getattr(production, field)) if both else None
        for name, field in (
            ("p99_ms", "gate_p99_ms"),
            ("throughput_ips", "gate_throughput_ips"),
            ("peak_memory_mb", "peak_memory_mb"),
        )
    }


def _accuracy_delta(candidate, production):
    """The task's labelled headline (points) when both runs have labels, else its agreement.

    The delta names its figure ("mAP@0.5:0.95", "detection F1 vs FP32"): metric is its key.
    """
    if candidate is None or production is None:
        return None
    labelled = candidate.labelled and production.labelled
    if labelled:
        metric, name = candidate.metric, candidate.headline
        values = candidate.engine_value, production.engine_value
    else:
        metric = candidate.agreement_metric or "top1_agreement"
        name = accuracy.headline_name(candidate.task, labelled=False)
        values = candidate.agreement_value, production.agreement_value
    if None in values:
        return None
    points = _delta(values[0] * 100, values[1] * 100)
    return {"metric": metric, "name": name, **points}


def _comparison_sentence(current, deltas, toolchain, fingerprint):
    parts = []
    for name, unit, label in (
        ("p99_ms", "ms", "p99"),
        ("throughput_ips", "images/s", "throughput"),
        ("peak_memory_mb", "MB", "peak memory"),
    ):
        delta = deltas[name]
        parts.append(f"{label} {delta['delta']:+.2f} {unit}" if delta else f"{label} unmeasured")
    if change := deltas["accuracy"]:
        parts.append(f"{change['name']} {change['delta']:+.2f} points")
    else:
        parts.append("accuracy unevaluated")
    changed = describe_differences({**toolchain, **fingerprint}) or "the same toolchain"
    return f"Against production release #{current.pk}: {', '.join(parts)}; {changed}."


def checklist(release, memory):
    """Return the deployment procedure in order, each step ticked from its evidence."""
    engine = release.engine
    return [
        _budget_step(release.device_class),
        _preflight_step(engine, release.device_class),
        {**_gate_item(parity_gate(engine.model_version), engine), "key": "step:parity"},
        _build_step(engine),
        _on_target_step(engine, memory),
        _reviews_step(release),
    ]


def _budget_step(device_class):
    title, link = "Serving pattern and budget", device_class.get_absolute_url()
    if device_class.is_batch and not device_class.throughput_target_ips:
        sentence = "Batch class without a throughput target: set one on the class."
        return item("step:budget", title, FAILED, sentence, link)
    if not device_class.is_batch and not device_class.frame_budget_ms:
        sentence = "Real-time class without a frame budget: set one on the class."
        return item("step:budget", title, FAILED, sentence, link)
    return item("step:budget", title, PASSED, device_class.gate_rule, link)


def _preflight_step(engine, device_class):
    title, link = "Preflight on the target toolchain", engine.model_version.get_absolute_url()
    if engine.backend not in BACKENDS:
        sentence = f"No preflight knows the {engine.backend} backend."
        return item("step:preflight", title, MISSING, sentence, link)
    if not device_class.devices.exclude(fingerprint={}).exists():
        sentence = "No device of the class has reported its toolchain yet."
        return item("step:preflight", title, MISSING, sentence, link)
    precision = engine.build_config.get("precision") or "fp32"
    [verdict] = preflight(engine.model_version, device_class, [engine.backend], precision)
    if verdict.fails:
        sentence = f"{engine.backend} {precision} fails: {'; '.join(verdict.fails)}."
        return item("step:preflight", title, FAILED, sentence, link)
    slow = f" (slow: {'; '.join(verdict.slow)})" if verdict.slow else ""
    sentence = f"{engine.backend} {precision} builds on the class's toolchain{slow}."
    return item("step:preflight", title, PASSED, sentence, link)


def _build_step(engine):
    title, link = "Optimised build", engine.get_absolute_url()
    if engine.status != EngineStatus.VALID:
        sentence = (
            f"Engine #{engine.pk} is {engine.status}: {engine.status_reason or 'rebuild it'}."
        )
        return item("step:build", title, FAILED, sentence, link)
    return item("step:build", title, PASSED, f"Engine #{engine.pk} is built and valid.", link)


def _on_target_step(engine, memory):
    title = "Accuracy, latency and memory on the target"
    parts = [accuracy_gate(engine), performance_gate(engine)]
    statuses = [gate.status for gate in parts] + [memory["status"]]
    status = FAILED if FAILED in statuses else MISSING if MISSING in statuses else PASSED
    sentence = " ".join([gate.reason for gate in parts] + [memory["sentence"]])
    link = _run_link(parts[1].run) or engine.get_absolute_url()
    return item("step:on-target", title, status, sentence, link)


def _reviews_step(release):
    count, needed = len(approvals(release)), release.team.approvals_required
    status = PASSED if count >= needed else MISSING
    sentence = f"{count} of the {needed} approval(s) the team requires."
    return item(
        "step:reviews", "Reviews", status, sentence, release.get_absolute_url() + "#reviews"
    )
