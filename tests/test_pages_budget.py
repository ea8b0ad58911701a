"""The budget calculator goes both ways (fps to ms, ms to fps) and compares two builds."""

import pytest

from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def logged_in(client, alice):
    client.login(username="alice", password=PASSWORD)
    return client


def test_it_takes_a_budget_in_ms_as_well_as_a_frame_rate(logged_in, device_class):
    url = device_class.get_absolute_url()

    from_ms = logged_in.get(url, {"ms": 20}).content.decode()
    from_fps = logged_in.get(url, {"fps": 50}).content.decode()

    assert 'id="budget-ms">20.00 ms</strong>' in from_ms and 'id="budget-ms">20.00 ms' in from_fps


def test_it_refuses_an_empty_calculator_with_a_reason(logged_in, device_class):
    response = logged_in.get(device_class.get_absolute_url(), {"fps": "", "ms": ""})

    assert response.status_code == 400
    assert "Give a target fps or a budget in ms per frame." in response.content.decode()


def test_it_shows_the_ratio_of_two_builds_throughput(logged_in, device_class):
    url = device_class.get_absolute_url()

    example = logged_in.get(url).content.decode()
    query = {"batch_a": 4, "ms_a": 10, "batch_b": 1, "ms_b": 20}
    asked = logged_in.get(url, query).content.decode()

    assert "batch 8 at 25 ms = <strong>320.0 img/s</strong>, <strong>11.2×</strong>" in example
    assert "a 35 ms build at batch 1 (28.6 img/s)" in example
    assert "<strong>400.0 img/s</strong>, <strong>8.0×</strong>" in asked
