"""Release gates: what a version must show before it is promoted. Parity is one of them.

The preprocessing-parity gate: a version passes when its latest completed
parity run passed, that is when the version's preprocessing spec, run by the
code DeployHub ships, reproduced the tensors the training pipeline fed the
model. It fails when that run found a mismatch, and is missing when no parity
run has completed. The approval workflow, yet to come, will read these gates.
"""

from dataclasses import dataclass

from deployhub.choices import ChoiceSet
from deployhub.jobs.models import JobState


class GateStatus(ChoiceSet):
    PASSED = "passed"
    FAILED = "failed"
    MISSING = "missing"
    NOT_REQUIRED = "not-required"
    CHOICES = (
        (PASSED, "Passed", "green"),
        (FAILED, "Failed", "red"),
        (MISSING, "Missing", "grey"),
        (NOT_REQUIRED, "Not required", "grey"),
    )
    # What lets a release through: a gate that passed, or one with nothing to check.
    OPEN = (PASSED, NOT_REQUIRED)


@dataclass(frozen=True)
class Gate:
    """The state of one release gate of a version, with the reason and the run behind it."""

    name: str
    status: str
    reason: str
    run: object = None

    @property
    def color(self):
        return GateStatus.color(self.status)

    @property
    def label(self):
        return GateStatus.label(self.status)

    def as_json(self):
        return {
            "gate": self.name,
            "status": self.status,
            "reason": self.reason,
            "run": self.run.pk if self.run else None,
        }


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
