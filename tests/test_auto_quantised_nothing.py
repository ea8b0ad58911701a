"""An int8 build that quantised nothing runs in float: never an INT8 speed-up in auto mode.

The builds' rows are made here as workers would leave them; the worker side
(graph_report["quantized_nodes"]) is tested with real builds in
tests/test_backends_onnxruntime.py and tests/test_backends_openvino.py.
"""

import pytest

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.engines import auto
from deployhub.engines.models import AutoBuild, AutoRun
from deployhub.jobs.models import Job, JobKind
from tests.benchmark_results import LATENCY, record_evaluation, result
from tests.conftest import PASSWORD, stored_engine

pytestmark = pytest.mark.django_db


def finished_job(engine, kind):
    version = engine.model_version
    return Job.objects.create(
        team=version.team,
        kind=kind,
        device_class=engine.device_class,
        model_version=version,
        engine=engine,
        state="succeeded",
    )


def measured_build(run, precision, p50, quantized_nodes=None):
    """Add a build whose engine, benchmark (p50 ms at batch 1) and evaluation are stored."""
    engine = stored_engine(
        run.model_version, run.device_class, {"precision": precision}, digest=f"{precision}-{p50}"
    )
    if quantized_nodes is not None:
        engine.graph_report = {"quantized_nodes": quantized_nodes}
        engine.save()
    benchmark_job = finished_job(engine, JobKind.BENCHMARK)
    body = result(
        latency_ms={**LATENCY, "p50": p50, "p99": p50 * 1.2, "min": p50 * 0.9},
        throughput_ips=1000 / p50,
    )
    BenchmarkRun.record(benchmark_job, body)
    evaluate_job = finished_job(engine, JobKind.EVALUATE)
    record_evaluation(evaluate_job, engine, max_abs_error=0.0, cosine_min=1.0)
    return AutoBuild.objects.create(
        auto_run=run,
        backend="onnxruntime",
        precision=precision,
        engine=engine,
        benchmark_job=benchmark_job,
        evaluate_job=evaluate_job,
        finished=True,
    )


@pytest.fixture
def run(version, device_class):
    device_class.frame_budget_ms = 100.0
    device_class.save()
    return AutoRun.objects.create(model_version=version, device_class=device_class)


def test_it_never_recommends_an_int8_build_that_quantised_nothing(run):
    fp32 = measured_build(run, "fp32", p50=10.0)
    measured_build(run, "int8", p50=9.0, quantized_nodes=0)

    auto.rank(run)
    run.refresh_from_db()

    assert run.recommended == fp32


def test_it_keeps_an_int8_build_that_quantised_nothing_out_of_the_side_by_side(run):
    fp32 = measured_build(run, "fp32", p50=10.0)
    measured_build(run, "int8", p50=9.0, quantized_nodes=0)

    contenders = auto._contenders(run, auto._judge(run))

    assert contenders == [fp32]


def test_it_recommends_an_int8_build_that_quantised_its_graph(run):
    measured_build(run, "fp32", p50=10.0)
    int8 = measured_build(run, "int8", p50=4.0, quantized_nodes=12)

    auto.rank(run)
    run.refresh_from_db()

    assert run.recommended == int8


def test_its_pages_say_nothing_was_quantised_and_why_it_was_left_out(run, client):
    measured_build(run, "fp32", p50=10.0)
    int8 = measured_build(run, "int8", p50=9.0, quantized_nodes=0)
    auto.rank(run)
    client.login(username="alice", password=PASSWORD)

    auto_page = client.get(run.get_absolute_url()).content.decode()
    engine_page = client.get(int8.engine.get_absolute_url()).content.decode()
    version_page = client.get(run.model_version.get_absolute_url()).content.decode()

    assert "left out: nothing quantised" in auto_page
    for page in (auto_page, engine_page, version_page):
        assert "this int8 build runs in float, as the fp32 build does" in page


def test_its_results_report_and_api_flag_it_too(run, client, alice):
    from tests.api_calls import token_for

    int8 = measured_build(run, "int8", p50=9.0, quantized_nodes=0)
    version = run.model_version
    client.login(username="alice", password=PASSWORD)

    report = client.get(f"/models/{version.model_id}/report.html").content.decode()
    results = client.get(f"/versions/{version.pk}/results").content.decode()
    answer = client.get(f"/api/v1/engines/{int8.engine.pk}", **token_for(alice)).json()

    assert 'class="badge orange nothing-quantised"' in report
    assert 'class="badge orange nothing-quantised"' in results
    assert answer["quantised_nothing"] is True
