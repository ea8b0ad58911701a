"""The worker's job kinds: one module per kind in workers/jobs/, listed by kind in known.py."""

import types

import pytest

from workers import kinds
from workers.errors import JobError
from workers.jobs import known

EVERY_KIND = {
    kinds.BENCHMARK,
    kinds.COMPARE,
    kinds.COMPILE,
    kinds.EVALUATE,
    kinds.EXPORT,
    kinds.NOOP,
    kinds.PARITY,
}


def test_the_worker_runs_every_kind_the_protocol_names():
    assert set(known.JOBS) == EVERY_KIND
    assert all(job.KIND == kind for kind, job in known.JOBS.items())


def test_a_kind_the_worker_does_not_know_is_refused_by_name():
    with pytest.raises(JobError, match="cannot run jobs of kind 'transmogrify'"):
        known.get("transmogrify")


def test_a_second_module_for_a_kind_is_refused():
    twin = types.ModuleType("workers.jobs.twin")
    twin.KIND = kinds.NOOP

    with pytest.raises(ValueError, match="'noop' is registered already"):
        known.register(twin)

    assert known.JOBS[kinds.NOOP].__name__ == "workers.jobs.noop"
