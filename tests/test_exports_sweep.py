"""The batch-sweep CSV, and the report's data tables naming the CSVs' columns row for row."""

import csv
import html
import io
import re

import pytest

from tests.api_calls import token_for
from tests.benchmark_results import SWEEP, record_run, result
from tests.conftest import PASSWORD, stored_engine


@pytest.fixture
def runs(version, device_class):
    """A run without a sweep and an int8 engine's run that swept batch 1 and 8."""
    engine = stored_engine(version, device_class, {"precision": "int8"})
    plain = record_run(version, device_class, result())
    swept = record_run(version, device_class, result(batch_sweep=SWEEP), engine=engine)
    return plain, swept


def read_csv(response):
    assert response.status_code == 200
    return list(csv.reader(io.StringIO(response.content.decode())))


def report_table(page, kind):
    """Return the header and rows of the report's data table of `kind`, as text."""
    table = re.search(rf'<table id="data-{kind}".*?</table>', page, re.S).group(0)
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
    cells = [[html.unescape(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r)] for r in rows]
    return cells[0], [row for row in cells[1:] if row != ["No rows."]]


def test_it_exports_one_row_per_run_and_batch_size(client, alice, version, runs):
    _, swept = runs
    client.login(username="alice", password=PASSWORD)
    response = client.get(f"/models/{version.model.pk}/batch-sweep.csv")
    assert response["Content-Disposition"] == 'attachment; filename="digits-cnn-batch-sweep.csv"'
    header, *rows = read_csv(response)
    by_batch = {
        int(row["batch_size"]): row for row in (dict(zip(header, r, strict=True)) for r in rows)
    }
    assert set(by_batch) == {1, 8}
    assert {int(row["run"]) for row in by_batch.values()} == {swept.pk}
    eight = by_batch[8]
    assert eight["precision"] == "int8" and int(eight["engine"]) == swept.engine_id
    assert float(eight["throughput_ips"]) == 200.0 and float(eight["latency_p50_ms"]) == 40.0
    assert float(eight["per_image_p99_ms"]) == pytest.approx(15.0 / 8)
    assert float(by_batch[1]["cv"]) == 0.03


def test_the_api_serves_the_sweep_csv_and_refuses_an_unknown_kind(client, alice, version, runs):
    pk = version.model.pk
    response = client.get(f"/api/v1/models/{pk}/results/batch-sweep.csv", **token_for(alice))
    assert len(read_csv(response)) == 1 + len(SWEEP)
    response = client.get(f"/api/v1/models/{pk}/results/sweeps.csv", **token_for(alice))
    assert response.status_code == 404 and "batch-sweep" in response.json()["error"]


def test_another_team_cannot_export_the_sweeps(client, charlie, version, runs):
    assert (
        client.get(
            f"/api/v1/models/{version.model.pk}/results/batch-sweep.csv", **token_for(charlie)
        ).status_code
        == 404
    )
    client.login(username="charlie", password=PASSWORD)
    assert client.get(f"/models/{version.model.pk}/batch-sweep.csv").status_code == 404


@pytest.mark.parametrize("kind", ["benchmarks", "batch-sweep", "accuracy"])
def test_the_report_and_the_csv_name_the_same_columns(client, alice, version, runs, kind):
    client.login(username="alice", password=PASSWORD)
    pk = version.model.pk
    page = client.get(f"/models/{pk}/report.html").content.decode()
    header, rows = report_table(page, kind)
    csv_header, *csv_rows = read_csv(
        client.get(f"/api/v1/models/{pk}/results/{kind}.csv", **token_for(alice))
    )
    assert header == csv_header
    assert len(rows) == len(csv_rows)


def test_the_report_carries_the_sweep_rows(client, alice, version, runs):
    _, swept = runs
    client.login(username="alice", password=PASSWORD)
    page = client.get(f"/models/{version.model.pk}/report.html").content.decode()
    header, rows = report_table(page, "batch-sweep")
    rows = [dict(zip(header, row, strict=True)) for row in rows]
    assert [(r["run"], r["batch_size"], r["throughput_ips"]) for r in rows] == [
        (str(swept.pk), "1", "100.0"),
        (str(swept.pk), "8", "200.0"),
    ]
    assert "Batch sweep" in page
