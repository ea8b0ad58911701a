"""Add a sample model from the Models page."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from deployhub.demo import samples
from deployhub.registry.inspect import InvalidModel
from deployhub.teams.access import current_team, require_role
from deployhub.teams.models import Role


@login_required
@require_POST
def add_resnet18_sample(request):
    team = current_team(request)
    if team is None:
        raise Http404("You are not a member of any team yet.")
    require_role(request.user, team, Role.ENGINEER)
    try:
        model = samples.add_resnet18(team, request.user)
    except (samples.SampleExists, InvalidModel) as exc:
        messages.error(request, str(exc))
        return redirect("models")
    messages.success(request, f"Added {model}: random weights, for latency only.")
    return redirect(model)
