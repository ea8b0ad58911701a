"""The ONNX Runtime benchmark: real sessions on tiny models built on the spot."""

import json
import time
from collections import namedtuple

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from workers import benchmark
from workers.benchmark import PeakRss, benchmark_onnxruntime, latency_summary, random_inputs
from workers.errors import Cancelled, JobError

FEW = {"warmup_iterations": 2, "iterations": 20}
PROTOCOL_KEYS = [
    "backend",
    "provider",
    "batch_size",
    "warmup_iterations",
    "iterations",
    "intra_op_threads",
    "latency_ms",
    "throughput_ips",
    "peak_rss_mb",
    "rss_growth_mb",
]
InputMeta = namedtuple("InputMeta", "name shape type")


def save_model(path, nodes, input_shape, output_shape, initializers=()):
    """Save a one-input, one-output float model and return its path."""
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def matmul_relu(tmp_path):
    """x[N, 8] @ w[8, 8] -> Relu, with a symbolic batch dimension N."""
    weight = np.eye(8, dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    initializers = [numpy_helper.from_array(weight, "w")]
    return save_model(tmp_path / "mm.onnx", nodes, ["N", 8], ["N", 8], initializers)


@pytest.fixture
def batch_of_four_only(tmp_path):
    """A model with a symbolic batch that only runs when fed exactly 4 rows."""
    shape = numpy_helper.from_array(np.array([4, 8], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
    ]
    return save_model(tmp_path / "four.onnx", nodes, ["N", 8], [4, 8], [shape])


def test_it_reports_the_protocol_fields_with_ordered_latencies(matmul_relu):
    result = benchmark_onnxruntime(matmul_relu, FEW)

    assert list(result) == PROTOCOL_KEYS
    assert result["backend"] == "onnxruntime"
    assert result["provider"] == "CPUExecutionProvider"
    latency = result["latency_ms"]
    assert list(latency) == ["min", "p50", "p90", "p95", "p99", "max", "mean", "std"]
    assert 0 < latency["min"] <= latency["p50"] <= latency["p90"] <= latency["p95"]
    assert latency["p95"] <= latency["p99"] <= latency["max"]
    assert latency["min"] <= latency["mean"] <= latency["max"]
    assert latency["std"] >= 0
    assert result["peak_rss_mb"] > 0
    assert 0 <= result["rss_growth_mb"] <= result["peak_rss_mb"]


def test_it_runs_exactly_the_requested_warmup_and_iterations(matmul_relu, monkeypatch):
    calls = []
    real_run = ort.InferenceSession.run
    monkeypatch.setattr(
        ort.InferenceSession,
        "run",
        lambda self, *a, **k: calls.append(1) or real_run(self, *a, **k),
    )

    result = benchmark_onnxruntime(matmul_relu, {"warmup_iterations": 3, "iterations": 37})

    assert len(calls) == 3 + 37
    assert (result["warmup_iterations"], result["iterations"]) == (3, 37)


def test_it_uses_the_defaults_of_the_protocol(matmul_relu):
    result = benchmark_onnxruntime(matmul_relu, {})

    assert result["batch_size"] == 1
    assert result["warmup_iterations"] == 10
    assert result["iterations"] == 100
    assert result["intra_op_threads"] == 0


def test_it_derives_throughput_from_mean_latency_and_batch(matmul_relu):
    result = benchmark_onnxruntime(matmul_relu, {**FEW, "batch_size": 3, "intra_op_threads": 1})

    mean_s = result["latency_ms"]["mean"] / 1000
    assert result["throughput_ips"] == pytest.approx(3 / mean_s, rel=1e-9)
    assert result["intra_op_threads"] == 1


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
    model = save_model(
        tmp_path / "b1.onnx", [helper.make_node("Relu", ["x"], ["y"])], [1, 8], [1, 8]
    )

    assert benchmark_onnxruntime(model, FEW)["batch_size"] == 1
    with pytest.raises(JobError, match="batch_size is 4 but the model's batch dimension is fixed"):
        benchmark_onnxruntime(model, {**FEW, "batch_size": 4})


@pytest.mark.parametrize("param", ["batch_size", "iterations"])
def test_it_refuses_params_below_one(matmul_relu, param):
    with pytest.raises(JobError, match=f"{param} must be at least 1"):
        benchmark_onnxruntime(matmul_relu, {param: 0})


def test_it_raises_cancelled_when_asked_to_stop(matmul_relu):
    checks = []

    def should_stop():
        checks.append(1)
        return len(checks) > 25

    with pytest.raises(Cancelled):
        benchmark_onnxruntime(matmul_relu, {"iterations": 100_000}, should_stop=should_stop)

    assert len(checks) == 26


def test_it_reports_progress_by_phase_and_not_per_iteration(matmul_relu):
    reports = []

    benchmark_onnxruntime(
        matmul_relu,
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


def test_it_sees_the_peak_memory_of_a_short_lived_allocation():
    if not benchmark._reset_high_water_mark():
        pytest.skip("this kernel does not let a process reset its peak RSS")

    with PeakRss() as rss:
        block = np.ones(64 * 2**20, dtype=np.uint8)
        del block

    assert rss.peak - rss.baseline >= 60 * 2**20


def test_it_samples_the_peak_memory_where_the_kernel_cannot_reset_it(monkeypatch, tmp_path):
    monkeypatch.setattr(benchmark, "PROC_CLEAR_REFS", tmp_path / "missing" / "clear_refs")

    with PeakRss(interval=0.005) as rss:
        assert rss._sampler is not None
        block = np.ones(64 * 2**20, dtype=np.uint8)
        time.sleep(0.05)  # several sampling intervals
        del block

    assert rss.peak - rss.baseline >= 60 * 2**20


def test_it_passes_the_selftest_command(capsys):
    from workers.cli import main

    status = main(["selftest", "--backend", "onnxruntime"])

    assert status == 0
    assert json.loads(capsys.readouterr().out)["backends"]["onnxruntime"]["ok"] is True
