"""The fault soak, short form: a private stack broken eight ways loses nothing.

scripts/soak.py --short starts its own PostgreSQL, Redis, storage, hub, hub worker,
beat and device workers (never the shared services), kills workers and the reaper,
restarts Redis and PostgreSQL, fills the disk, skews clocks, sends valid tokens to the
wrong calls from the workers' address, kills the hub under devices in HTTPS mode, and
counts what became of every job. `make soak` runs the long form (at least 500 jobs,
PostgreSQL restarted under HTTPS devices, and devices revoked mid-job and mid-ask).
"""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.services]


@pytest.fixture(scope="module")
def soak(tmp_path_factory):
    """Run the short soak once; return its figures and what it printed."""
    figures = tmp_path_factory.mktemp("soak") / "soak.json"
    python = os.environ.get("DEPLOYHUB_RUN_PYTHON") or sys.executable
    done = subprocess.run(
        [
            sys.executable,
            "scripts/soak.py",
            "--short",
            "--worker-python",
            python,
            "--json",
            str(figures),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    printed = done.stdout[-8000:] + done.stderr[-4000:]
    assert figures.exists(), printed
    return json.loads(figures.read_text()), done.returncode, printed


def test_it_loses_no_job_runs_none_twice_and_leaves_no_orphan_file(soak):
    report, returncode, printed = soak
    faults = {fault["name"]: fault for fault in report["faults"]}
    assert set(faults) == {
        "worker-kill",
        "redis-restart",
        "redis-outage",
        "postgres-restart",
        "storage-full",
        "clock-skew",
        "wrong-call-tokens",
        "https-hub-restart",
    }
    for fault in faults.values():
        if fault["skipped"]:  # storage-full needs a tmpfs: root only
            continue
        assert (fault["lost"], fault["run_twice"], fault["orphans"]) == (0, 0, 0), printed
        assert fault["finished"] == fault["submitted"] > 0, printed
    assert returncode == 0 and report["passed"], printed


def test_it_passes_every_check_of_every_fault(soak):
    report, _, printed = soak
    failed = [
        f"{fault['name']}: {what}: {detail}"
        for fault in report["faults"]
        for what, (passed, detail) in fault["checks"].items()
        if not passed
    ]
    assert not failed, printed
    postgres = next(f for f in report["faults"] if f["name"] == "postgres-restart")
    assert any("503 with a JSON error" in what for what in postgres["checks"]), printed


def test_devices_in_https_mode_come_back_after_the_hub(soak):
    report, _, printed = soak
    faults = {fault["name"]: fault for fault in report["faults"]}
    # Each device asking when the hub died says when it was answered again.
    assert faults["https-hub-restart"]["measured"]["reconnect_s"], printed
