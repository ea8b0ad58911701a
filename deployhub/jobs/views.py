"""Pages for jobs: the list, one job with live progress, cancel."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from deployhub.jobs import kinds, pages
from deployhub.jobs.access import get_job_for_user
from deployhub.jobs.actions import JobConflict, cancel_job
from deployhub.jobs.backlog import no_device_notice
from deployhub.jobs.models import Job, JobKind, JobState
from deployhub.teams.access import current_team, require_role
from deployhub.teams.models import Role


@login_required
def jobs_list(request):
    team = current_team(request)
    jobs = Job.objects.for_team(team)
    state = request.GET.get("state")
    if state in dict(JobState.choices()):
        jobs = jobs.filter(state=state)
    context = {"jobs": jobs[:200], "states": JobState.choices(), "state": state}
    return render(request, "jobs/list.html", context)


@login_required
def job_detail(request, pk):
    job = get_job_for_user(request, pk)
    context = {"job": job, "status": job_status_dict(job), **pages.job_sections.context(job)}
    return render(request, "jobs/detail.html", context)


def job_status_dict(job):
    """Return what the live views show of a job."""
    waiting = no_device_notice(job.device_class) if job.state == JobState.QUEUED else ""
    return {
        "id": job.pk,
        "kind": JobKind.label(job.kind),
        "reloads_page": kinds.reloads_page(job.kind),
        "state": job.state,
        "state_label": JobState.label(job.state),
        "state_color": job.state_color,
        "final": job.is_final,
        "progress": round(job.progress, 4),
        "message": job.message,
        "attempt": job.attempt,
        "device": str(job.device or ""),
        "error": job.error,
        "cancel_requested": job.cancel_requested,
        "waiting_notice": waiting,
        "log": job.log,
    }


@login_required
def job_status(request, pk):
    return JsonResponse(job_status_dict(get_job_for_user(request, pk)))


@login_required
@require_POST
def job_cancel(request, pk):
    job = get_job_for_user(request, pk)
    require_role(request.user, job.team, Role.ENGINEER)
    try:
        cancel_job(job.pk, request.user)
        messages.success(request, f"Cancel of {job} requested.")
    except JobConflict as exc:
        messages.error(request, str(exc))
    next_url = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()}):
        next_url = job.get_absolute_url()
    return redirect(next_url)
