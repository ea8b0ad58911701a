"""One named figure per meaning: "fps at p99" and "sustained throughput", the same everywhere.

One run with known figures (p50 10 ms, p99 16 ms, 95 images/s at batch 1) must read
the same on the version page, the exports, the report and the budget calculator,
and no page may show an fps taken from p50 (that would be 100 here).
"""

import csv
import io
import json

import pytest

from deployhub.benchmarks.charts import accuracy_latency_figure
from deployhub.devices.models import ServingPattern
from deployhub.evaluation.models import AccuracyRun
from deployhub.jobs.models import Job, JobKind
from tests.benchmark_results import LATENCY, record_run, result
from tests.conftest import PASSWORD, stored_engine

pytestmark = pytest.mark.django_db

KNOWN = {**LATENCY, "p50": 10.0, "p99": 16.0, "mean": 10.5}
FPS_AT_P99 = "62.5"  # 1000 / 16 ms
SUSTAINED = "95.0"  # what the run achieved, images/s


@pytest.fixture
def run(version, device_class):
    return record_run(version, device_class, result(latency_ms=KNOWN, throughput_ips=95.0))


@pytest.fixture
def logged_in(client, alice):
    client.login(username="alice", password=PASSWORD)
    return client


def test_it_shows_fps_at_p99_and_sustained_throughput_on_the_version_page(logged_in, run):
    page = logged_in.get(run.model_version.get_absolute_url()).content.decode()

    assert ">fps at p99</th>" in page and ">Sustained throughput</th>" in page
    assert ">fps</th>" not in page and "at p50" not in page
    realtime_gate = '<strong title="decides this real-time class\'s gate">'
    assert f'<td class="fps-at-p99">{realtime_gate}{FPS_AT_P99}</strong></td>' in page
    assert f'<td class="throughput">{SUSTAINED} img/s' in page


def test_it_exports_the_two_figures_by_name_and_drops_the_p50_fps(logged_in, run):
    model = run.model_version.model

    body = logged_in.get(f"/models/{model.pk}/benchmarks.csv").getvalue().decode()
    [row] = list(csv.DictReader(io.StringIO(body)))
    document = json.loads(logged_in.get(f"/models/{model.pk}/results.json").content)
    [exported] = document["benchmarks"]

    assert "fps" not in row and "fps" not in exported
    assert row["fps_at_p99"] == FPS_AT_P99 and row["sustained_throughput_ips"] == SUSTAINED
    assert exported["fps_at_p99"] == 62.5 and exported["sustained_throughput_ips"] == 95.0


def test_the_report_names_the_figures_as_the_pages_do(logged_in, run):
    model = run.model_version.model

    html = logged_in.get(f"/models/{model.pk}/report.html").getvalue().decode()

    assert ">fps at p99</th>" in html and ">Sustained throughput</th>" in html
    assert f'<td class="num fps-at-p99">{FPS_AT_P99}</td>' in html
    assert f'<td class="num sustained-throughput">{SUSTAINED} img/s</td>' in html


def test_a_realtime_calculator_lists_runs_whose_fps_at_p99_reaches_the_target(
    logged_in, run, device_class
):
    url = f"/devices/classes/{device_class.pk}/"

    within = logged_in.get(url, {"fps": 62}).content.decode()
    beyond = logged_in.get(url, {"fps": 63}).content.decode()

    assert f"#run-{run.pk}" in within and f"#run-{run.pk}" not in beyond
    assert f'<td class="fps-at-p99"><strong>{FPS_AT_P99}</strong></td>' in within


def test_a_batch_calculator_takes_images_per_second_and_judges_sustained_throughput(
    logged_in, version, device_class
):
    device_class.serving_pattern = ServingPattern.BATCH
    device_class.throughput_target_ips = 300.0
    device_class.save()
    single = record_run(version, device_class, result(latency_ms=KNOWN, throughput_ips=95.0))
    offline = {"samples": 4000, "wall_s": 10.0, "throughput_ips": 400.0}
    batched = record_run(
        version,
        device_class,
        result(scenario="offline", batch_size=8, throughput_ips=90.0, offline=offline),
    )
    url = f"/devices/classes/{device_class.pk}/"

    page = logged_in.get(url, {"ips": 300}).content.decode()

    assert 'id="target-ips">300 images/s</strong>' in page
    assert f"#run-{batched.pk}" in page and f"#run-{single.pk}" not in page
    assert '<td class="throughput"><strong>400.0 img/s</strong></td>' in page
    assert f"#run-{single.pk}" in logged_in.get(url, {"ips": 90}).content.decode()


@pytest.mark.parametrize("value", ["0", "-1", "many", "1e12"])
def test_a_batch_calculator_refuses_a_bad_target(logged_in, device_class, value):
    device_class.serving_pattern = ServingPattern.BATCH
    device_class.throughput_target_ips = 300.0
    device_class.save()

    response = logged_in.get(f"/devices/classes/{device_class.pk}/", {"ips": value})

    page = response.content.decode()
    assert response.status_code == 400 and 'class="errorlist' in page
    assert 'id="budget-runs"' not in page


def test_the_accuracy_chart_plots_p99_per_image_and_says_so(version, device_class):
    engine = stored_engine(version, device_class, {"precision": "int8"})
    runs = [
        record_run(version, device_class, result(latency_ms=KNOWN), engine=engine),
        record_run(version, device_class, result(latency_ms=KNOWN, batch_size=2), engine=engine),
    ]
    job = Job.objects.create(
        team=version.team, kind=JobKind.EVALUATE, device_class=device_class, engine=engine
    )
    accuracy = AccuracyRun.objects.create(
        job=job,
        engine=engine,
        samples=10,
        top1_agreement=0.99,
        max_abs_error=0.1,
        mean_abs_error=0.01,
        cosine_min=0.99,
        cosine_mean=0.999,
    )

    figure = accuracy_latency_figure(runs, [accuracy])

    assert figure.layout.xaxis.title.text == "p99 latency per image (ms)"
    assert list(figure.data[0].x) == [8.0]  # the batch-2 run: 16 ms p99 for two images
