"""What benchmarks adds to the version page (results and the form) and to a benchmark job's
page (its run); registered in apps.py."""

from deployhub.benchmarks.forms import BenchmarkForm
from deployhub.benchmarks.models import BenchmarkRun, flag_int8_slowdowns_in_version

# The version page lists the latest runs; every run is in the exports linked above the table.
PAGE_RUNS = 50


def results_part(version):
    """The version's latest PAGE_RUNS runs, newest first, and how many it has in all."""
    latest, total = BenchmarkRun.objects.latest_of_version(version, PAGE_RUNS)
    return {"benchmarks": latest, "benchmarks_total": total}


def version_part(version):
    return {
        "benchmark_form": BenchmarkForm(team=version.team, version=version),
        **results_part(version),
    }


def job_part(job):
    benchmark = getattr(job, "benchmark", None)
    return {"benchmarks": flag_int8_slowdowns_in_version([benchmark] if benchmark else [])}
