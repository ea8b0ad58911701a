"""Jobs a user may see: the one place other apps get them from."""

from django.shortcuts import get_object_or_404

from deployhub.jobs.models import Job
from deployhub.teams.access import teams_of


def get_job_for_user(request, pk):
    """Return the job with this pk in one of the user's teams, or raise Http404."""
    queryset = Job.objects.select_related("device_class", "device", "model_version__model")
    return get_object_or_404(queryset, pk=pk, team__in=teams_of(request.user))
