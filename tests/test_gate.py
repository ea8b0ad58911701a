"""`deployhub gate`'s rules, on plain dicts shaped as the hub's results JSON (no hub, no network).

GET models/<id>/results lists benchmark runs (benchmark_json) and accuracy runs
(accuracy_row); GET auto-runs/<id> the run's builds and its recommendation.
"""

import json

import pytest
from click.testing import CliRunner

from deployhub_client.cli import cli
from deployhub_client.gate import Gate, gate, parse_ref, percent
from deployhub_client.judge import (
    EXIT_CODES,
    ClassReport,
    Limits,
    Outcome,
    Status,
    best_of_version,
    candidate_of,
    judge,
    markdown,
    measured,
    outcome_of,
    overall,
    undecided,
)

LIMITS = Limits(p99_regression=0.05, accuracy_drop=0.5, memory_growth=0.10)


def benchmark(p99=10.0, stable=True, rss=100.0, **more):
    row = {
        "id": 1,
        "engine": 7,
        "version": 1,
        "version_id": 11,
        "device_class": "edge-cpu",
        "backend": "onnxruntime",
        "precision": "fp32",
        "scenario": "single-stream",
        "batch_size": 1,
        "latency_p99_ms": p99,
        "server_p99_ms": None,
        "stable": stable,
        "gate": {"verdict": "meets" if stable else "unstable", "reason": ""},
        "peak_rss_mb": rss,
        "peak_device_memory_mb": None,
        "gpu": None,
        "created_at": "2025-01-01T00:00:00+00:00",
    }
    return {**row, **more}


def accuracy(top1=0.95, dataset="validation", **more):
    row = {
        "id": 1,
        "engine": 7,
        "dataset": dataset,
        "metric": "top1",
        "engine_metric": top1,
        "within_tolerance": True,
        "created_at": "2025-01-01T00:00:00+00:00",
    }
    return {**row, **more}


def build(p99=10.0, stable=True, rss=100.0, top1=0.95, **more):
    return {"benchmark": benchmark(p99, stable, rss, **more), "accuracy": accuracy(top1)}


def verdicts(candidate, baseline, limits=LIMITS):
    return {v.criterion: v for v in judge(candidate, baseline, limits)}


def test_a_faster_equally_accurate_smaller_build_passes_every_criterion():
    found = verdicts(build(p99=8.0, rss=90.0), build(p99=10.0, rss=100.0))

    assert {v.status for v in found.values()} == {Status.PASS}
    assert found["p99 latency"].change == "-20.0%"
    assert (
        found["p99 latency"].candidate == "8.000 ms"
        and found["p99 latency"].baseline == "10.000 ms"
    )
    assert found["accuracy"].change == "+0.00 points"
    assert outcome_of(list(found.values())) == Outcome.PASSED


def test_a_stable_slowdown_over_the_limit_fails_and_one_within_it_passes():
    slower = verdicts(build(p99=10.6), build(p99=10.0))["p99 latency"]
    assert slower.status == Status.FAIL and slower.change == "+6.0%"
    assert "5%" in slower.reason

    within = verdicts(build(p99=10.4), build(p99=10.0))["p99 latency"]
    assert within.status == Status.PASS


def test_a_slowdown_an_unstable_measurement_cannot_tell_from_noise_is_within_noise():
    for candidate, baseline in [
        (build(12.0, stable=False), build(10.0)),
        (build(12.0), build(10.0, stable=False)),
    ]:
        found = verdicts(candidate, baseline)
        assert found["p99 latency"].status == Status.NOISE
        assert "unstable" in found["p99 latency"].reason
        assert outcome_of(list(found.values())) == Outcome.PASSED


def test_the_hubs_unstable_gate_verdict_counts_as_noise_even_without_the_flag():
    candidate = build(12.0, stable=None)
    candidate["benchmark"]["gate"] = {"verdict": "unstable", "reason": "measure again"}
    assert verdicts(candidate, build(10.0))["p99 latency"].status == Status.NOISE


def test_a_gap_of_twice_the_p99_fails_however_unstable_the_measurement():
    found = verdicts(build(p99=20.0, stable=False), build(p99=10.0, stable=False))

    assert found["p99 latency"].status == Status.FAIL
    assert outcome_of(list(found.values())) == Outcome.FAILED


def test_the_server_scenarios_p99_is_the_one_compared():
    candidate = build(p99=1.0, scenario="server", server_p99_ms=30.0)
    assert verdicts(candidate, build(p99=10.0))["p99 latency"].status == Status.FAIL


def test_accuracy_may_drop_by_the_limit_in_points_and_not_more():
    assert verdicts(build(top1=0.946), build(top1=0.95))["accuracy"].status == Status.PASS
    lost = verdicts(build(top1=0.94), build(top1=0.95))["accuracy"]
    assert lost.status == Status.FAIL and lost.change == "-1.00 points"


def test_for_an_error_rate_lower_is_better():
    def cer(value):
        return {**build(), "accuracy": accuracy(metric="cer", engine_metric=value)}

    assert verdicts(cer(0.05), cer(0.04))["accuracy"].status == Status.FAIL
    assert verdicts(cer(0.03), cer(0.04))["accuracy"].status == Status.PASS


def test_accuracy_without_labels_or_on_another_dataset_cannot_be_judged():
    unlabelled = {**build(), "accuracy": accuracy(metric=None, engine_metric=None)}
    other_set = {**build(), "accuracy": accuracy(dataset="holdout")}
    for candidate in (unlabelled, other_set, {**build(), "accuracy": None}):
        found = verdicts(candidate, build())
        assert found["accuracy"].status == Status.UNKNOWN
        assert outcome_of(list(found.values())) == Outcome.UNDECIDED


def test_peak_memory_may_grow_by_the_limit_and_a_gpu_run_is_judged_on_device_memory():
    assert verdicts(build(rss=109.0), build(rss=100.0))["peak memory"].status == Status.PASS
    assert verdicts(build(rss=111.0), build(rss=100.0))["peak memory"].status == Status.FAIL
    gpu = {"gpu": {"name": "H100"}, "peak_device_memory_mb": 500.0}
    bigger = verdicts(
        build(rss=10.0, **gpu), build(rss=100.0, gpu=gpu["gpu"], peak_device_memory_mb=400.0)
    )
    assert bigger["peak memory"].status == Status.FAIL and bigger["peak memory"].change == "+25.0%"


def test_a_missing_figure_makes_the_criterion_unknown_not_failed():
    found = verdicts(build(rss=None), build())
    assert found["peak memory"].status == Status.UNKNOWN


def test_a_failure_blocks_the_merge_even_when_another_class_is_undecided():
    failed = ClassReport("a", Outcome.FAILED)
    passed = ClassReport("b", Outcome.PASSED)
    offline = undecided("c", "no device online in c")

    assert overall([passed, failed, offline]) == Outcome.FAILED
    assert overall([passed, offline]) == Outcome.UNDECIDED
    assert overall([passed]) == Outcome.PASSED
    codes = [EXIT_CODES[o] for o in (Outcome.PASSED, Outcome.FAILED, Outcome.UNDECIDED)]
    assert codes == [0, 1, 2]


def results_json():
    """Two versions on edge-cpu: v1's engines 7 (slow) and 8 (fast but out of tolerance)."""
    return {
        "versions": [{"id": 11, "number": 1}, {"id": 12, "number": 2}],
        "benchmarks": [
            benchmark(p99=10.0, id=1, engine=7, created_at="2025-01-01T00:00:00+00:00"),
            benchmark(p99=9.0, id=2, engine=7, created_at="2025-01-02T00:00:00+00:00"),
            benchmark(p99=9.5, id=3, engine=7, batch_size=8, created_at="2025-01-03T00:00:00"),
            benchmark(p99=2.0, id=4, engine=8),
            benchmark(p99=5.0, id=5, engine=9, version=2, version_id=12),
            benchmark(p99=1.0, id=6, engine=7, device_class="server-gpu"),
        ],
        "accuracy": [
            accuracy(id=1, engine=7, top1=0.95),
            accuracy(id=2, engine=8, top1=0.80, within_tolerance=False),
            accuracy(id=3, engine=9, top1=0.96),
        ],
    }


def test_the_baseline_is_the_engines_latest_run_like_the_candidates():
    results = results_json()
    like = {"benchmark": benchmark(batch_size=1), "accuracy": accuracy()}

    found = measured(results, 7, "edge-cpu", like=like)

    assert found["benchmark"]["id"] == 2  # the latest at batch 1, not the batch-8 run
    assert found["accuracy"]["id"] == 1
    assert measured(results, 7, "edge-cpu")["benchmark"]["id"] == 3  # no preference: latest
    assert measured(results, 42, "edge-cpu") is None


def test_a_version_named_with_against_stands_for_its_fastest_build_within_tolerance():
    results = results_json()

    assert best_of_version(results, 11, "edge-cpu") == 7  # engine 8 is out of tolerance
    assert best_of_version(results, 11, "server-gpu") == 7
    assert best_of_version(results, 11, "nowhere") is None


def test_the_candidate_is_the_auto_runs_recommended_build_as_the_results_list_it():
    results = results_json()
    run = {
        "recommended": {"build": 31, "engine": 9},
        "builds": [
            {"id": 30, "benchmark": {"id": 4}, "accuracy": {"id": 2}},
            {"id": 31, "benchmark": {"id": 5}, "accuracy": {"id": 3}},
        ],
    }

    found = candidate_of(run, results)

    assert found["benchmark"]["id"] == 5 and found["accuracy"]["id"] == 3
    assert candidate_of({"recommended": None, "builds": []}, results) is None


def test_the_summary_names_the_outcome_each_criterion_and_why_a_class_was_not_judged():
    passed = ClassReport(
        "edge-cpu",
        Outcome.PASSED,
        candidate="v2 onnxruntime fp32 (engine #9)",
        baseline="v1 onnxruntime fp32 (engine #7)",
        verdicts=judge(build(p99=8.0), build(p99=10.0), LIMITS),
        run={"id": 5, "page": "http://hub/auto/5/"},
    )
    offline = undecided("server|gpu", "no device online in server|gpu")

    text = markdown("digits v2 against production", "production", LIMITS, [passed, offline])

    assert text.startswith("### DeployHub gate: digits v2 against production — ⚠️ could not decide")
    assert "| edge-cpu | p99 latency | 8.000 ms | 10.000 ms | -20.0% | ✅ pass: within 5% |" in text
    assert "server\\|gpu" in text and "no device online" in text
    assert "http://hub/auto/5/" in text


def test_limits_read_as_a_user_writes_them():
    assert percent(None, None, "5%") == pytest.approx(0.05)
    assert percent(None, None, "12.5") == pytest.approx(0.125)
    assert parse_ref("team/digits:cnn:3") == ("team/digits:cnn", 3)


def test_the_command_refuses_a_reference_without_a_version_and_a_negative_limit():
    runner = CliRunner()

    no_version = runner.invoke(gate, ["digits", "--class", "edge-cpu"])
    negative = runner.invoke(gate, ["digits:2", "--class", "a", "--max-p99-regression", "-3%"])

    assert no_version.exit_code == 2 and "MODEL:VERSION" in no_version.output
    assert negative.exit_code == 2 and "negative" in negative.output


class FakeHub:
    """The few calls the gate makes, answered from dicts (the hub's JSON shapes)."""

    url = "http://hub"

    def __init__(self, classes):
        self._classes = classes
        self.started = []

    def version(self, model, number):
        return {"id": 12, "model": 1, "number": number}

    def classes(self):
        return self._classes

    def auto(self, version, device_class, wait):
        self.started.append(device_class)
        raise AssertionError("no run may start while a class cannot be judged")


def test_a_class_with_no_device_online_exits_2_before_any_run_starts(monkeypatch, tmp_path):
    online = {"slug": "edge-cpu", "online_devices": ["cpu-1"]}
    hub = FakeHub([online, {"slug": "server-gpu", "online_devices": []}])
    asked = []
    monkeypatch.setattr("deployhub_client.gate.Hub", lambda *given: asked.append(given) or hub)
    summary = tmp_path / "gate.md"

    answer = CliRunner().invoke(
        cli,
        ["--url", "http://hub", "--token", "dhu_x", "--json", "gate", "digits:2"]
        + ["--class", "edge-cpu", "--class", "server-gpu", "--summary", str(summary)],
    )

    assert answer.exit_code == 2, answer.output
    assert asked == [("http://hub", "dhu_x")]  # the deployhub group's --url and --token
    body = json.loads(answer.output)  # the group's --json
    assert body["outcome"] == Outcome.UNDECIDED and body["exit_code"] == 2
    reasons = {c["device_class"]: c["reason"] for c in body["classes"]}
    assert "no device online in server-gpu" in reasons["server-gpu"]
    assert "not started" in reasons["edge-cpu"]
    assert hub.started == []
    assert "could not decide" in summary.read_text()


class FakeHubWithRuns(FakeHub):
    """FakeHub whose version already has auto runs (newest first), as the hub lists them."""

    def __init__(self, classes, runs):
        super().__init__(classes)
        self.runs = runs

    def auto_runs(self, version, device_class):
        return [run for run in self.runs if run["device_class"] == device_class]

    def auto_run(self, run):
        return next(each for each in self.runs if each["id"] == run)


def test_the_gate_waits_for_the_versions_newest_run_and_starts_one_only_where_none_is():
    runs = [{"id": 9, "device_class": "edge-cpu", "state": "running", "outcome": "running"}]
    runs.append({"id": 4, "device_class": "edge-cpu", "state": "done", "outcome": "recommended"})
    hub = FakeHubWithRuns([], runs)
    hub.auto = lambda version, slug, wait: hub.started.append(slug) or {"id": 10, "page": "/"}
    said = []
    gate = Gate(hub, hub.version("digits", 2), "production", None, said.append)

    assert gate.start("edge-cpu")["id"] == 9 and hub.started == []
    assert gate.start("server-gpu")["id"] == 10 and hub.started == ["server-gpu"]
    fresh = Gate(hub, hub.version("digits", 2), "production", None, said.append, new_run=True)
    assert fresh.start("edge-cpu")["id"] == 10 and hub.started == ["server-gpu", "edge-cpu"]


def test_the_gate_starts_again_where_the_newest_run_recommended_nothing():
    failed = {"id": 9, "device_class": "edge-cpu", "state": "done", "outcome": "all_failed"}
    done = {"id": 8, "device_class": "server-gpu", "state": "done", "outcome": "recommended"}
    hub = FakeHubWithRuns([], [failed, done])
    hub.auto = lambda version, slug, wait: hub.started.append(slug) or {"id": 10, "page": "/"}
    gate = Gate(hub, hub.version("digits", 2), "production", None, lambda text: None)

    assert gate.start("edge-cpu")["id"] == 10 and hub.started == ["edge-cpu"]
    assert gate.start("server-gpu")["id"] == 8 and hub.started == ["edge-cpu"]
