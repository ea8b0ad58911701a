"""Queue benchmarks: who may, of what, with params the form has checked."""

from deployhub.jobs.actions import submit_job
from deployhub.jobs.models import JobKind
from deployhub.teams.access import require_role
from deployhub.teams.models import Role


class BenchmarkRefused(ValueError):
    """The benchmark cannot be queued; the message says why."""


def submit_benchmark(form, user, version, engine=None):
    """Queue the benchmark a valid BenchmarkForm describes, of the version or one of its engines."""
    require_role(user, version.team, Role.ENGINEER)
    if not version.is_onnx:
        raise BenchmarkRefused("Benchmark the ONNX version exported from this .pt2 instead.")
    return submit_job(
        team=version.team,
        kind=JobKind.BENCHMARK,
        device_class=form.chosen_class,
        user=user,
        model_version=version,
        engine=engine,
        params=form.params(),
    )
