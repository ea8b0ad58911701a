"""A model's results exported: CSV and JSON that match the stored runs, a self-contained report."""

import csv
import io
import re

import pytest

from deployhub.evaluation.models import AccuracyRun
from deployhub.jobs.models import Job, JobKind
from tests.api_calls import token_for
from tests.benchmark_results import SERVER_BLOCK, SWEEP, record_run, result
from tests.conftest import PASSWORD, stored_engine


@pytest.fixture
def engine(version, device_class):
    config = {"provider": "CPUExecutionProvider", "precision": "int8"}
    return stored_engine(version, device_class, config)


@pytest.fixture
def runs(version, device_class, engine):
    """Two benchmark runs (source and int8 engine) and an accuracy run of the engine."""
    source = record_run(version, device_class, result())
    int8 = record_run(
        version,
        device_class,
        result(scenario="server", server=SERVER_BLOCK, batch_sweep=SWEEP, throughput_ips=123.5),
        engine=engine,
    )
    job = Job.objects.create(
        team=version.team, kind=JobKind.EVALUATE, device_class=device_class, engine=engine
    )
    accuracy = AccuracyRun.record(
        job,
        {
            "samples": 300,
            "reference": {"top1": 0.983, "top5": 1.0},
            "engine": {"top1": 0.97, "top5": 1.0},
            "top1_agreement": 0.987,
            "max_abs_error": 0.012,
            "mean_abs_error": 0.0009,
            "cosine_min": 0.9991,
            "cosine_mean": 0.99998,
        },
    )
    return source, int8, accuracy


def read_csv(response):
    content = b"".join(response.streaming_content) if response.streaming else response.content
    return list(csv.DictReader(io.StringIO(content.decode())))


def test_the_benchmarks_csv_matches_the_stored_runs(client, alice, version, runs):
    source, int8, _ = runs
    client.login(username="alice", password=PASSWORD)
    response = client.get(f"/models/{version.model.pk}/benchmarks.csv")
    assert response["Content-Disposition"] == 'attachment; filename="digits-cnn-benchmarks.csv"'
    rows = {int(row["id"]): row for row in read_csv(response)}
    assert set(rows) == {source.pk, int8.pk}
    row = rows[int8.pk]
    assert row["precision"] == "int8" and row["scenario"] == "server" and row["version"] == "1"
    assert float(row["latency_p99_ms"]) == int8.latency_p99_ms
    assert float(row["throughput_ips"]) == 123.5 and float(row["max_qps_in_budget"]) == 80.0
    assert row["gate"] == "meets" and row["gate_reason"] == int8.gate().reason
    assert row["host_cpu_model"] == "Intel Xeon Test" and row["stable"] == "True"
    assert float(rows[source.pk]["fps_at_p99"]) == pytest.approx(1000 / 15)
    assert float(rows[int8.pk]["fps_at_p99"]) == pytest.approx(1000 / 21)  # the server p99


def test_the_accuracy_csv_matches_the_stored_runs(client, alice, version, runs):
    *_, accuracy = runs
    client.login(username="alice", password=PASSWORD)
    [row] = read_csv(client.get(f"/models/{version.model.pk}/accuracy.csv"))
    assert int(row["id"]) == accuracy.pk and row["precision"] == "int8"
    assert float(row["top1"]) == 0.97 and float(row["reference_top1"]) == 0.983
    assert float(row["top1_drop_points"]) == pytest.approx(1.3)
    assert row["within_tolerance"] == "False"


def test_the_json_export_matches_the_stored_runs(client, alice, version, runs):
    source, int8, accuracy = runs
    client.login(username="alice", password=PASSWORD)
    body = client.get(f"/models/{version.model.pk}/results.json").json()
    assert body["model"]["name"] == "digits-cnn" and body["versions"][0]["number"] == 1
    by_id = {run["id"]: run for run in body["benchmarks"]}
    assert by_id[int8.pk]["server"]["tried"][2]["p99_ms"] == 55.0
    assert by_id[int8.pk]["batch_sweep"][1]["throughput_ips"] == 200.0
    assert by_id[source.pk]["latency_ms"]["p50"] == source.latency_p50_ms
    assert by_id[source.pk]["gate"] == {
        "verdict": "meets",
        "label": "Meets budget",
        "reason": source.gate().reason,
    }
    assert body["accuracy"][0]["id"] == accuracy.pk


def test_the_api_exports_with_a_token(client, alice, version, runs):
    pk = version.model.pk
    body = client.get(f"/api/v1/models/{pk}/results", **token_for(alice)).json()
    assert len(body["benchmarks"]) == 2
    rows = read_csv(client.get(f"/api/v1/models/{pk}/results/benchmarks.csv", **token_for(alice)))
    assert len(rows) == 2
    rows = read_csv(client.get(f"/api/v1/models/{pk}/results/accuracy.csv", **token_for(alice)))
    assert len(rows) == 1
    assert client.get(f"/api/v1/models/{pk}/results").status_code == 401


def test_the_api_exports_only_the_runs_the_filters_keep(client, alice, version, runs):
    source, int8, accuracy = runs
    url = f"/api/v1/models/{version.model.pk}/results"
    body = client.get(f"{url}?precision=int8", **token_for(alice)).json()
    assert [run["id"] for run in body["benchmarks"]] == [int8.pk]
    assert [run["id"] for run in body["accuracy"]] == [accuracy.pk]
    body = client.get(f"{url}?precision=fp32&backend=onnxruntime", **token_for(alice)).json()
    assert [run["id"] for run in body["benchmarks"]] == [source.pk] and body["accuracy"] == []
    assert client.get(f"{url}?vmin=2", **token_for(alice)).json()["benchmarks"] == []
    response = client.get(f"{url}/benchmarks.csv?precision=fp32", **token_for(alice))
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert [int(row["id"]) for row in read_csv(response)] == [source.pk]
    response = client.get(f"{url}/accuracy.csv?device_class=elsewhere", **token_for(alice))
    assert read_csv(response) == []
    assert len(client.get(url, **token_for(alice)).json()["benchmarks"]) == 2  # none: all


def test_the_schema_says_the_exports_are_csv_and_html(client):
    paths = client.get("/api/v1/openapi.json").json()["paths"]
    csv_export = paths["/api/v1/models/{pk}/results/{kind}.csv"]["get"]["responses"]
    assert list(csv_export["200"]["content"]) == ["text/csv"]
    report = paths["/api/v1/models/{pk}/report"]["get"]["responses"]
    assert list(report["200"]["content"]) == ["text/html"]
    parameters = paths["/api/v1/models/{pk}/results"]["get"]["parameters"]
    filters = {"device_class", "backend", "precision", "vmin", "vmax"}
    assert filters <= {parameter["name"] for parameter in parameters}


def test_a_csv_cell_is_never_a_spreadsheet_formula(client, alice, version, device_class):
    record_run(version, device_class, result(host={"cpu_model": '=HYPERLINK("x")'}))
    client.login(username="alice", password=PASSWORD)
    [row] = read_csv(client.get(f"/models/{version.model.pk}/benchmarks.csv"))
    assert row["host_cpu_model"].startswith("'=")


def test_the_report_is_self_contained_and_carries_the_figures_data(client, alice, version, runs):
    source, int8, _ = runs
    client.login(username="alice", password=PASSWORD)
    response = client.get(f"/models/{version.model.pk}/report.html")
    assert response["Content-Disposition"] == 'attachment; filename="digits-cnn-report.html"'
    html = response.content.decode()
    assert not re.search(r"<script[^>]*\bsrc\s*=", html, re.I)
    assert not re.search(r"<link[^>]*\bhref\s*=\s*[\"']?(https?:)?//", html, re.I)
    assert not re.search(r"@import|url\(\s*[\"']?(https?:)?//", html, re.I)
    assert "Plotly.newPlot" in html and html.count("plotly-graph-div") == 3
    assert "p99 latency by version" in html and "Accuracy against latency" in html
    assert '"y":[15.0]' in html and '"y":[21.0]' in html  # fp32 p99; int8 server p99
    assert "Meets budget" in html and source.gate().reason in html
    assert "Intel Xeon Test (4 logical CPUs)" in html
    assert "1.30 points" in html and "outside tolerance" in html


def test_the_report_api_needs_a_token_and_a_team(client, alice, charlie, version, runs):
    url = f"/api/v1/models/{version.model.pk}/report"
    response = client.get(url, **token_for(alice))
    assert response.status_code == 200 and b"Plotly.newPlot" in response.content
    assert client.get(url, **token_for(charlie)).status_code == 404


def test_an_unknown_export_is_a_404_naming_the_known_ones(client, alice, version):
    url = f"/api/v1/models/{version.model.pk}/results/nothing.csv"
    response = client.get(url, **token_for(alice))
    assert (
        response.status_code == 404
        and "benchmarks, batch-sweep, accuracy" in response.json()["error"]
    )


def test_a_model_without_runs_still_exports(client, alice, version):
    client.login(username="alice", password=PASSWORD)
    pk = version.model.pk
    assert read_csv(client.get(f"/models/{pk}/benchmarks.csv")) == []
    assert client.get(f"/models/{pk}/results.json").json()["benchmarks"] == []
    html = client.get(f"/models/{pk}/report.html").content.decode()
    assert "No benchmark yet." in html and "plotly-graph-div" not in html


@pytest.mark.parametrize("path", ["benchmarks.csv", "accuracy.csv", "results.json", "report.html"])
def test_another_team_cannot_export(client, charlie, version, runs, path):
    client.login(username="charlie", password=PASSWORD)
    assert client.get(f"/models/{version.model.pk}/{path}").status_code == 404


@pytest.mark.parametrize("path", ["results", "results/benchmarks.csv", "results/accuracy.csv"])
def test_another_team_cannot_export_through_the_api(client, charlie, version, runs, path):
    response = client.get(f"/api/v1/models/{version.model.pk}/{path}", **token_for(charlie))
    assert response.status_code == 404


def test_the_version_page_links_the_exports(client, alice, version):
    client.login(username="alice", password=PASSWORD)
    page = client.get(version.get_absolute_url()).content.decode()
    pk = version.model.pk
    for path in ("benchmarks.csv", "accuracy.csv", "results.json", "report.html"):
        assert f"/models/{pk}/{path}" in page
