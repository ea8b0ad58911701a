"""What benchmarks adds to the version page (registered in apps.py): results and the form."""

from deployhub.benchmarks.forms import BenchmarkForm
from deployhub.benchmarks.models import BenchmarkRun


def version_part(version):
    return {
        "benchmark_form": BenchmarkForm(team=version.team, version=version),
        "benchmarks": BenchmarkRun.objects.for_version(version),
    }
