"""The budget gate of a benchmark run: whether it meets its device class's budget, and why.

The class's serving pattern picks what decides: p99 against the frame budget for a
real-time class, sustained throughput (and a per-batch p99 ceiling) for a batch class.
An unstable measurement decides nothing unless its margin is wide, and peak memory over
the class's limit misses. The performance release gate (deployhub/engines/gates.py)
states the verdict as a Gate.
"""

from dataclasses import dataclass

from deployhub.benchmarks.scenarios import Scenario
from deployhub.core.choices import ChoiceSet
from deployhub.devices.models import ServingPattern

# An unstable run still meets a gate it meets by this factor (see budget_verdict).
WIDE_MARGIN = 2.0


class GateVerdict(ChoiceSet):
    """Whether a run meets its device class's gate."""

    MEETS = "meets"
    MISSES = "misses"
    UNSTABLE = "unstable"
    UNKNOWN = "unknown"
    CHOICES = (
        (MEETS, "Meets budget", "green"),
        (MISSES, "Misses budget", "red"),
        (UNSTABLE, "Unstable: measure again", "orange"),
        (UNKNOWN, "Cannot judge", "grey"),
    )


@dataclass(frozen=True)
class BudgetVerdict:
    """A run's verdict against its class's budget, and the sentence that explains it.

    The performance release gate (deployhub/engines/gates.py) states it as a Gate.
    """

    verdict: str
    reason: str

    @property
    def label(self):
        return GateVerdict.label(self.verdict)

    @property
    def color(self):
        return GateVerdict.color(self.verdict)


def budget_verdict(run):
    """Judge a benchmark run against its device class; the serving pattern picks what decides.

    An unstable measurement decides nothing, unless it meets the gate with a
    margin of at least WIDE_MARGIN (p99 at most half the budget, twice the
    throughput target): noise of that size cannot turn the verdict.
    """
    device_class = run.device_class
    if device_class.serving_pattern == ServingPattern.BATCH:
        gate = _batch_gate(run, device_class)
    else:
        gate = _realtime_gate(run, device_class)
    if run.stable is False:
        gate = _unstable(run, gate, device_class)
    return _with_memory(run, gate, device_class.memory_limit_mb)


def _unstable(run, gate, device_class):
    reasons = "; ".join(run.stability_reasons) or "the worker flagged it"
    if gate.verdict == GateVerdict.MEETS and _wide_margin(run, device_class):
        return BudgetVerdict(
            GateVerdict.MEETS,
            f"{gate.reason} The measurement is unstable ({reasons}), but the margin is "
            f"{WIDE_MARGIN:g}x or more: noise of that size cannot turn the verdict.",
        )
    return BudgetVerdict(
        GateVerdict.UNSTABLE,
        f"The measurement is unstable ({reasons}): measure again before trusting it.",
    )


def _wide_margin(run, device_class):
    if device_class.serving_pattern != ServingPattern.BATCH:
        return run.gate_p99_ms * WIDE_MARGIN <= device_class.frame_budget_ms
    ceiling = device_class.batch_latency_ceiling_ms
    return run.gate_throughput_ips >= WIDE_MARGIN * device_class.throughput_target_ips and (
        not ceiling or run.latency_p99_ms * WIDE_MARGIN <= ceiling
    )


def _realtime_gate(run, device_class):
    budget = device_class.frame_budget_ms
    if run.scenario == Scenario.OFFLINE:
        return BudgetVerdict(
            GateVerdict.UNKNOWN,
            "An Offline run measures throughput only; a real-time class is judged on the "
            "p99 of a SingleStream or Server run.",
        )
    p99, which = run.gate_p99_ms, "Server p99" if run.scenario == Scenario.SERVER else "p99"
    fps = f"{1000.0 / budget:.0f} fps"
    if p99 <= budget:
        return BudgetVerdict(
            GateVerdict.MEETS,
            f"{which} {p99:.2f} ms is within the {budget:g} ms frame budget ({fps}).",
        )
    return BudgetVerdict(
        GateVerdict.MISSES,
        f"{which} {p99:.2f} ms is over the {budget:g} ms frame budget ({fps}): "
        f"{1000.0 / p99:.0f} fps at p99.",
    )


def _batch_gate(run, device_class):
    target, ceiling = device_class.throughput_target_ips, device_class.batch_latency_ceiling_ms
    if not target:
        return BudgetVerdict(
            GateVerdict.UNKNOWN,
            "The class is a batch class without a throughput target: set one to judge runs.",
        )
    throughput, p99 = run.gate_throughput_ips, run.latency_p99_ms
    misses = []
    if throughput < target:
        misses.append(f"throughput {throughput:.1f} img/s is below the {target:g} img/s target")
    if ceiling and p99 > ceiling:
        misses.append(f"per-batch p99 {p99:.2f} ms is over the {ceiling:g} ms ceiling")
    if misses:
        sentence = "; ".join(misses)
        sentence = f"{sentence[0].upper()}{sentence[1:]} (batch {run.batch_size})."
        return BudgetVerdict(GateVerdict.MISSES, sentence)
    within = f", per-batch p99 {p99:.2f} ms within the {ceiling:g} ms ceiling"
    within = within if ceiling else ""
    return BudgetVerdict(
        GateVerdict.MEETS,
        f"Throughput {throughput:.1f} img/s meets the {target:g} img/s target "
        f"at batch {run.batch_size}{within}.",
    )


def _with_memory(run, gate, limit_mb):
    memory = run.peak_memory_mb
    if not limit_mb or memory is None or memory <= limit_mb:
        return gate
    over = f"Peak memory {memory:.0f} MB is over the class's {limit_mb} MB limit."
    return BudgetVerdict(GateVerdict.MISSES, f"{over} {gate.reason}")
