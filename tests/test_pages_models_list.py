"""The Models list: search by name and description, filter by format and tag, all in the URL."""

import re

import pytest

from deployhub.registry.models import Model, ModelVersion
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def add_model(team, name, description="", fmt="onnx", tags=()):
    model = Model.objects.create(team=team, name=name, description=description)
    ModelVersion.objects.create(
        model=model, number=1, sha256=name.ljust(64, "0"), size=1, format=fmt, tags=list(tags)
    )
    return model


@pytest.fixture
def listed(client, alice, demo_team):
    add_model(demo_team, "digits-cnn", "Handwritten digits")
    add_model(demo_team, "yolo-lite", "Detects people on the shop floor", tags=["edge"])
    add_model(demo_team, "segformer", "Segments roads", fmt="pt2", tags=["Edge-v2"])
    client.login(username="alice", password=PASSWORD)
    return client


def names_on(client, query):
    page = client.get(f"/models/?{query}").content.decode()
    return [name for name in ("digits-cnn", "yolo-lite", "segformer") if f">{name}</a>" in page]


def test_it_searches_names_and_descriptions_case_insensitively(listed):
    assert names_on(listed, "q=YOLO") == ["yolo-lite"]
    assert names_on(listed, "q=shop+floor") == ["yolo-lite"]
    assert names_on(listed, "q=") == ["digits-cnn", "yolo-lite", "segformer"]


def test_it_filters_by_format_and_by_exact_tag(listed):
    assert names_on(listed, "format=pt2") == ["segformer"]
    assert names_on(listed, "tag=EDGE") == ["yolo-lite"]  # not "Edge-v2"
    assert names_on(listed, "q=s&format=onnx") == ["digits-cnn", "yolo-lite"]


def test_it_keeps_the_criteria_in_the_form_and_counts_and_says_when_nothing_matches(listed):
    page = listed.get("/models/?q=zzz&format=pt2").content.decode()

    assert re.search(r'name="q"\s+value="zzz"', page) and '<option value="pt2" selected>' in page
    assert "0 of 3 models" in page and "No model matches this search" in page


def test_it_ignores_an_unknown_format_rather_than_failing(listed):
    response = listed.get("/models/?format=tar&q=digits")

    assert response.status_code == 200
    assert names_on(listed, "format=tar") == ["digits-cnn", "yolo-lite", "segformer"]


def test_it_never_lists_another_teams_model(listed, charlie):
    add_model(charlie.memberships.get().team, "acme-secret", "digits")

    assert "acme-secret" not in listed.get("/models/?q=digits").content.decode()
