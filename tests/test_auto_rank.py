"""Auto mode's ranking follows the class's serving pattern, its gate and the golden pairs.

The builds' results are stored as workers would send them (through the models'
record methods); the end-to-end run with a real worker is tests/test_e2e_auto.py.
"""

import pytest

from deployhub.devices.models import DeviceClass
from deployhub.engines import auto
from deployhub.engines.actions import compared_engines
from deployhub.engines.models import AutoBuild, AutoRun
from deployhub.evaluation.models import GoldenRun
from deployhub.jobs.models import JobKind
from deployhub.registry.models import GoldenSet
from tests.api_calls import call
from tests.auto_builds import (
    LONG_ERROR,
    SKIP_REASON,
    engine_of,
    failed_build,
    measured_build,
    skipped_build,
)
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(version, device_class):
    return AutoRun.objects.create(model_version=version, device_class=device_class)


def ranked(run):
    auto.rank(run)
    run.refresh_from_db()
    return {b.precision: b for b in run.builds.all()}, run


def test_a_realtime_class_gets_the_fastest_build_at_batch_1_that_meets_its_budget(run):
    run.device_class.frame_budget_ms = 10.0
    run.device_class.save()
    measured_build(run, "slow", p50=8.0)
    measured_build(run, "fast", p50=2.0)
    measured_build(run, "wrong", p50=1.0, agreement=0.9)

    builds, run = ranked(run)

    assert run.recommended.precision == "fast"
    assert builds["wrong"].within_tolerance is False
    assert builds["slow"].meets_budget and not builds["slow"].pareto
    assert "p99 2.400 ms (416.7 fps at p99)" in run.summary


def test_an_unstable_measurement_does_not_count_as_meeting_the_budget(run):
    run.device_class.frame_budget_ms = 4.0  # the noisy build's p99 (2.4 ms) is not 2x within
    run.device_class.save()
    measured_build(run, "steady", p50=3.0)
    measured_build(run, "noisy", p50=2.0, stable=False)

    builds, run = ranked(run)

    assert builds["noisy"].meets_budget is None
    assert run.recommended.precision == "steady"


def test_a_batch_class_compares_throughput_and_checks_its_target(run):
    device_class = run.device_class
    device_class.serving_pattern = "batch"
    device_class.throughput_target_ips = 500.0
    device_class.batch_latency_ceiling_ms = 100.0
    device_class.save()
    # "narrow" answers a batch sooner, "wide" gets more images through: throughput decides.
    measured_build(run, "narrow", p50=10.0, batch=8, throughput=400.0)
    measured_build(run, "wide", p50=12.0, batch=8, throughput=650.0)

    builds, run = ranked(run)

    assert builds["narrow"].meets_budget is False  # 400 images/s < 500
    assert run.recommended.precision == "wide"
    assert "650.0 images/s at batch 8" in run.summary


def test_a_build_that_fails_its_golden_pairs_is_never_recommended(run, alice):
    fast = measured_build(run, "fast", p50=1.0)
    measured_build(run, "correct", p50=2.0)
    golden = GoldenSet.objects.create(
        model_version=run.model_version,
        name="reference",
        file="golden/x.npz",
        sha256="0" * 64,
        size=1,
        format="npz",
        pairs=1,
        atol=1e-4,
        rtol=1e-3,
    )
    GoldenRun.objects.create(
        job=fast.evaluate_job,
        engine=fast.engine,
        golden_set=golden,
        passed=False,
        pairs=1,
        atol=1e-4,
        rtol=1e-3,
        outputs=[{"name": "logits", "passed": False}],
    )

    builds, run = ranked(run)

    assert builds["fast"].within_tolerance is False
    assert run.recommended.precision == "correct"


def test_a_batch_class_is_measured_in_batches_the_contract_allows(version, device_class):
    device_class.serving_pattern = "batch"

    assert auto.benchmark_params(version, device_class)["scenario"] == "offline"
    assert auto.benchmark_params(version, device_class)["batch_size"] == auto.batch_for(version)
    device_class.serving_pattern = "realtime"
    assert auto.benchmark_params(version, device_class) == {
        "scenario": "single-stream",
        "batch_size": 1,
        "warmup_s": 1.0,
        "duration_s": 3.0,
    }


def comparison(*figures):
    """A side-by-side result: (engine, best round ms) pairs, as a worker sends them."""
    engines = [
        {"engine": str(engine.pk), "best_round_ms": ms, "median_round_ms": ms * 1.05}
        for engine, ms in figures
    ]
    return {"batch_size": 1, "rounds": 10, "engines": engines, "fastest": engines[0]["engine"]}


def finish_comparison(client, make_device, job, result, capture):
    """Claim the compare job as a device and complete it with result; return the response."""
    device, token = make_device()
    claimed = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    assert claimed.status_code == 200, claimed.content
    with capture(execute=True):
        return claimed.json(), call(
            client,
            token,
            f"jobs/{job.pk}/complete",
            {"attempt": 1, "state": "succeeded", "result": result},
        )


def test_close_builds_are_timed_side_by_side_and_that_run_decides(
    run, client, alice, make_device, django_capture_on_commit_callbacks
):
    first = measured_build(run, "first", p50=2.0)
    second = measured_build(run, "second", p50=2.2)  # within 25%: a contender
    measured_build(run, "far", p50=4.0)

    run = auto.advance(run)

    job = run.compare_job
    assert run.state == "running" and job.kind == JobKind.COMPARE
    assert job.params["engines"] == [first.engine.pk, second.engine.pk]
    assert job.params["batch_size"] == 1
    claimed, response = finish_comparison(
        client,
        make_device,
        job,
        comparison((second.engine, 1.9), (first.engine, 2.1)),
        django_capture_on_commit_callbacks,
    )
    assert set(claimed["inputs"]) == {
        f"engine-{first.engine.pk}",
        f"engine-{second.engine.pk}",
        "model",
    }
    assert claimed["inputs"][f"engine-{second.engine.pk}"]["sha256"] == second.engine.sha256
    assert response.status_code == 200, response.content
    run.refresh_from_db()
    assert run.state == "done" and run.recommended.precision == "second"
    assert run.recommended.side_by_side_ms == pytest.approx(1.9)
    assert "timed side by side with onnxruntime first" in run.summary
    assert "1.11× faster than onnxruntime first" in run.summary
    first.refresh_from_db()
    assert run.recommended.pareto and not first.pareto  # the front the deciding run draws
    client.login(username="alice", password=PASSWORD)
    page = client.get(job.get_absolute_url()).content.decode()
    assert f'<p id="compare-result">Part of <a href="{run.get_absolute_url()}">' in page


def test_builds_far_apart_are_ranked_without_a_side_by_side_run(run):
    measured_build(run, "fast", p50=2.0)
    measured_build(run, "slow", p50=3.0)

    run = auto.advance(run)

    assert run.state == "done" and run.compare_job is None
    assert run.recommended.precision == "fast"


def test_builds_whose_medians_came_close_are_timed_side_by_side_whatever_their_p99(run):
    # One slow frame in a hundred (a busy machine) spreads p99s that the medians do not.
    first = measured_build(run, "first", p50=5.0, p99=11.5)
    second = measured_build(run, "second", p50=5.7, p99=18.3)
    measured_build(run, "far", p50=9.0, p99=20.0)

    run = auto.advance(run)

    assert run.state == "running" and run.compare_job is not None
    assert run.compare_job.params["engines"] == [first.engine.pk, second.engine.pk]


def test_a_batch_class_compares_its_builds_at_the_batch_they_were_measured_at(run):
    device_class = run.device_class
    device_class.serving_pattern = "batch"
    device_class.save()
    measured_build(run, "a", p50=10.0, batch=8, throughput=800.0)
    measured_build(run, "b", p50=10.5, batch=8, throughput=760.0)

    run = auto.advance(run)

    assert run.compare_job.params["batch_size"] == auto.batch_for(run.model_version)


def test_a_failed_side_by_side_run_leaves_the_separate_runs_to_decide(run):
    measured_build(run, "first", p50=2.0)
    measured_build(run, "second", p50=2.1)
    run = auto.advance(run)
    job = run.compare_job
    job.state, job.error = "failed", "worker lost after 3 attempts"
    job.save()

    run = auto.advance(run)

    assert run.state == "done" and run.recommended.precision == "first"
    assert "did not finish (worker lost after 3 attempts)" in run.summary


def test_a_side_by_side_result_for_other_engines_fails_the_job_and_stores_nothing(
    run, client, make_device, django_capture_on_commit_callbacks
):
    first = measured_build(run, "first", p50=2.0)
    measured_build(run, "second", p50=2.1)
    job = auto.advance(run).compare_job

    _, response = finish_comparison(
        client,
        make_device,
        job,
        comparison((first.engine, 1.9)),
        django_capture_on_commit_callbacks,
    )

    job.refresh_from_db()
    assert response.status_code == 200 and job.state == "failed"
    assert "the job asked for" in job.error
    assert not AutoBuild.objects.filter(side_by_side_ms__isnull=False).exists()
    run.refresh_from_db()
    assert run.state == "done" and "did not finish" in run.summary


def test_a_compare_job_names_only_engines_of_its_own_version_and_class(run, demo_team):
    first = measured_build(run, "first", p50=2.0)
    measured_build(run, "second", p50=2.1)
    job = auto.advance(run).compare_job
    elsewhere = DeviceClass.objects.create(team=demo_team, slug="elsewhere", name="Elsewhere")
    foreign = engine_of(run.model_version, elsewhere, "foreign")
    job.params = {"engines": [foreign.pk, first.engine.pk, "x", first.engine.pk + 1000]}

    assert compared_engines(job) == [first.engine]


def test_the_page_flags_an_int8_build_slower_than_fp32(run, client, alice):
    measured_build(run, "fp32", p50=2.0)
    measured_build(run, "int8-slow", p50=2.4, int8=True)
    measured_build(run, "int8-fast", p50=1.0, int8=True)
    auto.advance(run)
    client.login(username="alice", password=PASSWORD)

    page = client.get(run.get_absolute_url()).content.decode()

    assert page.count("INT8 slower than FP32 (p50 2.400 vs 2.000 ms)") == 1


def test_the_summary_says_when_instability_not_speed_kept_a_build_from_the_gate(run):
    run.device_class.frame_budget_ms = 4.0
    run.device_class.save()
    measured_build(run, "noisy", p50=2.0, stable=False)  # p99 2.4 ms: within 4 ms, not 2x within

    builds, run = ranked(run)

    assert run.recommended.precision == "noisy" and builds["noisy"].meets_budget is None
    assert "no build was measured meeting the class's gate" in run.summary
    assert "unstable (CV 30.0% is above 10%)" in run.summary


def test_it_says_all_builds_failed_and_is_not_green(run):
    failed_build(run, "fp32")
    failed_build(run, "int8", error="internal: the child process crashed: SIGSEGV")
    skipped_build(run, "fp16", SKIP_REASON)

    run = auto.advance(run)

    assert run.state == "done" and run.recommended is None
    assert run.summary == (
        "All 2 builds failed (Unsupported operator, Internal error); 1 skipped (see why below)."
    )
    assert run.outcome == "all_failed" and run.outcome_color == "red"


def test_it_counts_the_failed_builds_beside_a_recommendation(run):
    measured_build(run, "fp32", p50=2.0)
    failed_build(run, "int8", error="the engine did not load", kind=JobKind.BENCHMARK)
    failed_build(run, "bf16", error="unsupported_operator: Add-6", kind=JobKind.COMPILE)

    builds, run = ranked(run)

    assert run.recommended.precision == "fp32" and run.outcome == "recommended"
    assert run.summary.endswith("; 2 of 3 builds failed (Benchmark failed, Unsupported operator)")
    assert builds["int8"].failed_job == builds["int8"].benchmark_job


def test_it_says_nothing_was_within_tolerance_and_what_failed(run):
    measured_build(run, "wrong", p50=1.0, agreement=0.5)
    failed_build(run, "int8")

    _, run = ranked(run)

    assert run.outcome == "nothing_eligible" and run.outcome_color == "red"
    assert run.summary == (
        "No build stayed within the accuracy tolerance; 1 of 2 builds failed "
        "(Unsupported operator)."
    )


def test_a_recommended_build_that_misses_the_budget_says_so(run):
    run.device_class.frame_budget_ms = 1.0
    run.device_class.save()
    measured_build(run, "fast", p50=2.0)
    measured_build(run, "slow", p50=5.0)

    builds, run = ranked(run)

    assert run.recommended.precision == "fast" and builds["fast"].meets_budget is False
    assert builds["fast"].recommendation_note == "fastest, misses the budget"
    assert run.outcome == "recommended_off_gate" and run.outcome_color == "orange"
    assert "no build meets the class's gate (p99 per frame within 1 ms (1000 fps))" in run.summary


def test_a_recommended_build_from_an_unstable_run_says_so(run):
    run.device_class.frame_budget_ms = 4.0
    run.device_class.save()
    measured_build(run, "noisy", p50=2.0, stable=False)

    builds, run = ranked(run)

    assert builds["noisy"].recommendation_note == "fastest; unstable run"
    assert run.outcome == "recommended_off_gate"


def test_a_realtime_class_ranks_by_p99_the_figure_its_gate_judges(run):
    # "spiky" has the lower median, but one frame in a hundred takes 9 ms.
    measured_build(run, "spiky", p50=2.0, p99=9.0)
    measured_build(run, "steady", p50=3.0, p99=3.3)

    builds, run = ranked(run)

    assert run.recommended.precision == "steady"
    assert "p99 3.300 ms (303.0 fps at p99)" in run.summary
    assert not builds["spiky"].pareto


def page_of(client, run):
    client.login(username="alice", password=PASSWORD)
    response = client.get(run.get_absolute_url())
    assert response.status_code == 200
    return response.content.decode()


def test_the_page_shows_each_failure_its_category_whole_message_and_job_log(run, client, alice):
    compile_failed = failed_build(run, "fp32")
    failed_build(run, "int8", error="the engine did not load", kind=JobKind.BENCHMARK)
    skipped_build(run, "fp16", SKIP_REASON)
    auto.advance(run)

    page = page_of(client, run)

    assert 'class="badge red" id="auto-state" data-outcome="all_failed">All 2 builds failed' in page
    assert "All 2 builds failed (Unsupported operator, Benchmark failed)" in page
    assert 'class="card outcome red" id="auto-summary"' in page
    assert '<span class="badge red failure-category">Unsupported operator</span>' in page
    assert '<span class="badge red failure-category">Benchmark failed</span>' in page
    assert LONG_ERROR.replace("'", "&#x27;").replace(">", "&gt;") in page
    assert f'href="/jobs/{compile_failed.compile_job_id}/#job-log"' in page
    assert f"skipped: {SKIP_REASON}" in page
    assert "No build ran." not in page and "…" not in page.split("<details", 1)[0]


def test_the_page_labels_the_recommendation_that_misses_the_budget(run, client, alice):
    run.device_class.frame_budget_ms = 1.0
    run.device_class.save()
    measured_build(run, "fast", p50=2.0)
    measured_build(run, "slow", p50=5.0)
    auto.advance(run)

    page = page_of(client, run)

    assert 'id="recommended-badge">recommended: fastest, misses the budget</span>' in page
    assert 'class="badge orange" id="auto-state"' in page
    assert "<th" in page and ">fps at p99</th>" in page and ">Sustained throughput</th>" in page
    assert '<td class="fps-at-p99">416.7</td>' in page
    assert '<td class="throughput">500.0 img/s' in page


def test_auto_mode_without_a_dataset_says_why_beside_its_button(client, alice, version):
    from deployhub.devices.models import DeviceClass as Class

    device_class = Class.objects.create(team=version.team, slug="cpu-auto", name="CPU")
    client.login(username="alice", password=PASSWORD)

    response = client.post(f"/versions/{version.pk}/auto", {"device_class": device_class.pk})

    page = response.content.decode()
    assert response.status_code == 400 and not AutoRun.objects.exists()
    button, error = page.index('id="auto"'), page.index('id="auto-error"')
    assert 0 < error - button < 300
    assert "attach a validation (or calibration) dataset to the model first" in page[error:]


@pytest.mark.parametrize("value", ["", "x", "999999"])
def test_auto_mode_without_a_class_of_the_team_says_so_and_starts_nothing(
    client, alice, version, device_class, value
):
    client.login(username="alice", password=PASSWORD)

    response = client.post(f"/versions/{version.pk}/auto", {"device_class": value})

    assert response.status_code == 400 and not AutoRun.objects.exists()
    page = response.content.decode()
    assert "Choose one of your team&#x27;s device classes for auto mode." in page


def test_the_version_page_lists_a_failed_run_by_its_outcome_not_done(run, client, alice):
    failed_build(run, "fp32")
    auto.advance(run)
    client.login(username="alice", password=PASSWORD)

    page = client.get(run.model_version.get_absolute_url()).content.decode()

    assert '<span class="badge red">The only build failed</span>' in page
    assert "The only build failed (Unsupported operator)." in page
    assert '<span class="badge green">Done</span>' not in page


def test_it_does_not_blame_the_tolerance_when_a_build_within_it_was_left_out(run):
    measured_build(run, "fp32", p50=2.0, agreement=0.5)
    hollow = measured_build(run, "int8", p50=1.9, int8=True)
    hollow.engine.graph_report = {"quantized_nodes": 0}
    hollow.engine.save()

    _, run = ranked(run)

    assert run.outcome == "nothing_eligible" and run.outcome_label == "Nothing to recommend"
    assert run.summary == (
        "No build within the accuracy tolerance could be recommended (see why below)."
    )


def test_it_says_when_preflight_left_no_build_to_try(run):
    skipped_build(run, "fp16", SKIP_REASON)
    skipped_build(run, "int8", SKIP_REASON)

    run = auto.advance(run)

    assert run.outcome == "nothing_tried" and run.outcome_color == "red"
    assert run.summary == "No build could be tried: all 2 were skipped (see why below)."
