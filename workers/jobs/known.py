"""Every job kind this worker runs, by kind, the way backends/known.py lists the backends.

A new kind is a module in this package (see __init__.py) added to the list at the end.
"""

from types import ModuleType

from workers.errors import JobError
from workers.jobs import benchmark, compare, compile, evaluate, export, noop, parity

# The module of each kind this worker runs, by kind (workers/kinds.py).
JOBS: dict[str, ModuleType] = {}


def register(job: ModuleType) -> ModuleType:
    """Add a kind's module under its KIND; raise ValueError when the kind is taken."""
    if job.KIND in JOBS:
        raise ValueError(f"job kind {job.KIND!r} is registered already ({JOBS[job.KIND].__name__})")
    JOBS[job.KIND] = job
    return job


def get(kind: str) -> ModuleType:
    """Return the module running jobs of this kind; raise JobError naming another kind."""
    if kind not in JOBS:
        raise JobError(f"this worker cannot run jobs of kind {kind!r}")
    return JOBS[kind]


def check_before_download(job_run):
    """Run the job kind's check, so a job that cannot run here fails before any download."""
    check = getattr(JOBS[job_run.job["kind"]], "check", None)
    if check is not None:
        check(job_run)


for _job in (benchmark, compare, compile, evaluate, export, noop, parity):
    register(_job)
