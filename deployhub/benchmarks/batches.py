"""Which batch sizes a version accepts, and the batch sweep the hub asks a worker for.

The input-shape contract is the contract: a benchmark feeds only batch sizes the
contract allows, and a sweep walks 1, 2, 4, 8 ... up to the contract's largest
batch (which is always measured, power of two or not).
"""

from dataclasses import dataclass

MAX_BATCH = 1024


class BatchRefused(ValueError):
    """The batch size or sweep does not fit the version's contract; the message says why."""


@dataclass(frozen=True)
class BatchRule:
    """The batch sizes a version accepts: a list of sizes, a range, or anything (no contract)."""

    sizes: tuple = ()
    low: int = 1
    high: int = MAX_BATCH
    constrained: bool = True

    def allows(self, batch):
        if self.sizes:
            return batch in self.sizes
        return self.low <= batch <= self.high

    def describe(self):
        if self.sizes:
            return "sizes " + ", ".join(map(str, self.sizes))
        if self.high < self.low:
            return "no batch size that every input takes"
        return f"{self.low} to {self.high}"


def _fixed(dim):
    return isinstance(dim, int) and not isinstance(dim, bool) and dim > 0


def batch_rule(version):
    """Return the BatchRule of a version: its fixed batch dims, narrowed by its contract."""
    sizes, low, high = None, 1, MAX_BATCH
    for spec in version.inputs or []:
        shape = spec.get("shape")
        if shape and _fixed(shape[0]):
            sizes = {shape[0]} if sizes is None else sizes & {shape[0]}
    entries = (version.contract or {}).get("inputs") or {}
    for entry in entries.values():
        batch = entry.get("batch") or {}
        if "sizes" in batch:
            sizes = set(batch["sizes"]) if sizes is None else sizes & set(batch["sizes"])
        elif "max" in batch:
            low, high = max(low, batch["min"]), min(high, batch["max"])
    if sizes is not None:
        kept = tuple(sorted(s for s in sizes if low <= s <= high))
        return BatchRule(sizes=kept) if kept else BatchRule(low=1, high=0)  # allows none
    return BatchRule(low=low, high=high, constrained=bool(entries))


def check_batch(version, batch):
    """Raise BatchRefused unless the version's contract allows this batch size."""
    rule = batch_rule(version)
    if not rule.allows(batch):
        raise BatchRefused(
            f"Batch {batch} is outside the input-shape contract of {version} ({rule.describe()})."
        )


def sweep_sizes(version):
    """Return the batch sizes to sweep: powers of two up to the contract's largest batch."""
    rule = batch_rule(version)
    if not rule.constrained:
        raise BatchRefused(
            f"{version} has no input-shape contract, so its largest batch is unknown: "
            "give it a contract (a new version) to sweep batch sizes."
        )
    candidates = rule.sizes or range(rule.low, rule.high + 1)
    if not candidates:
        raise BatchRefused(f"The input-shape contract of {version} allows no batch size.")
    if len(candidates) == 1:
        raise BatchRefused(
            f"The batch dimension of {version} is fixed at {candidates[0]}: "
            "there is nothing to sweep."
        )
    low, high = min(candidates), max(candidates)
    powers = [2**k for k in range(high.bit_length()) if rule.allows(2**k)]
    return sorted({low, high, *powers})
