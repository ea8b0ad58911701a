"""The 404, 403 and 500 pages: in the site's frame, with a reason and a way back, with DEBUG off."""

import pytest
from django.test import override_settings

from deployhub.registry.models import Model
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


@override_settings(DEBUG=False)
def test_it_shows_a_framed_404_with_navigation_to_a_logged_in_user(client, alice):
    client.login(username="alice", password=PASSWORD)

    response = client.get("/models/999999/")

    assert response.status_code == 404
    page = response.content.decode()
    assert 'class="topbar"' in page and 'href="/models/"' in page and 'href="/jobs/"' in page
    assert "Page not found" in page and 'id="back-link"' in page
    assert "Demo" in page  # the header still names the team


@override_settings(DEBUG=False)
def test_it_shows_a_framed_404_to_an_anonymous_visitor_with_a_way_to_log_in(client, db):
    response = client.get("/no-such-page/")

    assert response.status_code == 404
    page = response.content.decode()
    assert 'class="topbar"' in page and "Page not found" in page
    assert 'href="/login/?next=/no-such-page/"' in page


@override_settings(DEBUG=False)
def test_it_says_why_an_action_is_refused_on_a_framed_403(client, vera, demo_team):
    model = Model.objects.create(team=demo_team, name="m", created_by=vera)
    client.login(username="vera", password=PASSWORD)

    response = client.post(f"/models/{model.pk}/", {"notes": "x"})

    assert response.status_code == 403
    page = response.content.decode()
    assert 'class="topbar"' in page and "Not allowed" in page
    assert "This needs the engineer role in Demo." in page
    assert "You are viewer in Demo" in page and 'href="/models/"' in page


@override_settings(DEBUG=False)
def test_it_renders_the_500_page_in_the_frame_without_a_request_context(client, db):
    from django.views.defaults import server_error

    response = server_error(client.get("/login/").wsgi_request)

    page = response.content.decode()
    assert response.status_code == 500
    assert 'class="topbar"' in page and "Something went wrong" in page and 'id="back-link"' in page
