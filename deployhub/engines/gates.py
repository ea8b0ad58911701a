"""Release gates of an engine: what it must show before it is proposed for its device class.

Four gates, each passed, failed or missing (or not required), with the reason
as a sentence and the run behind it:

- parity: the version's preprocessing reproduces the training tensors
  (deployhub/parity/gates.py);
- accuracy: the engine's latest evaluation is within the class's tolerance
  (AccuracyRun.tolerance_breach, the rule every flag uses);
- golden: the engine reproduces every golden set of its version (the latest
  check of each); not required when the version has none;
- performance: the engine's latest benchmark on its class meets the class's
  gate, as its serving pattern defines it (BenchmarkRun.gate).

Each is stated with the neutral types of deployhub/core/gates.py.
"""

from deployhub.benchmarks.gates import GateVerdict
from deployhub.core.gates import Gate, GateStatus
from deployhub.parity.gates import parity_gate
from deployhub.registry.models import latest_per


def release_gates(engine):
    """Return the engine's release gates, in the order a reviewer reads them."""
    return [
        version_parity_gate(engine.model_version),
        accuracy_gate(engine),
        golden_gate(engine),
        performance_gate(engine),
    ]


def version_parity_gate(version):
    """The version's parity gate, worked out once per loaded version: a page lists many engines
    of one version (engines/pages.py hands them all the same instance)."""
    if "parity_gate" not in vars(version):
        vars(version)["parity_gate"] = parity_gate(version)
    return vars(version)["parity_gate"]


def newest(engine, relation):
    """The engine's runs of a relation, newest first: queried, or loaded with the engine when a
    page prefetched them (EngineQuerySet.with_gate_runs: then only the newest evaluation, the
    newest check of each golden set and the newest benchmark on each class, all a gate reads)."""
    if (runs := getattr(engine, f"newest_{relation}", None)) is not None:
        return runs
    return getattr(engine, relation).order_by("-created_at", "-pk")


def accuracy_gate(engine):
    """Return whether the engine's latest evaluation is within its class's tolerance."""
    run = next(iter(newest(engine, "accuracy")), None)
    if run is None:
        return Gate("accuracy", GateStatus.MISSING, "No evaluation yet: evaluate the engine.")
    tolerance = engine.device_class.tolerance_for(run.task)
    if breach := run.tolerance_breach(engine.device_class):
        return Gate("accuracy", GateStatus.FAILED, f"Evaluation #{run.pk}: {breach}.", run)
    bound = tolerance.drop if run.labelled else tolerance.agreement
    reason = (
        f"Evaluation #{run.pk} on {run.samples} samples is within the tolerance: "
        f"{run.headline} {run.headline_value:.4g} ({_bound_text(run, bound)})."
    )
    return Gate("accuracy", GateStatus.PASSED, reason, run)


def _bound_text(run, bound):
    if bound is None:
        return "no bound set"
    if run.labelled:
        return f"{run.metric_drop_points:.2f} points from the FP32 reference, at most {bound:g}"
    return f"bound {bound:g}"


def golden_gate(engine):
    """Return whether the engine reproduces each golden set of its version."""
    sets = list(engine.model_version.golden_sets.all())
    if not sets:
        return Gate("golden", GateStatus.NOT_REQUIRED, "The version has no golden pairs.")
    runs = latest_per(newest(engine, "golden_runs"), "golden_set_id")
    if failed := [run for run in runs if not run.passed]:
        return Gate("golden", GateStatus.FAILED, failed[0].reason, failed[0])
    checked = {run.golden_set_id for run in runs}
    if unchecked := [golden.name for golden in sets if golden.pk not in checked]:
        reason = f"Not checked yet against {', '.join(unchecked)}: evaluate on the golden pairs."
        return Gate("golden", GateStatus.MISSING, reason)
    return Gate("golden", GateStatus.PASSED, f"Reproduces all {len(sets)} golden set(s).")


def performance_gate(engine):
    """Return whether the engine's latest benchmark on its class meets the class's gate."""
    on_class = (
        run for run in newest(engine, "benchmarks") if run.device_class_id == engine.device_class_id
    )
    run = next(on_class, None)
    if run is None:
        rule = engine.device_class.gate_rule
        return Gate("performance", GateStatus.MISSING, f"No benchmark yet. The class asks: {rule}")
    gate = run.gate()
    status = {GateVerdict.MEETS: GateStatus.PASSED, GateVerdict.MISSES: GateStatus.FAILED}
    return Gate("performance", status.get(gate.verdict, GateStatus.MISSING), gate.reason, run)
