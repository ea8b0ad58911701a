"""Who may do what to a release: every actor × every action, in the browser's pages and the API.

Actors: anonymous, a viewer, an engineer, a reviewer, an admin, an admin's
pipeline-scoped token (API only), another team's admin. Each cell sets up the
state the action needs, acts, and checks the answer and whether the release moved.
"""

import json

import pytest

from deployhub.releases import actions
from deployhub.releases.models import Release, ReleaseState
from deployhub.teams.models import Role
from tests.api_calls import token_for
from tests.auto_builds import engine_of
from tests.conftest import PASSWORD, make_user
from tests.gate_evidence import benchmarked, evaluated, ready_engine

pytestmark = pytest.mark.django_db

ACTORS = ("anonymous", "vera", "erin", "bob", "alice", "pipeline", "charlie")
OK, DENIED, HIDDEN = "ok", "403", "404"
# The expected answer of each action for each actor (anonymous and pipeline: see below).
MATRIX = {
    "view": {"vera": OK, "erin": OK, "bob": OK, "alice": OK, "pipeline": OK},
    "propose": {"vera": DENIED, "erin": OK, "bob": OK, "alice": OK, "pipeline": OK},
    "submit": {"vera": DENIED, "erin": OK, "bob": OK, "alice": OK, "pipeline": OK},
    "evidence": {"vera": DENIED, "erin": OK, "bob": OK, "alice": OK, "pipeline": OK},
    "approve": {"vera": DENIED, "erin": DENIED, "bob": OK, "alice": OK, "pipeline": DENIED},
    "request_changes": {"vera": DENIED, "erin": DENIED, "bob": OK, "alice": OK, "pipeline": DENIED},
    "reject": {"vera": DENIED, "erin": DENIED, "bob": OK, "alice": OK, "pipeline": DENIED},
    "override": {"vera": DENIED, "erin": DENIED, "bob": DENIED, "alice": OK, "pipeline": DENIED},
    "promote": {"vera": DENIED, "erin": DENIED, "bob": OK, "alice": OK, "pipeline": DENIED},
    "rollback": {"vera": DENIED, "erin": DENIED, "bob": OK, "alice": OK, "pipeline": DENIED},
}


@pytest.fixture
def people(demo_team, alice, bob, vera, charlie):
    return {
        "alice": alice,
        "bob": bob,
        "vera": vera,
        "charlie": charlie,
        "erin": make_user("erin", demo_team, Role.ENGINEER),
        "rita": make_user("rita", demo_team, Role.REVIEWER),
    }


def released(version, device_class, people, state, engine=None):
    """A release by erin, taken to `state` by rita (reviewer) where it needs a decision."""
    engine = engine or ready_engine(version, device_class)
    release = actions.propose(engine, people["erin"], "candidate")
    if state == ReleaseState.DRAFT:
        return release
    actions.submit(release, people["erin"])
    if state == ReleaseState.IN_REVIEW:
        return release
    actions.review(release, people["rita"], "approve")
    if state == ReleaseState.APPROVED:
        return release
    return actions.promote(release, people["rita"])


def setup(action, version, device_class, people):
    """Return (the path the action posts to or reads, the API body, a check that it happened)."""
    if action == "propose":
        engine = ready_engine(version, device_class)
        return (
            (f"/engines/{engine.pk}/propose", f"/api/v1/engines/{engine.pk}/releases"),
            {"note": "x"},
            lambda: Release.objects.filter(engine=engine).exists(),
        )
    if action == "override":
        device_class.frame_budget_ms = 20.0
        device_class.save()
        engine = engine_of(version, device_class, "no-parity")
        evaluated(engine, agreement=0.999)
        benchmarked(engine, p99=15.0)
        release = released(version, device_class, people, ReleaseState.IN_REVIEW, engine)
        return (
            paths(release, "override"),
            {"gate": "parity", "justification": "why"},
            (lambda: release.overrides.exists()),
        )
    if action == "rollback":
        released(version, device_class, people, ReleaseState.PRODUCTION)
        second = ready_engine(version, device_class, "second")
        release = released(version, device_class, people, ReleaseState.PRODUCTION, second)
        return paths(release, "rollback"), {"reason": "regressed"}, state_is(release, "rolled-back")
    if action == "evidence":
        release = released(version, device_class, people, ReleaseState.IN_REVIEW)
        refreshed = release.team.events.filter(verb="release.evidence_refreshed")
        return paths(release, action), {}, refreshed.exists
    start, after, body = {
        "view": (ReleaseState.DRAFT, ReleaseState.DRAFT, None),
        "submit": (ReleaseState.DRAFT, ReleaseState.IN_REVIEW, {}),
        "approve": (ReleaseState.IN_REVIEW, ReleaseState.APPROVED, {"decision": "approve"}),
        "request_changes": (
            ReleaseState.IN_REVIEW,
            ReleaseState.DRAFT,
            {"decision": "request_changes", "comment": "more data"},
        ),
        "reject": (ReleaseState.IN_REVIEW, ReleaseState.REJECTED, {"decision": "reject"}),
        "promote": (ReleaseState.APPROVED, ReleaseState.PRODUCTION, {}),
    }[action]
    release = released(version, device_class, people, start)
    return paths(release, action), body, state_is(release, after)


def paths(release, action):
    if action == "view":
        return f"/releases/{release.pk}/", f"/api/v1/releases/{release.pk}"
    api = {"approve": "reviews", "request_changes": "reviews", "reject": "reviews"}
    page = {"approve": "review", "request_changes": "review", "reject": "review"}
    api, page = api.get(action, action), page.get(action, action)
    return f"/releases/{release.pk}/{page}", f"/api/v1/releases/{release.pk}/{api}"


def state_is(release, state):
    return lambda: Release.objects.get(pk=release.pk).state == state


def act_on_page(client, actor, people, path, body, action):
    if actor != "anonymous":
        client.login(username=actor, password=PASSWORD)
    if action == "view":
        return client.get(path)
    return client.post(path, body or {})


def act_by_api(client, actor, people, path, body, action):
    headers = {}
    if actor == "pipeline":
        headers = token_for(people["alice"], scope="pipeline")
    elif actor != "anonymous":
        headers = token_for(people[actor])
    if action == "view":
        return client.get(path, **headers)
    return client.post(path, json.dumps(body or {}), content_type="application/json", **headers)


CELLS = [
    pytest.param(action, actor, channel, id=f"{action}-{actor}-{channel}")
    for action in MATRIX
    for actor in ACTORS
    for channel in ("page", "api")
    if not (actor == "pipeline" and channel == "page")
]


@pytest.mark.parametrize(("action", "actor", "channel"), CELLS)
def test_each_actor_may_do_what_its_role_allows_and_nothing_more(
    client, version, device_class, people, action, actor, channel
):
    (page_path, api_path), body, happened = setup(action, version, device_class, people)
    act = act_on_page if channel == "page" else act_by_api
    path = page_path if channel == "page" else api_path

    response = act(client, actor, people, path, body, action)

    if actor == "anonymous":
        expected = 302 if channel == "page" else 401
        assert response.status_code == expected
        if channel == "page":
            assert response["Location"].startswith("/login/")
    elif actor == "charlie":
        assert response.status_code == 404
    elif MATRIX[action][actor] == DENIED:
        assert response.status_code == 403, response.content[:300]
    else:
        assert response.status_code in (200, 201, 302), response.content[:300]
    allowed = MATRIX[action].get(actor) == OK
    if action == "view":  # reading changes nothing: the answer shows the release or not
        assert ("draft" in response.content.decode()) == allowed
    else:
        assert happened() == allowed, "the release moved as it should"
