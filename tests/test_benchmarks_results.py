"""Benchmark runs: old and new result shapes, the serving-pattern gate, and where runs show."""

import pytest

from deployhub.benchmarks.gates import GateVerdict
from deployhub.benchmarks.models import BenchmarkRun, Scenario
from deployhub.devices.models import ServingPattern
from tests.benchmark_results import (
    LATENCY,
    NEW_RESULT,
    OLD_RESULT,
    SERVER_BLOCK,
    SWEEP,
    details_of,
    record_run,
    result,
)
from tests.conftest import PASSWORD


def test_it_records_a_result_from_an_old_worker(version, device_class):
    run = record_run(version, device_class, result(OLD_RESULT))
    assert run.scenario == Scenario.SINGLE_STREAM and run.scenario_label == "SingleStream"
    assert run.latency_p99_ms == 15.0 and run.iterations == 1000
    assert run.duration_s is None and run.warmup_s is None and run.cv is None
    assert run.stable is None and run.stability_label == "Not checked"
    assert run.server is None and run.batch_sweep == [] and run.gpu is None
    assert run.gate().verdict == GateVerdict.MEETS


def test_it_records_the_conditions_and_stability_of_a_new_result(version, device_class):
    run = record_run(version, device_class, result())
    run.refresh_from_db()
    assert (run.warmup_s, run.duration_s, run.iterations) == (2.0, 10.0, 1030)
    assert run.cv == 0.04 and run.stable is True and run.drift == 0.01
    assert run.stability["windows_p50_ms"] == [10.0, 10.1, 9.9]
    assert run.host_cpu_model == "Intel Xeon Test" and run.host_logical_cpus == 4
    assert run.stability_label == "Stable"


def test_it_records_server_offline_sweep_and_gpu_blocks(version, device_class):
    gpu = {
        "device": "NVIDIA H200",
        "e2e_ms": {"p50": 1.0},
        "compute_ms": {"p50": 0.8},
        "cuda_graphs": True,
        "peak_device_memory_mb": 812.5,
        "memory_source": "nvml",
    }
    server = record_run(
        version,
        device_class,
        result(scenario="server", server=SERVER_BLOCK, batch_sweep=SWEEP, gpu=gpu),
    )
    offline = record_run(
        version,
        device_class,
        result(
            scenario="offline", offline={"samples": 5000, "wall_s": 10.0, "throughput_ips": 500}
        ),
    )
    server.refresh_from_db()
    assert server.server_target_qps == 50.0 and server.server_achieved_qps == 49.6
    assert server.server_p99_ms == 21.0 and server.max_qps_in_budget == 80.0
    assert [row["qps"] for row in server.server["tried"]] == [50.0, 80.0, 120.0]
    assert [row["batch_size"] for row in server.batch_sweep] == [1, 8]
    assert server.sweep_rows[1]["per_image_ms"] == 5.0
    assert server.peak_device_memory_mb == 812.5 and server.peak_memory_mb == 812.5
    assert offline.offline_samples == 5000 and offline.gate_throughput_ips == 500.0


@pytest.mark.parametrize(
    "changes",
    [
        {"scenario": "burst"},
        {"server": [1, 2]},
        {"batch_sweep": [{"latency_ms": {}}]},
        {"cv": "high"},
        {"stability": {"reasons": "noisy"}},
        {"latency_ms": {"p50": 1.0}},
        {"latency_ms": {**NEW_RESULT["latency_ms"], "p99": float("nan")}},
        {"throughput_ips": None},
    ],
)
def test_it_refuses_a_malformed_result_and_stores_nothing(version, device_class, changes):
    with pytest.raises(ValueError, match="malformed benchmark result"):
        record_run(version, device_class, result(**changes))
    assert not BenchmarkRun.objects.exists()


def test_a_realtime_class_is_judged_on_p99_against_the_frame_budget(version, device_class):
    meets = record_run(version, device_class, result())
    misses = record_run(
        version, device_class, result(latency_ms={**NEW_RESULT["latency_ms"], "p99": 40.0})
    )
    assert meets.gate().verdict == GateVerdict.MEETS
    assert "p99 15.00 ms is within the 33.3 ms frame budget (30 fps)" in meets.gate().reason
    gate = misses.gate()
    assert gate.verdict == GateVerdict.MISSES and gate.color == "red"
    assert "p99 40.00 ms is over the 33.3 ms frame budget" in gate.reason


def test_a_server_run_is_judged_on_its_server_p99(version, device_class):
    server = {**SERVER_BLOCK, "latency_ms": {**SERVER_BLOCK["latency_ms"], "p99": 45.0}}
    run = record_run(version, device_class, result(scenario="server", server=server))
    gate = run.gate()
    assert gate.verdict == GateVerdict.MISSES and gate.reason.startswith("Server p99 45.00 ms")


def test_an_offline_run_cannot_judge_a_realtime_class(version, device_class):
    run = record_run(version, device_class, result(scenario="offline"))
    gate = run.gate()
    assert gate.verdict == GateVerdict.UNKNOWN and "SingleStream or Server" in gate.reason


def test_an_unstable_run_is_not_trusted(version, device_class):
    device_class.frame_budget_ms = 25.0  # p99 15 ms: within, but not by 2x
    device_class.save()
    stability = {"stable": False, "reasons": ["cv 0.21 is over 0.10", "p50 drifted 12%"]}
    run = record_run(version, device_class, result(stability=stability, cv=0.21))
    gate = run.gate()
    assert gate.verdict == GateVerdict.UNSTABLE and gate.color == "orange"
    assert "cv 0.21 is over 0.10; p50 drifted 12%" in gate.reason
    assert run.stability_label == "Unstable"


def test_an_unstable_run_far_within_the_budget_still_meets_it(version, device_class):
    device_class.frame_budget_ms = 33.3  # p99 15 ms: more than 2x within
    device_class.save()
    stability = {"stable": False, "reasons": ["the median drifted 14%"]}
    gate = record_run(version, device_class, result(stability=stability)).gate()
    assert gate.verdict == GateVerdict.MEETS
    assert "unstable (the median drifted 14%), but the margin is 2x or more" in gate.reason


@pytest.fixture
def batch_class(device_class):
    device_class.serving_pattern = ServingPattern.BATCH
    device_class.throughput_target_ips = 400.0
    device_class.batch_latency_ceiling_ms = 100.0
    device_class.save()
    return device_class


def test_a_batch_class_is_judged_on_throughput_with_a_latency_ceiling(version, batch_class):
    fast = record_run(version, batch_class, result(batch_size=8, throughput_ips=500.0))
    slow = record_run(version, batch_class, result(batch_size=8, throughput_ips=300.0))
    long = record_run(
        version,
        batch_class,
        result(
            batch_size=8,
            throughput_ips=500.0,
            latency_ms={**NEW_RESULT["latency_ms"], "p99": 150.0},
        ),
    )
    assert fast.gate().verdict == GateVerdict.MEETS
    assert "500.0 img/s meets the 400 img/s target at batch 8" in fast.gate().reason
    assert slow.gate().verdict == GateVerdict.MISSES
    assert "Throughput 300.0 img/s is below the 400 img/s target" in slow.gate().reason
    assert long.gate().verdict == GateVerdict.MISSES
    assert "per-batch p99 150.00 ms is over the 100 ms ceiling" in long.gate().reason.lower()


def test_a_batch_class_takes_the_offline_throughput(version, batch_class):
    offline = {"samples": 8000, "wall_s": 10.0, "throughput_ips": 800.0}
    run = record_run(
        version, batch_class, result(scenario="offline", throughput_ips=10.0, offline=offline)
    )
    assert run.gate().verdict == GateVerdict.MEETS and "800.0 img/s" in run.gate().reason


def test_a_batch_class_without_a_target_cannot_judge(version, batch_class):
    batch_class.throughput_target_ips = None
    batch_class.save()
    run = record_run(version, batch_class, result())
    assert run.gate().verdict == GateVerdict.UNKNOWN and "throughput target" in run.gate().reason


def test_memory_over_the_class_limit_misses(version, device_class):
    device_class.memory_limit_mb = 64
    device_class.save()
    run = record_run(version, device_class, result())
    gate = run.gate()
    assert gate.verdict == GateVerdict.MISSES
    assert gate.reason.startswith("Peak memory 80 MB is over the class's 64 MB limit.")


def test_the_version_page_shows_fps_gate_stability_and_scenario(
    client, alice, version, device_class
):
    stability = {"stable": False, "reasons": ["p50 drifted 12% between the first and last window"]}
    close_to_budget = {**LATENCY, "p99": 30.0}  # within 33.3 ms, not by 2x: noise could turn it
    unstable = record_run(
        version, device_class, result(stability=stability, latency_ms=close_to_budget)
    )
    server = record_run(version, device_class, result(scenario="server", server=SERVER_BLOCK))
    client.login(username="alice", password=PASSWORD)
    page = client.get(version.get_absolute_url()).content.decode()
    assert "Unstable: measure again" in page
    assert "Server p99 21.00 ms is within the 33.3 ms frame budget (30 fps)." in page
    assert ">33.3</strong></td>" in page and ">47.6</strong></td>" in page  # fps at p99: 30, 21 ms

    # The details of each run, as the page loads them when they are opened.
    unstable_details, server_details = details_of(client, unstable), details_of(client, server)
    assert "p50 drifted 12% between the first and last window" in unstable_details
    assert "SingleStream" in unstable_details and "Server" in server_details
    assert "highest rate within 33.3 ms: <strong>80.0 qps</strong>" in server_details
    assert "Server p99 21.00 ms is within the 33.3 ms frame budget (30 fps)." in server_details


def test_the_version_page_shows_throughput_and_per_batch_latency_of_batch_runs(
    client, alice, version, batch_class
):
    run = record_run(
        version, batch_class, result(batch_size=8, throughput_ips=500.0, batch_sweep=SWEEP)
    )
    client.login(username="alice", password=PASSWORD)
    page = client.get(version.get_absolute_url()).content.decode()
    assert "500.0 img/s" in page and "Meets budget" in page
    assert f"Details of run #{run.pk}: percentiles, stability, conditions, batch sweep" in page

    details = details_of(client, run)
    assert "per batch of 8: p50 10.00 ms, p99 15.00 ms" in details
    assert f"Batch sweep of run #{run.pk}: 2 sizes" in details


def test_the_job_page_of_a_benchmark_shows_its_result_and_verdict(
    client, alice, version, device_class
):
    run = record_run(version, device_class, result())
    client.login(username="alice", password=PASSWORD)

    page = client.get(run.job.get_absolute_url()).content.decode()

    assert 'id="benchmark-result"' in page and f'id="run-{run.pk}"' in page
    assert "p99 15.00 ms is within the 33.3 ms frame budget (30 fps)." in page
