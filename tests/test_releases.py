"""Releases: propose, review, promote and roll back an engine, with its gates and an audit trail."""

import pytest
from django.core.exceptions import PermissionDenied

from deployhub.engines.models import EngineStatus
from deployhub.releases import actions
from deployhub.releases.actions import ReleaseRefused
from deployhub.releases.models import Release, ReleaseState
from deployhub.teams.models import Event, Role
from tests.auto_builds import engine_of
from tests.conftest import PASSWORD, make_user
from tests.gate_evidence import benchmarked, evaluated, ready_engine

pytestmark = pytest.mark.django_db


@pytest.fixture
def erin(demo_team):
    """Erin builds: engineer in the demo team."""
    return make_user("erin", demo_team, Role.ENGINEER)


@pytest.fixture
def rita(demo_team):
    """Rita is a second reviewer."""
    return make_user("rita", demo_team, Role.REVIEWER)


def in_review(engine, author):
    release = actions.propose(engine, author, "fastest within tolerance")
    return actions.submit(release, author)


def test_an_engineer_proposes_and_a_reviewer_approves_then_it_is_promoted(
    version, device_class, erin, bob
):
    release = in_review(ready_engine(version, device_class), erin)
    assert release.state == ReleaseState.IN_REVIEW

    actions.review(release, bob, "approve", "numbers look right")
    assert release.state == ReleaseState.APPROVED
    actions.promote(release, bob)

    release.refresh_from_db()
    assert release.state == ReleaseState.PRODUCTION and release.promoted_at
    assert actions.production_of(release.model, device_class) == release
    verbs = list(
        Event.objects.filter(target_type="release", target_id=release.pk)
        .order_by("id")
        .values_list("verb", "data__before", "data__after")
    )
    assert verbs == [
        ("release.proposed", None, "draft"),
        ("release.submitted", "draft", "in-review"),
        ("release.review.approve", "in-review", "in-review"),
        ("release.approved", "in-review", "approved"),
        ("release.promoted", "approved", "production"),
    ]


def test_nobody_approves_their_own_release_admins_included(version, device_class, alice, bob):
    release = in_review(ready_engine(version, device_class), alice)

    with pytest.raises(PermissionDenied, match="Nobody reviews their own release"):
        actions.review(release, alice, "approve")

    release.refresh_from_db()
    assert release.state == ReleaseState.IN_REVIEW and not release.reviews.exists()


def test_roles_decide_who_proposes_reviews_and_promotes(version, device_class, erin, vera, bob):
    engine = ready_engine(version, device_class)
    with pytest.raises(PermissionDenied, match="engineer role"):
        actions.propose(engine, vera)
    release = in_review(engine, erin)
    with pytest.raises(PermissionDenied, match="reviewer role"):
        actions.review(release, erin, "approve")
    actions.review(release, bob, "approve")
    with pytest.raises(PermissionDenied, match="reviewer role"):
        actions.promote(release, erin)
    assert Release.objects.get().state == ReleaseState.APPROVED


def test_the_team_decides_how_many_approvals_a_release_needs(
    version, device_class, demo_team, erin, bob, rita
):
    demo_team.approvals_required = 2
    demo_team.save()
    release = in_review(ready_engine(version, device_class), erin)

    actions.review(release, bob, "approve")
    actions.review(release, bob, "approve")  # the same reviewer twice counts once
    assert release.state == ReleaseState.IN_REVIEW
    actions.review(release, rita, "approve")
    assert release.state == ReleaseState.APPROVED


def test_a_failing_gate_blocks_approval_until_an_admin_overrides_it_in_writing(
    version, device_class, erin, bob, alice
):
    device_class.frame_budget_ms = 20.0
    device_class.save()
    engine = engine_of(version, device_class, "fp32")
    evaluated(engine, agreement=0.999)
    benchmarked(engine, p99=15.0)  # no parity run: the parity gate is missing
    release = in_review(engine, erin)

    with pytest.raises(ReleaseRefused, match=r"blocked by the release gates: parity \(missing\)"):
        actions.review(release, bob, "approve")
    with pytest.raises(PermissionDenied, match="admin role"):
        actions.override_gate(release, bob, "parity", "trust me")
    with pytest.raises(ReleaseRefused, match="needs a written justification"):
        actions.override_gate(release, alice, "parity", "  ")
    with pytest.raises(ReleaseRefused, match="open or overridden already"):
        actions.override_gate(release, alice, "accuracy", "why not")
    actions.override_gate(release, alice, "parity", "Spec unchanged since v1's parity run.")
    with pytest.raises(ReleaseRefused, match="open or overridden already"):
        actions.override_gate(release, alice, "parity", "again")  # one override per gate
    actions.review(release, bob, "approve")

    assert release.state == ReleaseState.APPROVED
    override = release.overrides.get()
    assert (override.gate, override.by) == ("parity", alice)
    event = Event.objects.get(verb="release.gate_overridden")
    assert event.data["justification"] == "Spec unchanged since v1's parity run."


def test_promoting_retires_the_current_production_and_rollback_restores_it(
    version, device_class, erin, bob
):
    first = in_review(ready_engine(version, device_class, "fp32"), erin)
    actions.review(first, bob, "approve")
    actions.promote(first, bob)
    second = in_review(ready_engine(version, device_class, "int8"), erin)
    actions.review(second, bob, "approve")
    actions.promote(second, bob)

    first.refresh_from_db()
    assert first.state == ReleaseState.RETIRED and second.replaced == first
    assert actions.production_of(second.model, device_class) == second

    with pytest.raises(ReleaseRefused, match="needs a reason"):
        actions.rollback(second, bob, "")
    actions.rollback(second, bob, "p99 regressed on the line")

    first.refresh_from_db()
    second.refresh_from_db()
    assert second.state == ReleaseState.ROLLED_BACK
    assert first.state == ReleaseState.PRODUCTION
    assert "p99 regressed on the line" in first.state_reason
    assert Release.objects.filter(state=ReleaseState.PRODUCTION).count() == 1


def test_a_first_production_release_has_nothing_to_roll_back_to(version, device_class, erin, bob):
    release = in_review(ready_engine(version, device_class), erin)
    actions.review(release, bob, "approve")
    actions.promote(release, bob)

    with pytest.raises(ReleaseRefused, match="no previous production release"):
        actions.rollback(release, bob, "bad")
    assert Release.objects.get().state == ReleaseState.PRODUCTION


def test_a_rollback_never_restores_a_revoked_engine(version, device_class, erin, bob):
    first = in_review(ready_engine(version, device_class, "fp32"), erin)
    actions.review(first, bob, "approve")
    actions.promote(first, bob)
    second = in_review(ready_engine(version, device_class, "int8"), erin)
    actions.review(second, bob, "approve")
    actions.promote(second, bob)
    first.engine.status = EngineStatus.REVOKED
    first.engine.save()

    with pytest.raises(ReleaseRefused, match="fails promote's checks: its engine turned revoked"):
        actions.rollback(second, bob, "p99 regressed")

    second.refresh_from_db()
    assert second.state == ReleaseState.PRODUCTION
    assert Release.objects.get(pk=first.pk).state == ReleaseState.RETIRED


def test_a_submit_that_fails_leaves_the_release_a_draft(version, device_class, erin, monkeypatch):
    release = actions.propose(ready_engine(version, device_class), erin, "candidate")

    def broken(release):
        raise RuntimeError("storage full")

    monkeypatch.setattr(actions.evidence, "store", broken)
    with pytest.raises(RuntimeError):
        actions.submit(release, erin)

    assert Release.objects.get(pk=release.pk).state == ReleaseState.DRAFT
    assert not Event.objects.filter(verb="release.submitted").exists()


def test_changes_requested_send_it_back_to_draft_and_a_rejection_ends_it(
    version, device_class, erin, bob
):
    release = in_review(ready_engine(version, device_class), erin)
    actions.review(release, bob, "request_changes", "evaluate on the validation set")
    assert release.state == ReleaseState.DRAFT
    actions.submit(release, erin)
    actions.review(release, bob, "reject", "wrong class")

    assert release.state == ReleaseState.REJECTED
    with pytest.raises(ReleaseRefused, match="only a release in review can be reviewed"):
        actions.review(release, bob, "approve")
    with pytest.raises(ReleaseRefused, match="only a release approved can be promoted"):
        actions.promote(release, bob)


def test_an_approved_release_whose_engine_turns_stale_goes_back_to_review(
    version, device_class, erin, bob
):
    release = in_review(ready_engine(version, device_class), erin)
    actions.review(release, bob, "approve")
    release.engine.status = EngineStatus.STALE
    release.engine.save()

    with pytest.raises(ReleaseRefused, match="went back to review instead of being promoted"):
        actions.promote(release, bob)
    release.refresh_from_db()
    assert release.state == ReleaseState.IN_REVIEW
    assert release.state_reason == "Its engine turned stale after approval."
    assert actions.approvals(release) == []  # the earlier approval no longer counts


def test_in_the_browser_pages_alice_proposes_bob_approves_alice_promotes(
    client, version, device_class, alice, bob
):
    engine = ready_engine(version, device_class)
    client.login(username="alice", password=PASSWORD)
    page = client.get(engine.get_absolute_url()).content.decode()
    assert 'id="propose-form"' in page and "ready to propose" in page

    response = client.post(f"/engines/{engine.pk}/propose", {"note": "best build"})
    release = Release.objects.get()
    assert response["Location"] == release.get_absolute_url()
    client.post(f"/releases/{release.pk}/submit")
    page = client.get(release.get_absolute_url()).content.decode()
    assert 'data-state="in-review"' in page and "another reviewer decides" in page
    assert client.post(f"/releases/{release.pk}/review", {"decision": "approve"}).status_code == 403

    client.logout()
    client.login(username="bob", password=PASSWORD)
    client.post(f"/releases/{release.pk}/review", {"decision": "approve", "comment": "ok"})
    client.logout()
    client.login(username="alice", password=PASSWORD)
    client.post(f"/releases/{release.pk}/promote")

    page = client.get(release.get_absolute_url()).content.decode()
    assert 'data-state="production"' in page and "ok" in page
    engine_page = client.get(engine.get_absolute_url()).content.decode()
    assert f'href="{release.get_absolute_url()}"' in engine_page and "Production" in engine_page


def quorum_raised(client, admin, approvals):
    """The team's admin raises the approvals a release needs, on the team settings page."""
    client.login(username=admin.username, password=PASSWORD)
    assert client.post("/team/settings/", {"approvals_required": approvals}).status_code == 302
    client.logout()


def in_production(engine, author, reviewer):
    release = in_review(engine, author)
    actions.review(release, reviewer, "approve")
    return actions.promote(release, reviewer)


def test_the_promote_button_applies_a_quorum_raised_after_approval(
    client, version, device_class, alice, bob, erin
):
    release = in_review(ready_engine(version, device_class), erin)
    actions.review(release, bob, "approve")
    quorum_raised(client, alice, 2)
    client.login(username="bob", password=PASSWORD)

    page = client.post(f"/releases/{release.pk}/promote", follow=True).content.decode()

    assert f"Release #{release.pk} went back to review instead of being promoted" in page
    assert "The team now requires 2 approval(s) and it has 1: 1 more needed." in page
    assert "1 of 2 approvals needed" in page
    release.refresh_from_db()
    assert release.state == ReleaseState.IN_REVIEW and not release.promoted_at


def test_the_rollback_button_applies_promotes_checks_and_says_so(
    client, version, device_class, alice, bob, erin
):
    first = in_production(ready_engine(version, device_class, "fp32"), erin, bob)
    second = in_production(ready_engine(version, device_class, "int8"), erin, bob)
    client.login(username="bob", password=PASSWORD)

    page = client.post(
        f"/releases/{second.pk}/rollback", {"reason": "p99 regressed"}, follow=True
    ).content.decode()

    assert "Rolled back: the release it restored passed promote&#x27;s checks" in page
    assert Release.objects.get(pk=first.pk).state == ReleaseState.PRODUCTION
    restored = Event.objects.get(verb="release.restored")
    assert restored.data["checks"] == (
        f"promote's checks passed: engine #{first.engine_id} valid, release gates open or "
        "overridden, 1 of the 1 approval(s) the team requires"
    )
    audit = client.get("/team/audit/?verb=release.restored").content.decode()
    assert "promote&#x27;s checks passed" in audit


def test_the_rollback_button_refuses_a_release_short_of_the_quorum_in_force(
    client, version, device_class, alice, bob, erin
):
    first = in_production(ready_engine(version, device_class, "fp32"), erin, bob)
    second = in_production(ready_engine(version, device_class, "int8"), erin, bob)
    quorum_raised(client, alice, 2)
    client.login(username="bob", password=PASSWORD)

    page = client.post(
        f"/releases/{second.pk}/rollback", {"reason": "p99 regressed"}, follow=True
    ).content.decode()

    assert (
        f"Not rolled back: the release it would restore, #{first.pk}, fails promote&#x27;s "
        "checks: the team now requires 2 approval(s) and it has 1: 1 more needed." in page
    )
    assert Release.objects.get(pk=second.pk).state == ReleaseState.PRODUCTION
    assert Release.objects.get(pk=first.pk).state == ReleaseState.RETIRED


def test_a_refusal_is_said_on_the_page_and_changes_nothing(
    client, version, device_class, erin, bob
):
    release = in_review(ready_engine(version, device_class), erin)
    client.login(username="bob", password=PASSWORD)

    response = client.post(f"/releases/{release.pk}/promote", follow=True)

    assert "only a release approved can be promoted" in response.content.decode()
    release.refresh_from_db()
    assert release.state == ReleaseState.IN_REVIEW


def test_other_teams_see_nothing(client, version, device_class, erin, charlie):
    release = in_review(ready_engine(version, device_class), erin)
    client.login(username="charlie", password=PASSWORD)

    assert client.get(release.get_absolute_url()).status_code == 404
    assert client.post(f"/releases/{release.pk}/promote").status_code == 404
    assert client.post(f"/engines/{release.engine.pk}/propose").status_code == 404


def test_reviewers_hear_of_a_release_in_review_and_its_author_of_each_decision(
    version, device_class, erin, bob, alice, mailoutbox, django_capture_on_commit_callbacks
):
    for user, address in ((erin, "erin@example.com"), (bob, "bob@example.com")):
        user.email = address
        user.save()
    alice.email = "alice@example.com"
    alice.save()
    release = actions.propose(ready_engine(version, device_class), erin, "please look")

    with django_capture_on_commit_callbacks(execute=True):
        actions.submit(release, erin)
    assert len(mailoutbox) == 1
    assert sorted(mailoutbox[0].to) == ["alice@example.com", "bob@example.com"]
    assert f"Review release #{release.pk}" in mailoutbox[0].subject
    assert f"http://127.0.0.1:8000/releases/{release.pk}/" in mailoutbox[0].body

    with django_capture_on_commit_callbacks(execute=True):
        actions.review(release, bob, "request_changes", "evaluate on real images")
    assert mailoutbox[1].to == ["erin@example.com"]
    assert "request changes" in mailoutbox[1].subject and "evaluate on real images" in (
        mailoutbox[1].body
    )
