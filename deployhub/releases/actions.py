"""What may happen to a release, and who may do it; each change is an Event with before/after.

Engineers propose and submit; reviewers and admins review, promote and roll
back; nobody approves their own release, admins included. A failed release gate
blocks approval unless an admin overrode that gate with a written justification
(kept and shown forever; the approvals are still needed). A refusal raises
ReleaseRefused (the state, the gates or the quorum: HTTP 409) or PermissionDenied
(the role: 403), each saying which rule refused.
"""

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.utils import timezone

from deployhub.core.json_input import length_problem
from deployhub.engines.gates import release_gates
from deployhub.engines.models import EngineStatus
from deployhub.registry.models import Model
from deployhub.releases import evidence, notify
from deployhub.releases.models import Decision, GateOverride, Release, ReleaseState, Review
from deployhub.releases.queries import approvals, production_of
from deployhub.teams.access import require_role
from deployhub.teams.models import Event, Role


class ReleaseRefused(Exception):
    """The release's state, gates or quorum do not allow this; the message says which rule."""


def _check_length(text, what):
    """Refuse a person's text longer than the hub keeps (DEPLOYHUB_MAX_TEXT_CHARS)."""
    if problem := length_problem(text, what):
        raise ReleaseRefused(f"{problem} Shorten it.")


def gates_of(release):
    """Return the engine's release gates, each failed one marked when an admin overrode it."""
    overridden = {override.gate: override for override in release.overrides.all()}
    return [(gate, overridden.get(gate.name)) for gate in release_gates(release.engine)]


def blocking_gates(release):
    """Return the gates that block approval: not open and not overridden."""
    return [gate for gate, override in gates_of(release) if not gate.open and override is None]


def propose(engine, user, note=""):
    """Create a draft release of an engine for its device class (engineers and up)."""
    require_role(user, engine.team, Role.ENGINEER)
    if engine.status != EngineStatus.VALID:
        raise ReleaseRefused(f"Only a valid engine can be proposed; {engine} is {engine.status}.")
    _check_length(note, "The note")
    release = Release.objects.create(
        engine=engine,
        model=engine.model_version.model,
        device_class=engine.device_class,
        note=note,
        created_by=user,
    )
    _record(release, user, "release.proposed", None, note=note)
    return release


def submit(release, user):
    """Send a draft for review (its author, or an engineer and up)."""
    require_role(user, release.team, Role.ENGINEER)
    _require_state(release, "submitted for review", ReleaseState.DRAFT)
    with transaction.atomic():  # in review only with its evidence pack, or not at all
        release = _locked(release, "submitted for review", ReleaseState.DRAFT)
        release.submitted_at = timezone.now()
        notify.entered_review(release)
        _move(release, user, ReleaseState.IN_REVIEW, "release.submitted", "Submitted for review.")
        return evidence.store(release)


def refresh_evidence(release, user):
    """Recompute the release's evidence pack from the stored runs (engineers and up)."""
    require_role(user, release.team, Role.ENGINEER)
    evidence.store(release)
    _record(release, user, "release.evidence_refreshed", release.state)
    return release


def review(release, user, decision, comment=""):
    """Record a reviewer's decision; enough approvals approve the release, a rejection ends it."""
    require_role(user, release.team, Role.REVIEWER)
    if decision not in dict(Decision.choices()):
        raise ReleaseRefused(f"A decision is one of {', '.join(dict(Decision.choices()))}.")
    if user.pk == release.created_by_id:
        raise PermissionDenied("Nobody reviews their own release, admins included.")
    _check_length(comment, "The comment")
    _require_state(release, "reviewed", ReleaseState.IN_REVIEW)
    if decision == Decision.APPROVE and (blocking := blocking_gates(release)):
        names = ", ".join(f"{gate.name} ({gate.label.lower()})" for gate in blocking)
        raise ReleaseRefused(f"Approval is blocked by the release gates: {names}.")
    with transaction.atomic():
        release = _locked(release, "reviewed", ReleaseState.IN_REVIEW)
        decision_made = Review.objects.create(
            release=release, reviewer=user, decision=decision, comment=comment
        )
        notify.decided(release, decision_made)
        _record(release, user, f"release.review.{decision}", release.state, comment=comment)
        if decision == Decision.REJECT:
            return _move(release, user, ReleaseState.REJECTED, "release.rejected", comment)
        if decision == Decision.REQUEST_CHANGES:
            return _move(release, user, ReleaseState.DRAFT, "release.changes_requested", comment)
        return evidence.store(_approve_when_quorate(release, user))


def override_gate(release, user, gate, justification):
    """Let a release past one failed gate: admins only, with a written justification."""
    require_role(user, release.team, Role.ADMIN)
    justification = (justification or "").strip()
    if not justification:
        raise ReleaseRefused("An override needs a written justification.")
    _check_length(justification, "The justification")
    failed = {gate.name: gate for gate in blocking_gates(release)}
    if gate not in failed:
        raise ReleaseRefused(
            f"The {gate!r} gate is open or overridden already: there is nothing to override."
        )
    with transaction.atomic():
        release = _locked(release, "overridden", ReleaseState.DRAFT, ReleaseState.IN_REVIEW)
        GateOverride.objects.create(
            release=release, gate=gate, justification=justification, by=user
        )
        _record(
            release,
            user,
            "release.gate_overridden",
            release.state,
            gate=gate,
            status=failed[gate].status,
            justification=justification,
        )
    return release


def promote(release, user):
    """Make an approved release production; the class's current one is retired with it.

    Promote's checks run first (recheck): an engine still valid, gates still open and as
    many approvals as the team requires now, not when the release was approved.
    """
    require_role(user, release.team, Role.REVIEWER)
    approved = release.state == ReleaseState.APPROVED
    recheck(release)
    if approved and release.state == ReleaseState.IN_REVIEW:
        raise ReleaseRefused(
            f"Release #{release.pk} went back to review instead of being promoted: "
            f"{release.state_reason}"
        )
    _require_state(release, "promoted", ReleaseState.APPROVED)
    try:
        with transaction.atomic():
            return _promote(release, user)
    except IntegrityError as exc:  # another release of the model reached production meanwhile
        raise ReleaseRefused(
            "Another release of this model was promoted on the class at the same moment: "
            "reload and try again."
        ) from exc


def _promote(release, user):
    # Promotes of one model queue on its row; the release is read again under the lock.
    Model.objects.select_for_update().filter(pk=release.model_id).first()
    release = _locked(release, "promoted", ReleaseState.APPROVED)
    current = production_of(release.model, release.device_class, lock=True)
    if current is not None:
        _move(current, user, ReleaseState.RETIRED, "release.retired", f"Replaced by #{release.pk}.")
    release.replaced, release.promoted_at = current, timezone.now()
    return _move(release, user, ReleaseState.PRODUCTION, "release.promoted", "Promoted.")


def rollback(release, user, reason):
    """Take a production release out and restore the one it replaced, saying why.

    The release it restores must pass promote's checks (its engine valid, its gates open,
    the approvals the team requires now); the restore says it did, in its reason and event.
    """
    require_role(user, release.team, Role.REVIEWER)
    reason = (reason or "").strip()
    if not reason:
        raise ReleaseRefused("A rollback needs a reason.")
    _check_length(reason, "The reason")
    _require_state(release, "rolled back", ReleaseState.PRODUCTION)
    with transaction.atomic():
        Model.objects.select_for_update().filter(pk=release.model_id).first()
        release = _locked(release, "rolled back", ReleaseState.PRODUCTION)
        previous = Release.objects.select_for_update().filter(pk=release.replaced_id).first()
        if previous is None or previous.state != ReleaseState.RETIRED:
            raise ReleaseRefused("There is no previous production release to restore.")
        if why := _approval_lapsed(previous):
            raise ReleaseRefused(
                f"Not rolled back: the release it would restore, #{previous.pk}, fails "
                f"promote's checks: {why[0].lower()}{why[1:]} Propose and promote a release "
                "that passes them instead."
            )
        _move(release, user, ReleaseState.ROLLED_BACK, "release.rolled_back", reason)
        previous.promoted_at = timezone.now()
        checks = promote_checks(previous)
        return _move(
            previous,
            user,
            ReleaseState.PRODUCTION,
            "release.restored",
            f"Restored by the rollback of #{release.pk}: {reason} ({checks}.)",
            checks=checks,
        )


def recheck(release):
    """Send an approved release back to review when it no longer passes promote's checks: its
    engine went stale, a gate closed, or the team now requires more approvals than it has.

    A lapsed engine or gate starts the review over; a raised quorum keeps the approvals
    given (they still count) and waits for the missing ones.
    """
    if release.state != ReleaseState.APPROVED:
        return release
    if why := _evidence_lapsed(release):
        release.submitted_at = timezone.now()  # they approved other evidence: start over
    elif not (why := _quorum_lapsed(release)):
        return release
    _move(release, None, ReleaseState.IN_REVIEW, "release.back_to_review", why)
    evidence.store(release)
    return release


def promote_checks(release):
    """Say which of promote's checks the release passed, for a restore's reason and event."""
    count, needed = len(approvals(release)), release.team.approvals_required
    return (
        f"promote's checks passed: engine #{release.engine_id} valid, release gates open "
        f"or overridden, {count} of the {needed} approval(s) the team requires"
    )


def _approve_when_quorate(release, user):
    needed = release.team.approvals_required
    count = len(approvals(release))
    if count < needed:
        return release
    return _move(
        release,
        user,
        ReleaseState.APPROVED,
        "release.approved",
        f"Approved by {count} of the {needed} reviewer(s) the team requires.",
    )


def _approval_lapsed(release):
    """Say why the release no longer passes promote's checks; "" when it does."""
    return _evidence_lapsed(release) or _quorum_lapsed(release)


def _evidence_lapsed(release):
    if release.engine.status != EngineStatus.VALID:
        return f"Its engine turned {release.engine.status} after approval."
    if blocking := blocking_gates(release):
        names = ", ".join(gate.name for gate in blocking)
        return f"Release gates changed after approval: {names} no longer open."
    return ""


def _quorum_lapsed(release):
    count, needed = len(approvals(release)), release.team.approvals_required
    if count >= needed:
        return ""
    return (
        f"The team now requires {needed} approval(s) and it has {count}: "
        f"{needed - count} more needed."
    )


def _locked(release, action, *states):
    """Read the release again under a row lock and check its state there (no race between
    two requests that both read the old state)."""
    Release.objects.select_for_update().filter(pk=release.pk).first()
    release.refresh_from_db()
    _require_state(release, action, *states)
    return release


def _require_state(release, action, *states):
    if release.state not in states:
        allowed = " or ".join(ReleaseState.label(state).lower() for state in states)
        raise ReleaseRefused(
            f"Release #{release.pk} is {release.state_label.lower()}: only a release "
            f"{allowed} can be {action}."
        )


def _move(release, user, state, verb, reason="", **data):
    before = release.state
    release.state, release.state_reason = state, reason or ""
    release.save()
    _record(release, user, verb, before, reason=reason, **data)
    return release


def _record(release, user, verb, before, **data):
    Event.record(release.team, user, verb, release, before=before, after=release.state, **data)
