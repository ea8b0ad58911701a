"""Timing engines side by side: real ONNX Runtime sessions of models doing more or less work."""

import onnxruntime
import pytest

from tests.benchmark_models import matmul_chain
from workers.errors import Cancelled, JobError
from workers.measure import side_by_side

QUICK = {"rounds": 4, "duration_s": 0.4, "warmup_s": 0.05}


def session(path):
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.fixture
def light(tmp_path):
    return session(matmul_chain(tmp_path / "light.onnx", width=128, layers=2))


@pytest.fixture
def heavy(tmp_path):
    return session(matmul_chain(tmp_path / "heavy.onnx", width=128, layers=40))


def test_the_model_doing_twenty_times_the_work_comes_out_slower(light, heavy):
    result = side_by_side.compare({"9": lambda: heavy, "4": lambda: light}, QUICK)

    assert result["fastest"] == "4" and not result["tied"]
    assert [figures["engine"] for figures in result["engines"]] == ["4", "9"]
    assert result["lead"] > 3
    for figures in result["engines"]:
        assert figures["best_round_ms"] <= figures["median_round_ms"] <= figures["worst_round_ms"]
        assert figures["runs_per_round"] >= side_by_side.MIN_RUNS_PER_SLICE
    assert result["rounds"] == 4 and result["batch_size"] == 1


class OrderRecordingTestSession:
    """Wraps a real session and notes, in a shared list, which engine ran (a test double)."""

    def __init__(self, name, real, order):
        self.name, self.real, self.order = name, real, order

    def get_inputs(self):
        return self.real.get_inputs()

    def run(self, names, feeds):
        if not self.order or self.order[-1] != self.name:
            self.order.append(self.name)
        return self.real.run(names, feeds)


def test_each_round_starts_with_the_next_engine_so_none_always_runs_first(light, heavy, tmp_path):
    order = []
    third = session(matmul_chain(tmp_path / "third.onnx", width=128, layers=4))
    loaders = {
        name: (lambda name=name, real=real: OrderRecordingTestSession(name, real, order))
        for name, real in (("a", light), ("b", heavy), ("c", third))
    }

    side_by_side.compare(loaders, {**QUICK, "rounds": 3, "warmup_s": 0})

    measured = order[3:]  # after each engine's warm-up, in turn
    assert measured == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_it_feeds_every_engine_the_batch_asked_for(tmp_path):
    model = matmul_chain(tmp_path / "m.onnx", width=16, layers=1)
    seen = []

    class ShapeRecordingTestSession(OrderRecordingTestSession):
        def run(self, names, feeds):
            seen.append(feeds["x"].shape)
            return self.real.run(names, feeds)

    loaders = {
        name: (lambda name=name: ShapeRecordingTestSession(name, session(model), []))
        for name in "ab"
    }
    side_by_side.compare(loaders, {**QUICK, "batch_size": 8})

    assert set(seen) == {(8, 16)}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"rounds": 1}, "rounds must be at least 2"),
        ({"duration_s": 0}, "duration_s must be above 0"),
        ({"batch_size": "eight"}, "batch_size must be a whole number"),
    ],
)
def test_it_refuses_params_it_cannot_run_before_loading_anything(params, message):
    loaded = []
    loaders = {name: (lambda name=name: loaded.append(name)) for name in "ab"}

    with pytest.raises(JobError, match=message):
        side_by_side.compare(loaders, params)
    assert loaded == []


def test_it_needs_two_engines(light):
    with pytest.raises(JobError, match="needs two engines or more, got 1"):
        side_by_side.compare({"a": lambda: light}, QUICK)


def test_it_stops_between_slices_when_asked(light, heavy):
    with pytest.raises(Cancelled):
        side_by_side.compare(
            {"a": lambda: light, "b": lambda: heavy}, QUICK, should_stop=lambda: True
        )
