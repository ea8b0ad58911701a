"""The parity check on the version page: upload a pack, queue the check."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from deployhub.parity.actions import no_worker_warning, submit_parity
from deployhub.parity.forms import ParityForm
from deployhub.registry.access import get_version_for_user
from deployhub.registry.datasets import DatasetError
from deployhub.registry.inspect import InvalidModel
from deployhub.registry.pages import version_page
from deployhub.teams.access import require_role
from deployhub.teams.models import Role
from workers.checks.parity import PackError

REFUSALS = (PackError, InvalidModel, DatasetError)


@login_required
@require_POST
def version_parity(request, pk):
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    form = ParityForm(request.POST, request.FILES, team=version.team)
    if form.is_valid():
        data = form.cleaned_data
        try:
            run = submit_parity(
                version,
                data["file"],
                request.user,
                device_class=data["device_class"],
                tolerance=data["tolerance"],
            )
        except REFUSALS as exc:
            form.add_error("file", str(exc))
        else:
            _queued_message(request, run)
            return redirect(run)
    return version_page(request, version, status=400, parity_form=form)


def _queued_message(request, run):
    device_class = run.job.device_class
    messages.success(request, f"Parity check queued on {device_class} as job #{run.job.pk}.")
    if warning := no_worker_warning(device_class):
        messages.warning(request, warning)
