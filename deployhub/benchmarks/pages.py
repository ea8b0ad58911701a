"""What benchmarks adds to the version page (results and the form) and to a benchmark job's
page (its run); registered in apps.py."""

from deployhub.benchmarks.forms import BenchmarkForm
from deployhub.benchmarks.models import BenchmarkRun


def version_part(version):
    return {
        "benchmark_form": BenchmarkForm(team=version.team, version=version),
        "benchmarks": BenchmarkRun.objects.for_version(version),
    }


def job_part(job):
    benchmark = getattr(job, "benchmark", None)
    return {"benchmarks": [benchmark] if benchmark else []}
