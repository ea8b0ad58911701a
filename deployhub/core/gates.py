"""The release gate, as every gate states it: a name, a status, the reason and the run behind it.

Each app that owns a gate computes it (parity: deployhub/parity/gates.py; the
engine's accuracy, golden and performance gates: deployhub/engines/gates.py)
and states it with these types, so a page, the API and (next) the approval workflow
read every gate the same way. This module imports no app.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from deployhub.core.choices import ChoiceSet


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
    """The state of one release gate, with the reason and the run behind it."""

    name: str
    status: str
    reason: str
    run: Any = None

    @property
    def color(self) -> str:
        return GateStatus.color(self.status)

    @property
    def label(self) -> str:
        return GateStatus.label(self.status)

    @property
    def open(self) -> bool:
        """Whether the gate lets a release through: it passed, or has nothing to check."""
        return self.status in GateStatus.OPEN

    def as_json(self) -> dict[str, Any]:
        return {
            "gate": self.name,
            "status": self.status,
            "reason": self.reason,
            "run": self.run.pk if self.run else None,
        }


def gates_open(gates: Iterable[Gate]) -> bool:
    """Return True when every gate passed or has nothing to check."""
    return all(gate.open for gate in gates)
