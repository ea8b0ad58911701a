"""The header's team switcher: a user in several teams picks the one they work in."""

import pytest

from deployhub.registry.models import Model
from deployhub.teams.models import Membership, Role, Team
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme(alice):
    """Alice is also a viewer in Orbit, which has a model of its own."""
    team = Team.objects.create(name="Orbit Vision", slug="orbit")
    Membership.objects.create(user=alice, team=team, role=Role.VIEWER)
    Model.objects.create(team=team, name="orbit-detector", created_by=alice)
    return team


@pytest.fixture
def logged_in(client, alice):
    client.login(username="alice", password=PASSWORD)
    return client


def test_it_offers_every_team_of_the_user_in_the_header(logged_in, acme, demo_team):
    page = logged_in.get("/models/").content.decode()

    assert 'id="team-switcher"' in page
    assert f'<option value="{acme.pk}" >Orbit Vision</option>' in page
    assert f'<option value="{demo_team.pk}" selected>Demo</option>' in page


def test_it_switches_team_and_stays_on_the_same_list_page(logged_in, acme):
    response = logged_in.post("/team/", {"team": acme.pk, "next": "/jobs/?state=failed"})

    assert response.status_code == 302 and response["Location"] == "/jobs/?state=failed"
    page = logged_in.get("/models/").content.decode()
    assert "orbit-detector" in page and "You are working in Orbit Vision now." in page
    assert "admin" not in page.split('class="user"')[1][:80]  # the role shown is Orbit's: viewer


def test_it_goes_to_the_models_list_from_an_object_of_the_old_team(logged_in, acme, demo_team):
    model = Model.objects.create(team=demo_team, name="demo-model")

    response = logged_in.post("/team/", {"team": acme.pk, "next": f"/models/{model.pk}/"})

    assert response["Location"] == "/models/"


def test_it_refuses_an_outside_next_and_a_team_the_user_is_not_in(logged_in, acme, charlie):
    outside = logged_in.post("/team/", {"team": acme.pk, "next": "https://example.com/jobs/"})
    other_team = charlie.memberships.get().team
    refused = logged_in.post("/team/", {"team": other_team.pk, "next": "/jobs/"})

    not_a_team = logged_in.post("/team/", {"team": "abc", "next": "/jobs/"})

    assert outside["Location"] == "/models/"
    assert refused.status_code == 404 and not_a_team.status_code == 404
    assert logged_in.session["team_id"] == acme.pk


def test_it_names_the_only_team_of_a_single_team_user_without_a_switcher(client, vera):
    client.login(username="vera", password=PASSWORD)

    page = client.get("/models/").content.decode()

    assert 'id="team-switcher"' not in page
    assert 'class="team" href="/team/settings/"' in page
