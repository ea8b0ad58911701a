"""The release endpoints of API v1: the whole flow by token, and each refusal with its status."""

import copy
import json

import pytest

from deployhub.devices.models import DeviceClass
from deployhub.engines.models import Engine
from deployhub.releases.models import Release, ReleaseState
from deployhub.teams.models import Event, Role
from tests.api_calls import call, token_for
from tests.auto_builds import engine_of
from tests.compile_jobs import FINGERPRINT, build, compile_
from tests.conftest import PASSWORD, make_user
from tests.gate_evidence import benchmarked, evaluated, passed_parity, ready_engine

pytestmark = pytest.mark.django_db


@pytest.fixture
def erin(demo_team):
    """Erin builds: engineer in the demo team."""
    return make_user("erin", demo_team, Role.ENGINEER)


def post(client, user, path, body=None):
    body = json.dumps(body or {})
    return client.post(f"/api/v1/{path}", body, content_type="application/json", **token_for(user))


def get(client, user, path):
    return client.get(f"/api/v1/{path}", **token_for(user))


def proposed(client, user, engine, note="fastest within tolerance"):
    response = post(client, user, f"engines/{engine.pk}/releases", {"note": note})
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def approved(client, author, reviewer, engine):
    release = proposed(client, author, engine)
    assert post(client, author, f"releases/{release}/submit").status_code == 200
    review = {"decision": "approve", "comment": "numbers look right"}
    assert post(client, reviewer, f"releases/{release}/reviews", review).status_code == 201
    return release


def test_it_takes_a_release_to_production_and_rolls_back_the_next(
    client, version, device_class, alice, bob, vera, erin
):
    first = proposed(client, erin, ready_engine(version, device_class, "fp32"))
    answer = post(client, erin, f"releases/{first}/submit").json()
    assert answer["state"] == "in-review"

    review = {"decision": "approve", "comment": "numbers look right"}
    answer = post(client, bob, f"releases/{first}/reviews", review).json()
    assert answer["state"] == "approved"
    assert answer["approvals"] == {"count": 1, "required": 1}
    assert post(client, bob, f"releases/{first}/promote").json()["state"] == "production"

    second = approved(client, erin, bob, ready_engine(version, device_class, "int8"))
    answer = post(client, alice, f"releases/{second}/promote").json()
    assert (answer["state"], answer["replaced"]) == ("production", first)
    assert get(client, vera, f"releases/{first}").json()["state"] == "retired"

    answer = post(client, alice, f"releases/{second}/rollback", {"reason": "p99 regressed"})
    assert answer.status_code == 200
    assert answer.json()["state"] == "rolled-back"
    assert answer.json()["state_reason"] == "p99 regressed"
    restored = get(client, bob, f"releases/{first}").json()
    assert restored["state"] == "production"
    assert restored["state_reason"] == (
        f"Restored by the rollback of #{second}: p99 regressed (promote's checks passed: "
        f"engine #{restored['engine']['id']} valid, release gates open or overridden, "
        "1 of the 1 approval(s) the team requires.)"
    )

    listed = get(client, erin, f"models/{version.model_id}/releases").json()
    assert [(r["id"], r["state"]) for r in listed["items"]] == [
        (second, "rolled-back"),
        (first, "production"),
    ]
    assert listed["count"] == 2


def test_it_answers_a_release_with_its_engine_gates_and_reviews(
    client, version, device_class, alice, bob, erin
):
    engine = ready_engine(version, device_class)
    response = post(client, erin, f"engines/{engine.pk}/releases", {"note": "int8 is faster"})

    assert response.status_code == 201
    release = response.json()
    assert response["Location"] == f"http://testserver/api/v1/releases/{release['id']}"
    assert release["state"] == "draft"
    assert release["engine"] == {
        "id": engine.pk,
        "url": f"http://testserver/api/v1/engines/{engine.pk}",
        "backend": engine.backend,
        "build_config": engine.build_config,
        "sha256": engine.sha256,
    }
    assert release["model"] == {"id": version.model_id, "name": "digits-cnn"}
    assert release["version"] == {"id": version.pk, "number": version.number}
    assert release["device_class"] == device_class.slug
    assert (release["note"], release["author"], release["replaced"]) == (
        "int8 is faster",
        "erin",
        None,
    )
    assert [(g["gate"], g["status"], g["override"]) for g in release["gates"]] == [
        ("parity", "passed", None),
        ("accuracy", "passed", None),
        ("golden", "not-required", None),
        ("performance", "passed", None),
    ]
    assert all(g["reason"] for g in release["gates"]) and release["gates"][1]["run"]
    assert release["reviews"] == [] and release["approvals"] == {"count": 0, "required": 1}
    assert release["created_at"] and release["submitted_at"] is None

    post(client, erin, f"releases/{release['id']}/submit")
    post(client, bob, f"releases/{release['id']}/reviews", {"decision": "request_changes"})
    answer = get(client, alice, f"releases/{release['id']}").json()
    assert answer["state"] == "draft" and answer["submitted_at"]
    [review] = answer["reviews"]
    assert (review["reviewer"], review["decision"], review["comment"]) == (
        "bob",
        "request_changes",
        "",
    )
    assert review["at"]


def test_a_failed_gate_blocks_approval_until_an_admin_overrides_it(
    client, version, device_class, alice, bob, erin
):
    device_class.frame_budget_ms = 20.0
    device_class.save()
    engine = engine_of(version, device_class, "fp32")
    passed_parity(engine, passed=False)
    evaluated(engine, agreement=0.999)
    benchmarked(engine, p99=15.0)
    release = proposed(client, erin, engine)
    post(client, erin, f"releases/{release}/submit")

    blocked = post(client, bob, f"releases/{release}/reviews", {"decision": "approve"})
    assert blocked.status_code == 409
    assert blocked.json()["error"].startswith("Approval is blocked by the release gates: parity")

    why = {"gate": "parity", "justification": "the channel swap is done on the device"}
    assert post(client, bob, f"releases/{release}/override", why).status_code == 403
    answer = post(client, alice, f"releases/{release}/override", why)
    assert answer.status_code == 201
    parity = answer.json()["gates"][0]
    assert (parity["gate"], parity["status"]) == ("parity", "failed")
    assert parity["override"]["by"] == "alice" and parity["override"]["at"]
    assert parity["override"]["justification"] == "the channel swap is done on the device"

    answer = post(client, bob, f"releases/{release}/reviews", {"decision": "approve"})
    assert (answer.status_code, answer.json()["state"]) == (201, "approved")


def test_nobody_approves_their_own_release_by_token(client, version, device_class, alice):
    release = proposed(client, alice, ready_engine(version, device_class))
    post(client, alice, f"releases/{release}/submit")

    answer = post(client, alice, f"releases/{release}/reviews", {"decision": "approve"})

    assert answer.status_code == 403
    assert answer.json() == {"error": "Nobody reviews their own release, admins included."}
    assert not Release.objects.get(pk=release).reviews.exists()


def test_a_viewer_may_read_but_not_propose(client, version, device_class, vera, erin):
    engine = ready_engine(version, device_class)

    answer = post(client, vera, f"engines/{engine.pk}/releases", {"note": "mine"})

    assert answer.status_code == 403
    assert "engineer role" in answer.json()["error"]
    assert not Release.objects.exists()
    release = proposed(client, erin, engine)
    assert get(client, vera, f"releases/{release}").status_code == 200


def test_an_engineer_may_not_review_or_promote(client, version, device_class, alice, erin):
    release = proposed(client, alice, ready_engine(version, device_class))
    post(client, alice, f"releases/{release}/submit")

    review = post(client, erin, f"releases/{release}/reviews", {"decision": "approve"})
    promote = post(client, erin, f"releases/{release}/promote")

    assert (review.status_code, promote.status_code) == (403, 403)
    assert "reviewer role" in review.json()["error"]


def test_it_refuses_a_step_out_of_order_with_409_and_the_rule(
    client, version, device_class, alice, erin
):
    release = proposed(client, erin, ready_engine(version, device_class))

    answer = post(client, alice, f"releases/{release}/promote")

    assert answer.status_code == 409
    assert answer.json() == {
        "error": f"Release #{release} is draft: only a release approved can be promoted."
    }
    assert Release.objects.get(pk=release).state == ReleaseState.DRAFT
    rollback = post(client, alice, f"releases/{release}/rollback", {"reason": "bad"})
    assert rollback.status_code == 409 and "can be rolled back" in rollback.json()["error"]


def test_it_proposes_only_for_the_engines_own_class(client, version, device_class, erin):
    engine = ready_engine(version, device_class)

    answer = post(client, erin, f"engines/{engine.pk}/releases", {"device_class": "gpu-a100"})

    assert answer.status_code == 409
    assert answer.json()["error"] == (
        f"Engine #{engine.pk} is built for {device_class.slug!r}: a release is for its "
        "engine's own device class, not 'gpu-a100'."
    )
    assert not Release.objects.exists()
    same = {"device_class": device_class.slug, "note": "ok"}
    assert post(client, erin, f"engines/{engine.pk}/releases", same).status_code == 201


def test_it_lists_the_teams_releases_filtered_by_class_and_state(
    client, demo_team, version, device_class, alice, erin, charlie
):
    other_class = DeviceClass.objects.create(team=demo_team, slug="edge-gpu", name="Edge GPU")
    on_class = proposed(client, erin, ready_engine(version, device_class))
    submitted = proposed(client, erin, ready_engine(version, device_class, "int8"))
    post(client, erin, f"releases/{submitted}/submit")
    elsewhere = proposed(client, erin, ready_engine(version, other_class))

    def listed(query=""):
        body = get(client, alice, f"releases{query}").json()
        return [release["id"] for release in body["items"]], body["count"]

    assert listed() == ([elsewhere, submitted, on_class], 3)
    assert listed(f"?device_class={device_class.slug}") == ([submitted, on_class], 2)
    assert listed("?state=in-review") == ([submitted], 1)
    assert listed("?device_class=edge-gpu&state=draft") == ([elsewhere], 1)
    assert listed("?limit=1&offset=1") == ([submitted], 3)
    assert get(client, charlie, "releases").json() == {"items": [], "count": 0}
    pipeline = client.get("/api/v1/releases", **token_for(erin, scope="pipeline"))
    assert pipeline.status_code == 200 and pipeline.json()["count"] == 3


@pytest.mark.parametrize(
    "query, field",
    [("?state=live", "'state'"), ("?limit=0", "'limit'"), ("?offset=-1", "'offset'")],
)
def test_it_refuses_a_bad_release_filter_with_400(client, alice, query, field):
    answer = get(client, alice, f"releases{query}")

    assert answer.status_code == 400 and answer.json()["error"].startswith(field)


def test_another_team_sees_no_release(client, version, device_class, erin, charlie):
    engine = ready_engine(version, device_class)
    release = proposed(client, erin, engine)

    answers = [
        get(client, charlie, f"releases/{release}"),
        get(client, charlie, f"models/{version.model_id}/releases"),
        post(client, charlie, f"engines/{engine.pk}/releases"),
        post(client, charlie, f"releases/{release}/submit"),
        post(client, charlie, f"releases/{release}/reviews", {"decision": "approve"}),
        post(client, charlie, f"releases/{release}/promote"),
        post(client, charlie, f"releases/{release}/rollback", {"reason": "no"}),
        post(client, charlie, f"releases/{release}/override", {"gate": "x", "justification": "y"}),
    ]

    assert {(a.status_code, a.json()["error"]) for a in answers} == {(404, "Not found.")}
    assert Release.objects.get(pk=release).state == ReleaseState.DRAFT


@pytest.mark.parametrize(
    "path, body, message",
    [
        ("submit", "{not json", "The body is not valid JSON"),
        ("submit", "[]", "The body must be a JSON object."),
        ("submit", '{"force": true}', "Unknown field 'force'."),
        ("reviews", "{}", "Say 'decision'"),
        ("reviews", '{"decision": 1}', "'decision': Input should be 'approve', 'request_changes'"),
        ("reviews", '{"decision": "lgtm"}', "'decision': Input should be 'approve', 'request_"),
        ("reviews", '{"decision": "approve", "comment": ["ok"]}', "'comment': Input should be a"),
        ("promote", '{"force": true}', "Unknown field 'force'."),
        ("override", '{"gate": " ", "justification": "j"}', "Say 'gate'"),
        ("rollback", '{"reason": "  "}', "Say 'reason'"),
        ("override", '{"gate": "parity"}', "Say 'justification'"),
    ],
)
def test_it_answers_a_malformed_body_with_400(
    client, version, device_class, alice, erin, path, body, message
):
    release = proposed(client, erin, ready_engine(version, device_class))
    before = Release.objects.get(pk=release).state

    answer = client.post(
        f"/api/v1/releases/{release}/{path}",
        body,
        content_type="application/json",
        **token_for(alice),
    )

    assert answer.status_code == 400
    assert answer.json()["error"].startswith(message)
    assert Release.objects.get(pk=release).state == before


def test_it_answers_a_malformed_proposal_with_400(client, version, device_class, erin):
    engine = ready_engine(version, device_class)

    answers = [
        post(client, erin, f"engines/{engine.pk}/releases", {"note": 42}),
        post(client, erin, f"engines/{engine.pk}/releases", {"engine": 1}),
    ]

    assert [a.status_code for a in answers] == [400, 400]
    assert answers[0].json() == {"error": "'note': Input should be a valid string."}
    assert answers[1].json() == {"error": "Unknown field 'engine'."}
    assert not Release.objects.exists()


def test_it_needs_a_personal_token(client, version, device_class, erin):
    release = proposed(client, erin, ready_engine(version, device_class))

    assert client.get(f"/api/v1/releases/{release}").status_code == 401
    assert client.post(f"/api/v1/releases/{release}/submit").status_code == 401


def test_a_pipeline_token_requests_a_release_but_never_decides_one(
    client, version, device_class, alice, erin, bob
):
    engine = ready_engine(version, device_class)
    pipeline = token_for(alice, scope="pipeline")  # an admin's, and still only a pipeline's
    response = client.post(
        f"/api/v1/engines/{engine.pk}/releases",
        json.dumps({"note": "from CI"}),
        content_type="application/json",
        **pipeline,
    )
    assert response.status_code == 201
    release = response.json()["id"]
    submitted = client.post(
        f"/api/v1/releases/{release}/submit", "{}", content_type="application/json", **pipeline
    )
    assert submitted.status_code == 200

    for action, body in (
        ("reviews", {"decision": "approve"}),
        ("override", {"gate": "parity", "justification": "x"}),
        ("promote", {}),
        ("rollback", {"reason": "x"}),
    ):
        response = client.post(
            f"/api/v1/releases/{release}/{action}",
            json.dumps(body),
            content_type="application/json",
            **token_for(bob, scope="pipeline"),
        )
        assert response.status_code == 403, action
        assert "need a full token" in response.json()["error"]
    assert Release.objects.get().state == ReleaseState.IN_REVIEW


def quorum_raised(client, admin, approvals):
    """The team's admin raises the approvals a release needs, on the team settings page."""
    client.login(username=admin.username, password=PASSWORD)
    assert client.post("/team/settings/", {"approvals_required": approvals}).status_code == 302
    client.logout()


def test_it_applies_a_quorum_raised_after_approval_at_promote(
    client, demo_team, version, device_class, alice, bob, erin
):
    release = approved(client, erin, bob, ready_engine(version, device_class))
    quorum_raised(client, alice, 3)

    answer = post(client, bob, f"releases/{release}/promote")

    assert answer.status_code == 409
    assert answer.json()["error"] == (
        f"Release #{release} went back to review instead of being promoted: "
        "The team now requires 3 approval(s) and it has 1: 2 more needed."
    )
    state = get(client, bob, f"releases/{release}").json()
    assert (state["state"], state["approvals"]) == ("in-review", {"count": 1, "required": 3})
    rita = make_user("rita", demo_team, Role.REVIEWER)
    post(client, rita, f"releases/{release}/reviews", {"decision": "approve"})
    answer = post(client, alice, f"releases/{release}/reviews", {"decision": "approve"})
    assert answer.json()["state"] == "approved"  # bob's approval still counts
    answer = post(client, bob, f"releases/{release}/promote").json()
    assert (answer["state"], answer["approvals"]) == ("production", {"count": 3, "required": 3})


def test_a_rollback_refuses_to_restore_an_engine_that_went_stale(
    client, version, device_class, make_device, alice, bob, erin
):
    # Production runs an engine built on the class's device; the device then upgrades
    # ONNX Runtime (the engine turns stale) and a build for it is promoted in its place.
    _, token = make_device("line-1")
    build(client, compile_(version, device_class, alice)[1], token)
    first_engine = Engine.objects.get()
    passed_parity(first_engine)
    evaluated(first_engine, agreement=0.999)
    benchmarked(first_engine, p99=15.0)
    first = approved(client, erin, bob, first_engine)
    assert post(client, bob, f"releases/{first}/promote").json()["state"] == "production"
    upgraded = copy.deepcopy(FINGERPRINT)
    upgraded["onnxruntime"]["version"] = "1.33.0"
    call(client, token, "device/heartbeat", {"fingerprint": upgraded})
    assert get(client, bob, f"engines/{first_engine.pk}").json()["status"] == "stale"
    second = approved(client, erin, bob, ready_engine(version, device_class, "int8"))
    post(client, bob, f"releases/{second}/promote")

    answer = post(client, alice, f"releases/{second}/rollback", {"reason": "p99 regressed"})

    assert answer.status_code == 409
    assert answer.json()["error"] == (
        f"Not rolled back: the release it would restore, #{first}, fails promote's checks: "
        "its engine turned stale after approval. Propose and promote a release that passes "
        "them instead."
    )
    assert get(client, bob, f"releases/{second}").json()["state"] == "production"
    assert get(client, bob, f"releases/{first}").json()["state"] == "retired"
    assert not Event.objects.filter(verb__in=["release.rolled_back", "release.restored"])
