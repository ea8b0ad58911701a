"""The version page costs the same number of queries however many results and engines its
version has (make bench's load once found it at 965 queries and 2 s with 500 runs), and lists the
latest runs with where to find the rest (make bench times it under load: bench/load.py)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from deployhub.benchmarks.pages import PAGE_RUNS
from deployhub.devices.models import Device, DeviceClass
from deployhub.registry.models import Model
from tests.conftest import PASSWORD
from tests.figure_results import seed_classes, seed_engines, seed_runs

pytestmark = pytest.mark.django_db


def seeded_version(team, user, engines_per_class, benchmarks, accuracies):
    """A version with engines on 3 classes and runs spread over them."""
    model = Model.objects.create(team=team, name=f"cost-{benchmarks}", created_by=user)
    version = model.versions.create(number=1, file="models/cost.onnx", sha256="0" * 64, size=1)
    precisions = ("fp32", "fp16", "int8")[:engines_per_class]
    engines = seed_engines([version], seed_classes(team, prefix=f"c{benchmarks}"), precisions)
    seed_runs(engines, benchmarks, accuracies)
    return version


def page_queries(client, version):
    with CaptureQueriesContext(connection) as queries:
        response = client.get(version.get_absolute_url())
    assert response.status_code == 200
    return len(queries), response.content.decode()


def test_it_draws_the_version_page_in_as_many_queries_for_many_results_and_engines(
    client, alice, demo_team
):
    client.login(username="alice", password=PASSWORD)
    few = seeded_version(demo_team, alice, 1, 20, 5)
    many = seeded_version(demo_team, alice, 3, 400, 100)

    few_queries, _ = page_queries(client, few)
    many_queries, page = page_queries(client, many)

    assert page.count('class="run"') == PAGE_RUNS
    assert many_queries == few_queries
    # A run's details load when opened (tests/test_run_details.py): none is drawn here.
    assert page.count('dl class="facts small"') == 0
    assert page.count("data-details-url=") == PAGE_RUNS


def test_it_lists_the_latest_runs_and_says_where_the_rest_are(client, alice, demo_team):
    client.login(username="alice", password=PASSWORD)
    version = seeded_version(demo_team, alice, 1, PAGE_RUNS + 5, 0)
    newest = version.benchmarks.order_by("-created_at", "-pk").first()

    _, page = page_queries(client, version)
    partial = client.get(f"/versions/{version.pk}/results").content.decode()

    assert f'id="run-{newest.pk}"' in page
    for html in (page, partial):
        assert f"The latest {PAGE_RUNS} of {PAGE_RUNS + 5} runs" in html
        assert html.count('class="run"') == PAGE_RUNS


def test_it_draws_the_version_page_in_as_many_queries_for_many_device_classes(
    client, alice, demo_team
):
    """Each class's devices are read once for all its parts (preflight, compatibility, the
    parity form's default class and its online check), not per class and part."""
    client.login(username="alice", password=PASSWORD)
    version = seeded_version(demo_team, alice, 1, 20, 5)
    few_queries, _ = page_queries(client, version)

    for number in range(5):
        device_class = DeviceClass.objects.create(
            team=demo_team, slug=f"extra-{number}", name=f"Extra {number}"
        )
        for name in ("a", "b"):
            device = Device(device_class=device_class, name=f"extra-{number}-{name}")
            device.issue_token()
            device.last_heartbeat_at = timezone.now()
            device.save()
    many_queries, page = page_queries(client, version)

    assert "Preflight on extra-4" in page
    assert many_queries == few_queries
