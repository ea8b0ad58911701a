"""API v1 for releases: propose, submit, review, override, promote, roll back and refresh the
evidence pack, by token.

The views read the body and answer; deployhub/releases/actions.py checks every
rule. A refusal by the release's state, gates or quorum (ReleaseRefused) is 409,
by the caller's role 403, each with the rule that refused as its JSON error.
"""

import functools

from django.http import JsonResponse
from django.urls import reverse
from django.views.decorators.http import require_http_methods
from ninja import Router

from deployhub.api.auth import BadInput, error, for_pipelines, json_body, token_required
from deployhub.engines.access import get_engine_for_user
from deployhub.json_input import length_problem
from deployhub.registry.access import get_model_for_user
from deployhub.releases import actions
from deployhub.releases.access import get_release_for_user
from deployhub.releases.models import Decision

DECISIONS = tuple(dict(Decision.choices()))


# Its django-ninja operations (api/openapi.py mounts it at /api/v1/).
router = Router(tags=["releases"])


def release_rules(view):
    """Answer a refusal of the release rules as 409 with the rule that refused."""

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except actions.ReleaseRefused as exc:
            return error(409, str(exc))

    return wrapper


def _fields(request, known=(), required=()):
    """Return the JSON body's text fields; raise BadInput on another key, a non-string,
    a required field missing or blank, or one longer than the hub keeps."""
    body = json_body(request)
    if unknown := sorted(set(body) - set(known)):
        known_list = ", ".join(known) or "none"
        raise BadInput(f"Unknown parameter {unknown[0]!r}; known: {known_list}.")
    if wrong := [name for name, value in body.items() if not isinstance(value, str)]:
        raise BadInput(f"{wrong[0]!r} must be a string.")
    if missing := [name for name in required if not body.get(name, "").strip()]:
        raise BadInput(f"Say {missing[0]!r}: it is required here.")
    for name, value in body.items():
        if problem := length_problem(value, repr(name)):
            raise BadInput(problem)
    return body


def _time(value):
    return value.isoformat() if value else None


@require_http_methods(["POST"])
@token_required
@for_pipelines
@release_rules
def engine_releases(request, pk):
    """Body {"note": "...", "device_class": "<slug>"?}: propose the engine for its class; 201."""
    engine = get_engine_for_user(request, pk)
    body = _fields(request, known=("note", "device_class"))
    slug = body.get("device_class")
    if slug is not None and slug != engine.device_class.slug:
        raise actions.ReleaseRefused(
            f"Engine #{engine.pk} is built for {engine.device_class.slug!r}: a release is for "
            f"its engine's own device class, not {slug!r}."
        )
    release = actions.propose(engine, request.user, body.get("note", ""))
    return _answer(request, release, status=201)


@require_http_methods(["GET"])
@token_required
@for_pipelines
def release_detail(request, pk):
    """The release's state, engine, gates with their overrides, reviews and approvals."""
    release = actions.recheck(get_release_for_user(request, pk))
    return JsonResponse(release_json(request, release))


@require_http_methods(["GET"])
@token_required
@for_pipelines
def model_releases(request, pk):
    """The model's releases on every device class, newest first."""
    model = get_model_for_user(request, pk)
    listed = model.releases.select_related(
        "engine__model_version__model", "device_class__team", "created_by", "replaced"
    )
    answer = [release_json(request, actions.recheck(release)) for release in listed]
    return JsonResponse({"releases": answer})


@require_http_methods(["POST"])
@token_required
@for_pipelines
@release_rules
def release_submit(request, pk):
    release = get_release_for_user(request, pk)
    _fields(request)
    return _answer(request, actions.submit(release, request.user))


@require_http_methods(["POST"])
@token_required
@release_rules
def release_reviews(request, pk):
    """Body {"decision": "approve | request_changes | reject", "comment": "..."}; 201."""
    release = get_release_for_user(request, pk)
    body = _fields(request, known=("decision", "comment"), required=("decision",))
    if body["decision"] not in DECISIONS:
        raise BadInput(f"'decision' is one of {', '.join(DECISIONS)}.")
    release = actions.review(release, request.user, body["decision"], body.get("comment", ""))
    return _answer(request, release, status=201)


@require_http_methods(["POST"])
@token_required
@release_rules
def release_override(request, pk):
    """Body {"gate": "<name>", "justification": "..."}: an admin lets one failed gate pass; 201."""
    release = get_release_for_user(request, pk)
    body = _fields(request, known=("gate", "justification"), required=("gate", "justification"))
    release = actions.override_gate(release, request.user, body["gate"], body["justification"])
    return _answer(request, release, status=201)


@require_http_methods(["POST"])
@token_required
@release_rules
def release_promote(request, pk):
    release = get_release_for_user(request, pk)
    _fields(request)
    return _answer(request, actions.promote(release, request.user))


@require_http_methods(["POST"])
@token_required
@release_rules
def release_rollback(request, pk):
    """Body {"reason": "..."}: roll the production release back; the one it replaced returns."""
    release = get_release_for_user(request, pk)
    body = _fields(request, known=("reason",), required=("reason",))
    actions.rollback(release, request.user, body["reason"])
    return _answer(request, release)


@require_http_methods(["POST"])
@token_required
@for_pipelines
@release_rules
def release_evidence(request, pk):
    """Recompute the release's evidence pack from the stored runs (engineers and up)."""
    release = get_release_for_user(request, pk)
    _fields(request)
    return _answer(request, actions.refresh_evidence(release, request.user))


def _answer(request, release, status=200):
    response = JsonResponse(release_json(request, release), status=status)
    if status == 201:
        response["Location"] = request.build_absolute_uri(reverse("api_release", args=[release.pk]))
    return response


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
