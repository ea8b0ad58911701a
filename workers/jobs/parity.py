"""A parity job: check a parity pack against the version's preprocessing spec."""

from workers import kinds
from workers.checks.parity import check_parity
from workers.errors import JobError
from workers.kinds import PARITY_INPUT

KIND = kinds.PARITY


def run(job_run, inputs):
    """Check the job's parity pack against its spec; return the protocol's parity result."""
    if PARITY_INPUT not in inputs:
        raise JobError(f"a parity job needs an input named {PARITY_INPUT!r} (the parity pack)")
    result = check_parity(
        inputs[PARITY_INPUT],
        job_run.job.get("params") or {},
        job_run.workdir / "parity",
        progress=job_run.report,
        should_stop=job_run.should_stop,
    )
    job_run.log.add(result["summary"])
    return result
