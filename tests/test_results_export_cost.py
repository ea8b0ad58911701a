"""A model's results JSON, CSV exports and HTML report cost the same number of queries for
20 runs or 400: the rows they select with each run come without their big fields
(BenchmarkRunQuerySet.for_model), and nothing of those fields is read back one run at a time."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from deployhub.registry.models import Model
from tests.conftest import PASSWORD
from tests.figure_results import seed_classes, seed_engines, seed_runs

pytestmark = pytest.mark.django_db


def seeded_model(team, user, benchmarks, accuracies):
    """A model of two versions with int8 engines on 3 classes and runs spread over them."""
    model = Model.objects.create(team=team, name=f"cost-{benchmarks}", created_by=user)
    versions = [
        model.versions.create(number=n, file=f"models/{n}.onnx", sha256=f"{n}" * 64, size=1)
        for n in (1, 2)
    ]
    engines = seed_engines(versions, seed_classes(team, prefix=f"c{benchmarks}"))
    seed_runs(engines, benchmarks, accuracies)
    return model


def queries_of(client, url):
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
        body = b"".join(response.streaming_content) if response.streaming else response.content
    assert response.status_code == 200, body[:300]
    return len(queries), body


# What each export shows once per run.
PER_RUN = {
    "results.json": b'"job":',
    "report.html": b"<tr",
    "benchmarks.csv": b"\n",
    "accuracy.csv": b"\n",
}


@pytest.mark.parametrize("path", PER_RUN)
def test_the_results_cost_as_many_queries_for_many_runs(client, alice, demo_team, path):
    client.login(username="alice", password=PASSWORD)
    few = seeded_model(demo_team, alice, 20, 5)
    many = seeded_model(demo_team, alice, 400, 100)

    few_queries, few_body = queries_of(client, f"/models/{few.pk}/{path}")
    many_queries, body = queries_of(client, f"/models/{many.pk}/{path}")

    assert many_queries == few_queries
    assert body.count(PER_RUN[path]) > 4 * few_body.count(PER_RUN[path])  # the runs are in it


def test_a_runs_job_link_is_the_job_page_under_any_script_prefix():
    from django.urls import clear_script_prefix, reverse, set_script_prefix

    from deployhub.benchmarks.models import job_url

    assert job_url(7) == reverse("job_detail", args=[7]) == "/jobs/7/"
    set_script_prefix("/hub/")
    try:
        assert job_url(12345) == reverse("job_detail", args=[12345]) == "/hub/jobs/12345/"
    finally:
        clear_script_prefix()
    assert job_url(987654321) == "/jobs/987654321/"
