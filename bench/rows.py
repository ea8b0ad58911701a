"""Bench rows: a figure, its target and PASS or MISS, printed and kept in bench/results.json."""

import json
import os
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"


def row(name, figure, unit, target, lower_is_better=True):
    """Return a row comparing figure with target (lower or higher is better)."""
    passed = figure <= target if lower_is_better else figure >= target
    sign = "≤" if lower_is_better else "≥"
    return {
        "name": name,
        "figure": round(figure, 3),
        "unit": unit,
        "target": f"{sign} {target} {unit}",
        "verdict": "PASS" if passed else "MISS",
    }


def note(name, figure, unit, verdict, reason=""):
    """Return a row with no target: a measurement shown for context, or why none was taken."""
    return {
        "name": name,
        "figure": None if figure is None else round(figure, 3),
        "unit": unit,
        "target": "-",
        "verdict": verdict,
        **({"reason": reason} if reason else {}),
    }


def print_rows(rows):
    """Print the rows as a table, then how many missed."""
    width = max(len(r["name"]) for r in rows)
    print(f"{'row':<{width}}  {'figure':>10}  {'target':<12} verdict")
    for r in rows:
        figure = "-" if r["figure"] is None else f"{r['figure']:>7.2f}"
        figure = f"{figure:>7} {r['unit']:<2}"
        reason = f"  ({r['reason']})" if r.get("reason") else ""
        print(f"{r['name']:<{width}}  {figure}  {r['target']:<12} {r['verdict']}{reason}")
    misses = sum(r["verdict"] == "MISS" for r in rows)
    print(f"\nwritten to {RESULTS.relative_to(ROOT)}; {misses} miss(es)")


def write_results(rows, machine_extra=None):
    """Write the rows; rows of benches not run this time are kept from the last run."""
    ran = {r["bench"] for r in rows}
    kept = []
    if RESULTS.exists():
        before = json.loads(RESULTS.read_text()).get("rows", [])
        kept = [r for r in before if r.get("bench") and r["bench"] not in ran]
    machine = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        **(machine_extra or {}),
    }
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    document = {"when": when, "machine": machine, "rows": kept + rows}
    RESULTS.write_text(json.dumps(document, indent=2) + "\n")
