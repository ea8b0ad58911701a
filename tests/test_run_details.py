"""A run's details (percentiles, stability, conditions, build config) load when they are opened:
the version page drew them for all of its 50 runs, most of its results table's cost."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.benchmark_results import LATENCY, details_of, record_run, result
from tests.conftest import PASSWORD, stored_engine

pytestmark = pytest.mark.django_db

INT8_CONFIG = {"precision": "int8", "provider": "CPUExecutionProvider"}


def slow_int8_run(version, device_class, fp32_runs=1):
    """An INT8 run slower than the FP32 runs of its class and batch (p50 12 ms against 10)."""
    for _ in range(fp32_runs):
        record_run(version, device_class, result())
    int8 = stored_engine(version, device_class, build_config=INT8_CONFIG)
    return record_run(version, device_class, result(latency_ms={**LATENCY, "p50": 12.0}), int8)


def test_it_shows_a_runs_gate_reason_build_config_and_int8_flag(
    client, alice, version, device_class
):
    run = slow_int8_run(version, device_class)
    client.login(username="alice", password=PASSWORD)

    details = details_of(client, run)

    assert 'dd class="gate-reason"' in details
    assert "p99 15.00 ms is within the 33.3 ms frame budget (30 fps)." in details
    assert '<dd class="build-config">' in details
    assert '<span class="k">precision</span> int8' in details
    assert "INT8 slower than FP32 (p50 12.000 vs 10.000 ms)" in details
    assert f'<a href="/jobs/{run.job_id}/">job #{run.job_id}</a>' in details


@pytest.mark.parametrize("page", ["version", "job", "engine"])
def test_every_page_that_lists_an_int8_run_badges_it_as_its_details_flag_it(
    client, alice, version, device_class, page
):
    """The row's "INT8 slower" badge and its details judge by the same rule: against every FP32
    run of the version on the class and batch (the job and engine pages showed no badge)."""
    run = slow_int8_run(version, device_class)
    client.login(username="alice", password=PASSWORD)
    url = {
        "version": version.get_absolute_url(),
        "job": f"/jobs/{run.job_id}/",
        "engine": run.engine.get_absolute_url(),
    }[page]

    html = client.get(url).content.decode()

    assert "INT8 slower than FP32" in details_of(client, run)
    assert f'id="run-{run.pk}"' in html
    row = html.split(f'id="run-{run.pk}"', 1)[1].split("</tr>", 1)[0]
    assert "int8-slower" in row


def test_an_fp32_runs_details_flag_nothing(client, alice, version, device_class):
    run = record_run(version, device_class, result())
    slow_int8_run(version, device_class, fp32_runs=0)
    client.login(username="alice", password=PASSWORD)

    details = details_of(client, run)

    assert "INT8 slower" not in details and "Build config" not in details


def test_another_teams_user_gets_404(client, charlie, version, device_class):
    run = record_run(version, device_class, result())
    client.login(username="charlie", password=PASSWORD)

    assert client.get(run.details_url).status_code == 404


def test_an_anonymous_user_is_sent_to_sign_in(client, version, device_class):
    run = record_run(version, device_class, result())

    response = client.get(run.details_url)

    assert response.status_code == 302
    assert response["Location"] == f"/login/?next=/benchmarks/runs/{run.pk}/details"


def test_it_reads_an_int8_run_in_as_many_queries_for_many_fp32_runs(
    client, alice, version, device_class
):
    few, many = slow_int8_run(version, device_class), slow_int8_run(version, device_class, 30)
    client.login(username="alice", password=PASSWORD)
    details_of(client, few)  # the session and the user are read as for any page

    counts = []
    for run in (few, many):
        with CaptureQueriesContext(connection) as queries:
            details_of(client, run)
        counts.append(len(queries))

    assert counts[0] == counts[1] <= 4  # the session, the user, the run, its FP32 peers


def test_the_version_and_job_pages_link_each_runs_details_and_draw_none(
    client, alice, version, device_class
):
    runs = [record_run(version, device_class, result()) for _ in range(3)]
    client.login(username="alice", password=PASSWORD)

    for url in (version.get_absolute_url(), runs[0].job.get_absolute_url()):
        page = client.get(url).content.decode()
        assert 'dl class="facts small"' not in page and 'class="gate-reason"' not in page
        shown = runs if url == version.get_absolute_url() else runs[:1]
        for run in shown:
            link = f"/benchmarks/runs/{run.pk}/details"
            assert f'<details data-details-url="{link}">' in page
            assert f'<a href="{link}">Open the details of run #{run.pk}</a>' in page


def test_the_refreshed_results_table_links_the_details_too(client, alice, version, device_class):
    run = record_run(version, device_class, result())
    client.login(username="alice", password=PASSWORD)

    partial = client.get(f"/versions/{version.pk}/results").content.decode()

    assert f'data-details-url="/benchmarks/runs/{run.pk}/details"' in partial
    assert 'dl class="facts small"' not in partial
