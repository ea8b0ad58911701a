"""The preprocessing-parity release gate of a version (the gate types: deployhub/core/gates.py).

The preprocessing-parity gate: a version passes when its latest completed
parity run passed, that is when the version's preprocessing spec, run by the
code DeployHub ships, reproduced the tensors the training pipeline fed the
model. It fails when that run found a mismatch, and is missing when no parity
run has completed.
"""

from deployhub.core.gates import Gate, GateStatus
from deployhub.jobs.models import JobState


def parity_gate(version):
    """Return the preprocessing-parity gate of a version: passed, failed or missing, with why."""
    run = version.parity_runs.completed().first()
    if run is None:
        return Gate("parity", GateStatus.MISSING, _missing_reason(version))
    if run.passed:
        reason = (
            f"Parity run #{run.pk} passed: the spec reproduces the training tensors of "
            f"{run.samples} image{'s' if run.samples != 1 else ''} "
            f"(max abs error {run.max_abs_error:.3g} ≤ {run.tolerance_used:.3g})."
        )
        return Gate("parity", GateStatus.PASSED, reason, run)
    reason = f"Parity run #{run.pk} failed. {run.summary}"
    return Gate("parity", GateStatus.FAILED, reason, run)


def _missing_reason(version):
    active = version.parity_runs.filter(job__state__in=[JobState.QUEUED, JobState.RUNNING])
    if active.exists():
        return "A parity check is running; the gate opens when it passes."
    if not version.preprocessing:
        return "The version has no preprocessing spec to check: add one as a new version."
    return "No parity check has completed: upload a parity pack."
