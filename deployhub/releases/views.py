"""The release page and its actions: propose, submit, review, override, promote, roll back,
and refresh its evidence pack."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from deployhub.core.gates import GateStatus
from deployhub.engines.access import get_engine_for_user
from deployhub.releases import actions
from deployhub.releases.access import get_release_for_user
from deployhub.releases.forms import OverrideForm, ProposeForm, ReviewForm, RollbackForm
from deployhub.releases.models import ReleaseState
from deployhub.releases.pages import release_sections


def engine_part(engine):
    """The engine page's releases of the engine and the propose form (registered in apps.py)."""
    return {"releases": engine.releases.select_related("created_by"), "propose_form": ProposeForm()}


@login_required
@require_POST
def engine_propose(request, pk):
    engine = get_engine_for_user(request, pk)
    form = ProposeForm(request.POST)
    note = form.cleaned_data["note"] if form.is_valid() else ""
    try:
        release = actions.propose(engine, request.user, note)
    except actions.ReleaseRefused as exc:
        messages.error(request, f"Not proposed: {exc}")
        return redirect(engine)
    messages.success(request, f"Release #{release.pk} drafted: submit it for review.")
    return redirect(release)


@login_required
def release_detail(request, pk):
    release = actions.recheck(get_release_for_user(request, pk))
    context = {**_context(release), **release_sections.context(release)}
    return render(request, "releases/detail.html", context)


def _context(release):
    return {
        "release": release,
        "engine": release.engine,
        "version": release.engine.model_version,
        "states": [(state, ReleaseState.label(state)) for state in ReleaseState.PATH],
        "side_states": [
            (state, ReleaseState.label(state))
            for state in (ReleaseState.REJECTED, ReleaseState.ROLLED_BACK)
        ],
        "gates": actions.gates_of(release),
        "blocking": actions.blocking_gates(release),
        "reviews": release.reviews.select_related("reviewer"),
        "approvals": actions.approvals(release),
        "overrides": release.overrides.select_related("by"),
        "production": actions.production_of(release.model, release.device_class),
        "checklist": [_drawn(step) for step in release.evidence.get("checklist", [])],
        "evidence_sections": _evidence_sections(release.evidence),
        "review_form": ReviewForm(),
        "rollback_form": RollbackForm(),
        "override_form": OverrideForm(),
    }


def _evidence_sections(pack):
    """The evidence pack's items after the checklist, in the order the page draws them."""
    if not pack:
        return []
    sections = [
        ("Release gates", pack["gates"]),
        ("Devices", [pack["compatibility"], *pack["devices"]]),
        ("Memory and stability", [pack["memory"], pack["stability"]]),
        ("Against production", [pack["production"]]),
    ]
    return [(title, [_drawn(entry) for entry in entries]) for title, entries in sections]


def _drawn(entry):
    """An evidence item with its status's label and colour, for a badge."""
    return {
        **entry,
        "label": GateStatus.label(entry["status"]),
        "color": GateStatus.color(entry["status"]),
    }


def _act(request, pk, act, done):
    """Run one action on the release; a refusal is shown on the page, a role refusal is 403."""
    release = get_release_for_user(request, pk)
    try:
        act(release)
    except actions.ReleaseRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, done)
    return redirect(release)


@login_required
@require_POST
def release_submit(request, pk):
    return _act(request, pk, lambda r: actions.submit(r, request.user), "Submitted for review.")


@login_required
@require_POST
def release_review(request, pk):
    form = ReviewForm(request.POST)
    decision = form.data.get("decision", "")
    comment = form.data.get("comment", "")
    return _act(
        request,
        pk,
        lambda r: actions.review(r, request.user, decision, comment),
        "Review recorded.",
    )


@login_required
@require_POST
def release_override(request, pk):
    gate, justification = request.POST.get("gate", ""), request.POST.get("justification", "")
    return _act(
        request,
        pk,
        lambda r: actions.override_gate(r, request.user, gate, justification),
        f"The {gate} gate is overridden; the justification is kept on the release.",
    )


@login_required
@require_POST
def release_promote(request, pk):
    return _act(request, pk, lambda r: actions.promote(r, request.user), "Promoted to production.")


@login_required
@require_POST
def release_rollback(request, pk):
    reason = request.POST.get("reason", "")
    return _act(
        request,
        pk,
        lambda r: actions.rollback(r, request.user, reason),
        "Rolled back: the release it restored passed promote's checks (a valid engine, open "
        "gates, the approvals the team requires) and is production again.",
    )


@login_required
@require_POST
def release_evidence(request, pk):
    return _act(
        request,
        pk,
        lambda r: actions.refresh_evidence(r, request.user),
        "Evidence recomputed from the stored runs.",
    )
