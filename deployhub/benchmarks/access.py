"""Benchmark runs a user may see: the one place other apps get them from."""

from django.shortcuts import get_object_or_404

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.teams.access import teams_of


def get_run_for_user(request, pk):
    """Return the run with this pk in one of the user's teams, or raise Http404."""
    queryset = BenchmarkRun.objects.select_related(
        "model_version", "device_class", "device", "engine"
    )
    return get_object_or_404(queryset, pk=pk, model_version__model__team__in=teams_of(request.user))
