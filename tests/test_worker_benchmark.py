"""The benchmark harness: real ONNX Runtime sessions on tiny models built on the spot."""

import json
import mmap
import os
import threading
import time

import numpy as np
import pytest
from onnx import helper

from tests.benchmark_models import (
    InputMeta,
    SleepyTestSession,
    count_session_runs,
    fixed_batch_of_one,
    matmul_relu,
    save_model,
)
from workers.errors import Cancelled, JobError
from workers.measure import benchmark
from workers.measure.benchmark import (
    PeakRss,
    benchmark_onnxruntime,
    benchmark_session,
    latency_summary,
    random_inputs,
    read_settings,
)

FEW = {"warmup_iterations": 2, "iterations": 20}
SHORT = {"warmup_s": 0.1, "duration_s": 0.2}
PROTOCOL_KEYS = [
    "backend",
    "provider",
    "batch_size",
    "intra_op_threads",
    "scenario",
    "warmup_iterations",
    "warmup_s",
    "iterations",
    "duration_s",
    "latency_ms",
    "latency_samples",
    "cv",
    "stability",
    "throughput_ips",
    "server",
    "offline",
    "batch_sweep",
    "peak_rss_mb",
    "rss_growth_mb",
    "host",
    "gpu",
]


@pytest.fixture
def model(tmp_path):
    return matmul_relu(tmp_path / "mm.onnx")


@pytest.fixture
def batch_of_four_only(tmp_path):
    """A model with a symbolic batch that only runs when fed exactly 4 rows."""
    from onnx import numpy_helper

    shape = numpy_helper.from_array(np.array([4, 8], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
    ]
    return save_model(tmp_path / "four.onnx", nodes, ["N", 8], [4, 8], [shape])


def test_it_reports_the_protocol_fields_with_ordered_latencies(model):
    result = benchmark_onnxruntime(model, FEW)

    assert list(result) == PROTOCOL_KEYS
    assert result["backend"] == "onnxruntime"
    assert result["provider"] == "CPUExecutionProvider"
    assert result["scenario"] == "single-stream"
    latency = result["latency_ms"]
    assert list(latency) == ["min", "p50", "p90", "p95", "p99", "max", "mean", "std"]
    assert 0 < latency["min"] <= latency["p50"] <= latency["p90"] <= latency["p95"]
    assert latency["p95"] <= latency["p99"] <= latency["max"]
    assert latency["min"] <= latency["mean"] <= latency["max"]
    assert result["cv"] == pytest.approx(latency["std"] / latency["mean"])
    assert result["peak_rss_mb"] > 0
    assert 0 <= result["rss_growth_mb"] <= result["peak_rss_mb"]
    assert (result["server"], result["offline"], result["batch_sweep"], result["gpu"]) == (
        (None,) * 4
    )


def test_it_judges_stability_with_its_reasons(model):
    stability = benchmark_onnxruntime(model, FEW)["stability"]

    assert list(stability) == ["stable", "reasons", "cv", "cv_core", "drift", "windows_p50_ms"]
    assert stability["stable"] == (stability["reasons"] == [])
    assert len(stability["windows_p50_ms"]) == 5
    assert stability["drift"] >= 0


def test_it_runs_exactly_the_requested_warmup_and_iterations(model, monkeypatch):
    calls = count_session_runs(monkeypatch)

    result = benchmark_onnxruntime(model, {"warmup_iterations": 3, "iterations": 37})

    assert len(calls) == 3 + 37
    assert (result["warmup_iterations"], result["iterations"]) == (3, 37)


def test_it_warms_up_and_measures_for_the_given_durations(model):
    started = time.monotonic()

    result = benchmark_onnxruntime(model, SHORT)

    assert 0.1 <= result["warmup_s"] < 0.25
    assert 0.2 <= result["duration_s"] < 0.35
    assert result["warmup_iterations"] >= 1 and result["iterations"] >= 10
    assert time.monotonic() - started < 2


def test_it_defaults_to_a_second_of_warm_up_and_three_of_measuring():
    settings = read_settings({})

    assert (settings.warmup_s, settings.duration_s) == (1.0, 3.0)
    assert (settings.warmup_iterations, settings.iterations) == (None, None)
    assert (settings.batch_size, settings.intra_op_threads) == (None, 0)  # the model decides
    assert (settings.scenario, settings.max_iterations) == ("single-stream", 100_000)
    assert (settings.cv_threshold, settings.drift_threshold) == (0.10, 0.10)


def test_it_warms_up_by_count_when_warmup_iterations_is_given(model):
    result = benchmark_onnxruntime(model, {**SHORT, "warmup_s": 30, "warmup_iterations": 4})

    assert result["warmup_iterations"] == 4
    assert result["warmup_s"] < 1


def test_it_caps_a_timed_measurement_at_max_iterations(model):
    result = benchmark_onnxruntime(model, {"warmup_s": 0, "duration_s": 60, "max_iterations": 50})

    assert result["iterations"] == 50
    assert result["duration_s"] < 5


def test_it_measures_a_slow_test_double_at_least_ten_times():
    slow = SleepyTestSession(lambda call: 0.02)

    result = benchmark_session(lambda settings: slow, {"warmup_s": 0, "duration_s": 0.05})

    assert result["iterations"] == 10
    assert result["duration_s"] >= 0.2


def test_it_derives_throughput_from_mean_latency_and_batch(model):
    result = benchmark_onnxruntime(model, {**FEW, "batch_size": 3, "intra_op_threads": 1})

    mean_s = result["latency_ms"]["mean"] / 1000
    assert result["throughput_ips"] == pytest.approx(3 / mean_s, rel=1e-9)
    assert result["intra_op_threads"] == 1


def test_it_describes_the_host_it_ran_on(model):
    host = benchmark_onnxruntime(model, {**FEW, "intra_op_threads": 1})["host"]

    assert host["logical_cpus"] == os.cpu_count()
    assert host["intra_op_threads"] == 1
    assert host["cpu_model"] is None or isinstance(host["cpu_model"], str)


def test_it_reports_onnxruntimes_default_threads_when_none_are_asked(model):
    host = benchmark_onnxruntime(model, FEW)["host"]

    assert 1 <= host["intra_op_threads"] <= os.cpu_count()


def test_it_feeds_the_requested_batch_size(batch_of_four_only):
    result = benchmark_onnxruntime(batch_of_four_only, {**FEW, "batch_size": 4})

    assert result["batch_size"] == 4
    with pytest.raises(Exception, match="(?i)reshape"):
        benchmark_onnxruntime(batch_of_four_only, {**FEW, "batch_size": 1})


def test_it_refuses_a_symbolic_dimension_other_than_batch(tmp_path):
    model = save_model(
        tmp_path / "h.onnx", [helper.make_node("Relu", ["x"], ["y"])], ["N", "H"], ["N", "H"]
    )

    with pytest.raises(JobError) as refused:
        benchmark_onnxruntime(model, FEW)

    message = str(refused.value)
    assert "'x'" in message and "'H'" in message and "position 1" in message


def test_it_refuses_a_batch_size_the_model_cannot_take(tmp_path):
    model = fixed_batch_of_one(tmp_path / "b1.onnx")

    assert benchmark_onnxruntime(model, FEW)["batch_size"] == 1
    with pytest.raises(JobError, match="batch_size is 4 but the model's batch dimension is fixed"):
        benchmark_onnxruntime(model, {**FEW, "batch_size": 4})


@pytest.mark.parametrize("param", ["batch_size", "iterations"])
def test_it_refuses_params_below_one(model, param):
    with pytest.raises(JobError, match=f"{param} must be at least 1"):
        benchmark_onnxruntime(model, {param: 0})


@pytest.mark.parametrize(
    "params, message",
    [
        ({"duration_s": 0}, "duration_s must be above 0"),
        ({"warmup_s": -1}, "warmup_s must be at least 0"),
        ({"iterations": 2.5}, "iterations must be a whole number, got 2.5"),
        ({"duration_s": "long"}, "duration_s must be a number, got 'long'"),
        ({"batch_size": True}, "batch_size must be a whole number, got True"),
        ({"cv_threshold": 0}, "cv_threshold must be above 0"),
        ({"scenario": "batch"}, "scenario must be one of single-stream, server, offline"),
        ({"cuda_graphs": "yes"}, "cuda_graphs must be true or false"),
        ({"budget_ms": 30}, "budget_ms applies to the server scenario only"),
        ({"target_qps": 30, "scenario": "offline"}, "target_qps applies to the server scenario"),
        ({"samples": 64}, "samples applies to the offline scenario only"),
        ({"scenario": "server", "target_qps": -5}, "target_qps must be above 0"),
    ],
)
def test_it_refuses_bad_params_saying_which_and_why(model, params, message):
    with pytest.raises(JobError, match=message):
        benchmark_onnxruntime(model, params)


def test_it_ignores_params_given_as_null(model):
    result = benchmark_onnxruntime(model, {**FEW, "budget_ms": None, "batch_sizes": None})

    assert result["server"] is None and result["batch_sweep"] is None


def test_it_refuses_cuda_graphs_on_the_cpu(model):
    with pytest.raises(JobError, match="cuda_graphs needs .* runs on CPUExecutionProvider"):
        benchmark_onnxruntime(model, {**FEW, "cuda_graphs": True})


class StopInPhase:
    """should_stop() that turns True `after` seconds into the phase progress names first."""

    def __init__(self, phase, after=0.3):
        self.phase, self.after, self.asked_at = phase, after, None

    def progress(self, fraction, message):
        if self.asked_at is None and message.startswith(self.phase):
            self.asked_at = time.monotonic() + self.after

    def __call__(self):
        return self.asked_at is not None and time.monotonic() >= self.asked_at


@pytest.mark.parametrize(
    "phase, params",
    [
        ("warm-up", {"warmup_s": 60}),
        ("measuring", {"warmup_s": 0, "iterations": 10**9}),
        ("measuring", {"warmup_s": 0, "duration_s": 60}),
        ("batch 2", {**FEW, "batch_sizes": [1, 2], "sweep_duration_s": 60}),
        ("server at", {**FEW, "scenario": "server", "target_qps": 5, "iterations": 200}),
        ("server at", {**FEW, "scenario": "server", "budget_ms": 1000, "search_s": 60}),
        ("offline", {**FEW, "scenario": "offline", "samples": 10**9}),
    ],
)
def test_it_stops_within_a_fraction_of_a_second_in_every_phase(model, phase, params):
    stop = StopInPhase(phase)

    with pytest.raises(Cancelled):
        benchmark_onnxruntime(model, params, progress=stop.progress, should_stop=stop)

    assert stop.asked_at is not None
    assert time.monotonic() - stop.asked_at < 0.5


def test_it_reports_progress_by_phase_and_not_per_iteration(model):
    reports = []

    benchmark_onnxruntime(
        model,
        {"warmup_iterations": 500, "iterations": 5000},
        progress=lambda fraction, message: reports.append((fraction, message)),
    )

    fractions = [fraction for fraction, _ in reports]
    assert fractions == sorted(fractions)
    assert reports[-1] == (1.0, "done")
    messages = [message for _, message in reports]
    assert messages.index("warm-up") < messages.index("measuring")
    assert 50 <= messages.count("measuring") <= 60
    assert len(reports) < 130


def test_it_names_each_phase_in_progress_that_only_moves_forward(model):
    reports = []
    params = {
        **FEW,
        "scenario": "server",
        "budget_ms": 50,
        "search_s": 0.5,
        "batch_sizes": [1, 8],
        "sweep_duration_s": 0.1,
    }

    benchmark_onnxruntime(model, params, progress=lambda *report: reports.append(report))

    fractions = [fraction for fraction, _ in reports]
    assert fractions == sorted(fractions) and 0 <= fractions[0] and fractions[-1] == 1.0
    messages = list(dict.fromkeys(message for _, message in reports))
    assert messages[:3] == ["loading model", "warm-up", "measuring"]
    assert {"batch 1", "batch 8"} <= set(messages)
    assert any(m.startswith("server at ") and m.endswith(" qps") for m in messages)
    assert any("p99 within 50 ms?" in m for m in messages)


def test_it_summarizes_latencies_like_numpy_linear_percentiles():
    samples_ns = [ms * 1_000_000 for ms in range(1, 11)]  # 1..10 ms

    summary = latency_summary(samples_ns)

    assert summary == pytest.approx(
        {
            "min": 1.0,
            "p50": 5.5,
            "p90": 9.1,
            "p95": 9.55,
            "p99": 9.91,
            "max": 10.0,
            "mean": 5.5,
            "std": np.sqrt(8.25),
        }
    )


def test_it_matches_numpy_percentiles_on_skewed_data():
    rng = np.random.default_rng(7)
    samples_ns = rng.lognormal(mean=13, sigma=0.5, size=999).astype(np.int64)
    ms = samples_ns / 1e6

    summary = latency_summary(samples_ns.tolist())

    for q in (50, 90, 95, 99):
        assert summary[f"p{q}"] == pytest.approx(np.percentile(ms, q))
    assert summary["std"] == pytest.approx(ms.std())


def test_it_builds_random_inputs_for_each_supported_dtype():
    types = ["float", "float16", "int64", "int32", "uint8", "bool"]
    metas = [InputMeta(f"in_{t}", ["batch", 3], f"tensor({t})") for t in types]

    feeds = random_inputs(metas, batch_size=5, seed=1)

    expected = [np.float32, np.float16, np.int64, np.int32, np.uint8, np.bool_]
    assert [feeds[m.name].dtype for m in metas] == [np.dtype(e) for e in expected]
    assert all(feeds[m.name].shape == (5, 3) for m in metas)
    assert random_inputs(metas, 5, seed=1)["in_float"].tolist() == feeds["in_float"].tolist()


def test_it_names_an_input_of_unsupported_type():
    with pytest.raises(JobError, match="'ids' has type tensor\\(string\\)"):
        random_inputs([InputMeta("ids", [1, 4], "tensor(string)")], batch_size=1)


def fresh_memory(size):
    """Return `size` bytes of newly mapped, touched memory.

    np.ones may reuse pages that earlier tests freed but the allocator kept resident,
    and then RSS does not move; a new anonymous mapping always adds its pages.
    """
    block = mmap.mmap(-1, size)
    block.write(b"\x01" * size)
    return block


def test_it_sees_the_peak_memory_of_a_short_lived_allocation():
    if not benchmark._reset_high_water_mark():
        pytest.skip("this kernel does not let a process reset its peak RSS")

    with PeakRss() as rss:
        fresh_memory(64 * 2**20).close()

    assert rss.peak - rss.baseline >= 60 * 2**20


def test_it_samples_the_peak_memory_where_the_kernel_cannot_reset_it(monkeypatch, tmp_path):
    monkeypatch.setattr(benchmark, "PROC_CLEAR_REFS", tmp_path / "missing" / "clear_refs")

    with PeakRss(interval=0.005) as rss:
        assert rss._sampler is not None
        block = fresh_memory(64 * 2**20)
        time.sleep(0.05)  # several sampling intervals
        block.close()

    assert rss.peak - rss.baseline >= 60 * 2**20


def test_it_leaves_no_thread_behind(model):
    before = threading.active_count()

    benchmark_onnxruntime(model, FEW)

    assert threading.active_count() == before


def test_it_passes_the_selftest_command(capsys):
    from workers.cli import main

    status = main(["selftest", "--backend", "onnxruntime"])

    assert status == 0
    assert json.loads(capsys.readouterr().out)["backends"]["onnxruntime"]["ok"] is True
