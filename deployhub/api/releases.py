"""API v1 for releases: propose, submit, review, override, promote, roll back and refresh the
evidence pack, by token; list them.

The operations read the body and answer; deployhub/releases/actions.py checks every
rule. A refusal by the release's state, gates or quorum (ReleaseRefused) is 409,
by the caller's role 403, each with the rule that refused as its JSON error. A pipeline
token may read, propose, submit and refresh the evidence (auth=PIPELINES), never decide.
"""

import functools
from typing import Any, Literal

from django.http import HttpResponse
from django.urls import reverse
from ninja import Query, Router, Status
from ninja.pagination import paginate
from pydantic import Field

from deployhub.api.auth import error
from deployhub.api.fields import Name, Nothing, Required, RequiredName, Text
from deployhub.api.v1 import PIPELINES, Listed, Page, Schema, Strict, answers
from deployhub.engines.access import get_engine_for_user
from deployhub.registry.access import get_model_for_user
from deployhub.releases import actions
from deployhub.releases.access import get_release_for_user, releases_for_user
from deployhub.releases.models import Decision, ReleaseState

DECISIONS = tuple(dict(Decision.choices()))
STATES = tuple(dict(ReleaseState.choices()))

# Its django-ninja operations (api/openapi.py mounts it at /api/v1/).
router = Router(tags=["releases"])


class ProposeIn(Strict):
    note: Text = ""
    device_class: Name | None = Field(
        None, description="The engine's own device class (a check: a release is for it)."
    )


class ReviewIn(Strict):
    decision: Literal[DECISIONS]
    comment: Text = ""


class OverrideIn(Strict):
    gate: RequiredName
    justification: Required


class RollbackIn(Strict):
    reason: Required


class ReleaseFilter(Schema):
    device_class: Name | None = Field(
        None, description="Only the releases on this device class (its slug)."
    )
    state: Literal[STATES] | None = Field(None, description="Only the releases in this state.")


class ReleaseEngine(Schema):
    id: int
    url: str
    backend: str
    build_config: dict[str, Any]
    sha256: str


class ModelRef(Schema):
    id: int
    name: str


class VersionRef(Schema):
    id: int
    number: int


class Override(Schema):
    by: str
    justification: str
    at: str | None


class ReleaseGateOut(Schema):
    gate: str
    status: str
    reason: str
    run: int | None
    override: Override | None


class ReviewOut(Schema):
    reviewer: str
    decision: str
    comment: str
    at: str | None


class Approvals(Schema):
    count: int
    required: int


class ReleaseOut(Schema):
    id: int
    url: str
    page: str
    state: str
    state_label: str
    state_reason: str
    engine: ReleaseEngine
    model: ModelRef
    version: VersionRef
    device_class: str
    note: str
    author: str | None
    replaced: int | None
    gates: list[ReleaseGateOut]
    reviews: list[ReviewOut]
    approvals: Approvals
    evidence: dict[str, Any] | None
    evidence_at: str | None
    created_at: str | None
    submitted_at: str | None
    promoted_at: str | None


def release_rules(view):
    """Answer a refusal of the release rules as 409 with the rule that refused."""

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except actions.ReleaseRefused as exc:
            return error(409, str(exc))

    return wrapper


def _time(value):
    return value.isoformat() if value else None


@router.get("releases", response=answers(list[ReleaseOut]), auth=PIPELINES, url_name="api_releases")
@paginate(Page)
def releases(request, filters: Query[ReleaseFilter]):
    """The releases of the caller's teams, newest first; ?device_class=<slug> and ?state=
    keep those on one class, in one state."""
    listed = releases_for_user(request.user)
    if filters.device_class is not None:
        listed = listed.filter(device_class__slug=filters.device_class)
    if filters.state is not None:
        listed = listed.filter(state=filters.state)
    return Listed(listed, lambda release: release_json(request, actions.recheck(release)))


@router.post(
    "engines/{int:pk}/releases",
    response=answers(ReleaseOut, status=201, also=(409,)),
    auth=PIPELINES,
    url_name="api_engine_releases",
)
@release_rules
def engine_releases(request, response: HttpResponse, pk: int, payload: ProposeIn):
    """Propose the engine for production on its own device class (engineers and up): 201
    with the draft release, whose URL is also the Location header. A `device_class` other
    than the engine's is 409."""
    engine = get_engine_for_user(request, pk)
    slug = payload.device_class
    if slug is not None and slug != engine.device_class.slug:
        raise actions.ReleaseRefused(
            f"Engine #{engine.pk} is built for {engine.device_class.slug!r}: a release is for "
            f"its engine's own device class, not {slug!r}."
        )
    release = actions.propose(engine, request.user, payload.note)
    return _created(request, response, release)


@router.get(
    "releases/{int:pk}", response=answers(ReleaseOut), auth=PIPELINES, url_name="api_release"
)
def release_detail(request, pk: int):
    """The release's state, engine, gates with their overrides, reviews and approvals. An
    approved release whose engine turned stale or whose gate closed goes back to review."""
    return release_json(request, actions.recheck(get_release_for_user(request, pk)))


@router.get(
    "models/{int:pk}/releases",
    response=answers(list[ReleaseOut]),
    auth=PIPELINES,
    url_name="api_model_releases",
)
@paginate(Page)
def model_releases(request, pk: int):
    """The model's releases on every device class, newest first."""
    model = get_model_for_user(request, pk)
    listed = model.releases.select_related(
        "engine__model_version__model", "device_class__team", "created_by", "replaced"
    )
    return Listed(listed, lambda release: release_json(request, actions.recheck(release)))


@router.post(
    "releases/{int:pk}/submit",
    response=answers(ReleaseOut, also=(409,)),
    auth=PIPELINES,
    url_name="api_release_submit",
)
@release_rules
def release_submit(request, pk: int, payload: Nothing = None):
    """Send a draft for review (engineers and up); its evidence pack is computed."""
    release = get_release_for_user(request, pk)
    return release_json(request, actions.submit(release, request.user))


@router.post(
    "releases/{int:pk}/reviews",
    response=answers(ReleaseOut, status=201, also=(409,)),
    url_name="api_release_reviews",
)
@release_rules
def release_reviews(request, response: HttpResponse, pk: int, payload: ReviewIn):
    """Review a release in review (reviewers and admins, never its author): approve,
    request_changes (back to draft) or reject; enough approvals approve it. 201."""
    release = get_release_for_user(request, pk)
    release = actions.review(release, request.user, payload.decision, payload.comment)
    return _created(request, response, release)


@router.post(
    "releases/{int:pk}/override",
    response=answers(ReleaseOut, status=201, also=(409,)),
    url_name="api_release_override",
)
@release_rules
def release_override(request, response: HttpResponse, pk: int, payload: OverrideIn):
    """Let one failed gate pass, with a written justification (admins only); 201."""
    release = get_release_for_user(request, pk)
    release = actions.override_gate(release, request.user, payload.gate, payload.justification)
    return _created(request, response, release)


@router.post(
    "releases/{int:pk}/promote",
    response=answers(ReleaseOut, also=(409,)),
    url_name="api_release_promote",
)
@release_rules
def release_promote(request, pk: int, payload: Nothing = None):
    """Make an approved release production (reviewers and admins); the class's current one
    retires. One whose engine, gates or quorum changed since goes back to review (409)."""
    release = get_release_for_user(request, pk)
    return release_json(request, actions.promote(release, request.user))


@router.post(
    "releases/{int:pk}/rollback",
    response=answers(ReleaseOut, also=(409,)),
    url_name="api_release_rollback",
)
@release_rules
def release_rollback(request, pk: int, payload: RollbackIn):
    """Roll the production release back, saying why (reviewers and admins); the release it
    replaced is production again, if it still passes promote's checks (else 409)."""
    release = get_release_for_user(request, pk)
    actions.rollback(release, request.user, payload.reason)
    return release_json(request, release)


@router.post(
    "releases/{int:pk}/evidence",
    response=answers(ReleaseOut, also=(409,)),
    auth=PIPELINES,
    url_name="api_release_evidence",
)
@release_rules
def release_evidence(request, pk: int, payload: Nothing = None):
    """Recompute the release's evidence pack from the stored runs (engineers and up)."""
    release = get_release_for_user(request, pk)
    return release_json(request, actions.refresh_evidence(release, request.user))


def _created(request, response, release):
    """201 with the release, its URL in the Location header."""
    response["Location"] = request.build_absolute_uri(reverse("api_release", args=[release.pk]))
    return Status(201, release_json(request, release))


def release_json(request, release):
    engine, version = release.engine, release.engine.model_version
    return {
        "id": release.pk,
        "url": request.build_absolute_uri(reverse("api_release", args=[release.pk])),
        "page": release.get_absolute_url(),
        "state": release.state,
        "state_label": release.state_label,
        "state_reason": release.state_reason,
        "engine": {
            "id": engine.pk,
            "url": request.build_absolute_uri(reverse("api_engine", args=[engine.pk])),
            "backend": engine.backend,
            "build_config": engine.build_config,
            "sha256": engine.sha256,
        },
        "model": {"id": release.model_id, "name": release.model.name},
        "version": {"id": version.pk, "number": version.number},
        "device_class": release.device_class.slug,
        "note": release.note,
        "author": release.created_by.username if release.created_by else None,
        "replaced": release.replaced_id,
        "gates": [_gate_json(gate, override) for gate, override in actions.gates_of(release)],
        "reviews": [_review_json(review) for review in release.reviews.select_related("reviewer")],
        "approvals": {
            "count": len(actions.approvals(release)),
            "required": release.team.approvals_required,
        },
        "evidence": release.evidence or None,
        "evidence_at": _time(release.evidence_at),
        "created_at": _time(release.created_at),
        "submitted_at": _time(release.submitted_at),
        "promoted_at": _time(release.promoted_at),
    }


def _gate_json(gate, override):
    return {
        **gate.as_json(),
        "override": {
            "by": override.by.username,
            "justification": override.justification,
            "at": _time(override.created_at),
        }
        if override
        else None,
    }


def _review_json(review):
    return {
        "reviewer": review.reviewer.username,
        "decision": review.decision,
        "comment": review.comment,
        "at": _time(review.created_at),
    }
