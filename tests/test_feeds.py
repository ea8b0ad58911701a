"""One place makes every feed: models we did not write, benchmarked, evaluated and calibrated.

Each model (tests/feeds_models.py) has what feeds must handle: an int64 input, a
bool input, uint8 and float16 inputs, a batch fixed at 2, an input without a
batch axis (1-D, scalar), two inputs and two outputs, dynamic height and width
with a contract range. The worker gets the version's model_io (signature and
contract) as the hub's claim answer carries it, or nothing (then the model's
own inputs decide).
"""

from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime
import pytest

from tests.feeds_models import (
    FLOAT,
    batch_entry,
    bool_mask,
    dynamic_height_width,
    fixed_batch_of_two,
    int64_ids,
    node,
    one_dimensional,
    save,
    scaled_by_a_scalar,
    two_in_two_out,
    uint8_and_float16,
    value,
    weight,
)
from workers.backends import tensorrt_plan
from workers.backends.isolate import CompileFailure, run_isolated
from workers.backends.onnxruntime import OnnxRuntimeBackend
from workers.backends.openvino import OpenVinoBackend
from workers.checks.evaluate import evaluate
from workers.checks.golden import evaluate_golden
from workers.errors import JobError
from workers.measure import feeds, side_by_side
from workers.measure.benchmark import benchmark_onnxruntime

FEW = {"warmup_iterations": 2, "iterations": 10}
SAMPLES = 5  # odd: a batch of 2 ends with a padded batch
RNG = np.random.default_rng(5)


@dataclass(frozen=True)
class Case:
    """A model, the contract its version has (None: none), a dataset and the batch fed."""

    name: str
    build: object
    contract: dict | None
    dataset: dict
    batch: int


def floats(*shape):
    return RNG.standard_normal((SAMPLES, *shape)).astype(np.float32)


HW = {"2": {"min": 8, "opt": 16, "max": 32}, "3": {"min": 8, "opt": 12, "max": 32}}
CASES = [
    # ids stored as int32: any integer type is cast to the input's int64 on the worker.
    Case("int64", int64_ids, None, {"inputs": RNG.integers(0, 10, (SAMPLES, 4), np.int32)}, 1),
    Case(
        "bool",
        bool_mask,
        {
            "inputs": {
                "x": batch_entry(["batch", 8], {"sizes": [1, 2, 4]}),
                "keep": batch_entry(["batch", 3], {"sizes": [1, 2, 4]}),
            }
        },
        {"x": floats(8), "keep": RNG.random((SAMPLES, 3)) < 0.5},
        1,
    ),
    Case(
        "uint8-float16",
        uint8_and_float16,
        None,
        {
            "pixels": RNG.integers(0, 256, (SAMPLES, 8), np.uint8),
            "gain": (RNG.random((SAMPLES, 8)) / 100).astype(np.float16),
        },
        1,
    ),
    Case(
        "fixed-batch-2",
        fixed_batch_of_two,
        {"inputs": {"x": batch_entry(["batch", 8], {"sizes": [2]})}},
        {"inputs": floats(8)},
        2,
    ),
    Case(
        "one-dimensional",
        one_dimensional,
        {"inputs": {"x": batch_entry([8], None)}},
        {"inputs": floats(8)},
        1,
    ),
    Case(
        "scalar",
        scaled_by_a_scalar,
        {
            "inputs": {
                "x": batch_entry(["batch", 8], {"sizes": [1]}),
                "s": batch_entry([], None),
            }
        },
        {"x": floats(8), "s": RNG.random(SAMPLES).astype(np.float32)},
        1,
    ),
    Case("two-in-two-out", two_in_two_out, None, {"a": floats(8), "b": floats(8)}, 1),
    Case(
        "dynamic-hw",
        dynamic_height_width,
        {"inputs": {"x": batch_entry(["batch", 3, "H", "W"], {"min": 2, "opt": 2, "max": 4}, HW)}},
        {"inputs": floats(3, 16, 12)},
        2,
    ),
]


def prepare(case, tmp_path):
    """Return (model path, model_io as the hub sends it, dataset path) for a case."""
    model = case.build(tmp_path / f"{case.name}.onnx")
    model_io = {**feeds.model_io_from_onnx(model), "contract": case.contract}
    dataset = tmp_path / f"{case.name}.npz"
    np.savez(dataset, **case.dataset)
    return model, model_io, dataset


def session_runner(path):
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda fed: session.run(None, fed)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_it_benchmarks_and_evaluates_a_model_as_its_signature_and_contract_say(case, tmp_path):
    model, model_io, dataset = prepare(case, tmp_path)

    benchmarked = benchmark_onnxruntime(model, FEW, model_io=model_io)
    evaluated = evaluate(session_runner(model), model, dataset, {}, model_io=model_io)

    assert benchmarked["batch_size"] == case.batch and benchmarked["iterations"] == 10
    assert evaluated["samples"] == SAMPLES
    assert evaluated["max_abs_error"] == 0.0 and evaluated["top1_agreement"] == 1.0
    assert evaluated["output_max_abs_errors"] == [0.0] * len(onnx.load(str(model)).graph.output)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_it_calibrates_int8_builds_on_every_input_of_the_dataset(case, tmp_path):
    model, model_io, dataset = prepare(case, tmp_path)
    int8 = {"precision": "int8", "calibration_samples": 4}
    (tmp_path / "ort").mkdir()
    (tmp_path / "ov").mkdir()

    ort_build = OnnxRuntimeBackend().compile(
        model, int8, tmp_path / "ort", calibration=dataset, model_io=model_io
    )
    ov_build = OpenVinoBackend().compile(
        model, int8, tmp_path / "ov", calibration=dataset, model_io=model_io
    )

    names = ", ".join(spec["name"] for spec in model_io["inputs"])
    assert f"calibration: 4 samples of {names}" in ort_build.log
    batches = 4 // case.batch  # a model with an input without a batch axis: one row a run
    assert (
        f"4 calibration samples (asked 4, the dataset has 5) in {batches} batches" in ov_build.log
    )
    engine = OnnxRuntimeBackend().load(ort_build.artifact, int8)
    run_engine = lambda fed: engine.run(None, fed)  # noqa: E731
    evaluated = evaluate(run_engine, model, dataset, {}, model_io=model_io)
    assert evaluated["samples"] == SAMPLES and np.isfinite(evaluated["max_abs_error"])


def test_it_pads_the_last_batch_of_a_fixed_batch_by_repeating_its_samples():
    model_io = {"inputs": [{"name": "x", "dtype": "float", "shape": [2, 1]}], "contract": None}
    rows = np.arange(3, dtype=np.float32)[:, None]

    batches = list(feeds.dataset_batches({"x": rows}, model_io))

    assert [(fed["x"].ravel().tolist(), real) for fed, real in batches] == [
        ([0.0, 1.0], 2),
        ([2.0, 2.0], 1),
    ]


def test_a_padded_last_batch_keeps_its_samples_in_dataset_order():
    model_io = {"inputs": [{"name": "x", "dtype": "float", "shape": [4, 1]}], "contract": None}
    rows = np.arange(7, dtype=np.float32)[:, None]  # the last batch starts at row 4: 3 real

    batches = list(feeds.dataset_batches({"x": rows}, model_io))

    # its outputs are matched to rows 4, 5, 6 (and their labels) in this order
    assert [(fed["x"].ravel().tolist(), real) for fed, real in batches] == [
        ([0.0, 1.0, 2.0, 3.0], 4),
        ([4.0, 5.0, 6.0, 4.0], 3),
    ]


def test_it_feeds_the_smallest_batch_the_contract_allows_when_one_is_not():
    contract = {"inputs": {"x": batch_entry(["batch", 8], {"sizes": [4, 2, 8]})}}
    model_io = {
        "inputs": [{"name": "x", "dtype": "float", "shape": ["N", 8]}],
        "contract": contract,
    }

    assert feeds.batch_sizes(model_io, "x") == [2, 4, 8]
    assert feeds.default_batch(model_io) == 2
    assert feeds.synthetic_feeds(model_io)["x"].shape == (2, 8)
    with pytest.raises(JobError, match="contract of 'x' allows batch sizes 2, 4, 8"):
        feeds.synthetic_feeds(model_io, batch=3)


def test_it_says_which_array_a_dataset_for_several_inputs_lacks(tmp_path):
    model, model_io, _ = prepare(CASES[6], tmp_path)
    dataset = tmp_path / "one-array.npz"
    np.savez(dataset, inputs=np.zeros((3, 8), np.float32))

    with pytest.raises(JobError, match="one array per input, named after it \\(no array for 'a'"):
        evaluate(session_runner(model), model, dataset, {}, model_io=model_io)


def test_it_refuses_fractions_for_an_integer_input(tmp_path):
    model, model_io, _ = prepare(CASES[0], tmp_path)
    dataset = tmp_path / "fractions.npz"
    np.savez(dataset, inputs=np.full((3, 4), 0.5, np.float32))

    with pytest.raises(JobError, match="'ids' holds float32 values; the input takes int64"):
        evaluate(session_runner(model), model, dataset, {}, model_io=model_io)


def test_it_times_engines_side_by_side_at_the_batch_the_model_fixes(tmp_path):
    model = fixed_batch_of_two(tmp_path / "b2.onnx")
    load = lambda: onnxruntime.InferenceSession(str(model))  # noqa: E731

    result = side_by_side.compare(
        {"a": load, "b": load}, {"rounds": 2, "duration_s": 0.05, "warmup_s": 0}
    )

    assert result["batch_size"] == 2 and {e["engine"] for e in result["engines"]} == {"a", "b"}


def test_it_checks_golden_pairs_stored_in_another_integer_type(tmp_path):
    model, model_io, _ = prepare(CASES[0], tmp_path)
    ids = np.array([[1, 2, 3, 4]], dtype=np.int32)
    [expected] = session_runner(model)({"ids": ids.astype(np.int64)})
    golden = tmp_path / "golden.npz"
    np.savez(golden, ids=ids[None], y=expected[None])
    params = {"input_names": ["ids"], "output_names": ["y"]}

    result = evaluate_golden(session_runner(model), model, golden, params, model_io=model_io)

    assert result["passed"] and result["reference"]["passed"]


def test_it_smoke_tests_a_build_at_the_height_and_width_its_contract_gives(tmp_path):
    nodes = [node("Conv", ["x", "w"], ["y"])]  # 3x3, no padding: 1x1 images are too small
    inputs, outputs = (
        [value("x", FLOAT, ["N", 3, "H", "W"])],
        [value("y", FLOAT, ["N", 4, "h", "w"])],
    )
    model = save(tmp_path / "conv.onnx", nodes, inputs, outputs, [weight("w", 4, 3, 3, 3)])
    contract = {"inputs": {"x": batch_entry(["batch", 3, "H", "W"], {"sizes": [1]}, HW)}}
    model_io = {**feeds.model_io_from_onnx(model), "contract": contract}
    kwargs = {"backend": "onnxruntime", "artifact": str(model), "build_config": {}}

    ran = run_isolated(
        "workers.backends.isolate.smoke_test",
        {**kwargs, "source": str(model), "model_io": model_io},
        timeout=120,
    )

    assert ran["inputs"] == {"x": [1, 3, 16, 12]} and ran["outputs"] == [[1, 4, 14, 10]]


def test_it_keeps_every_line_of_onnx_runtimes_error_in_the_failure(tmp_path):
    model, model_io, _ = prepare(CASES[3], tmp_path)
    lying = {**model_io, "inputs": [{"name": "x", "dtype": "float", "shape": ["N", 8]}]}
    kwargs = {"backend": "onnxruntime", "artifact": str(model), "build_config": {}}

    with pytest.raises(CompileFailure) as failed:
        run_isolated(
            "workers.backends.isolate.smoke_test",
            {**kwargs, "source": str(model), "model_io": {**lying, "contract": None}},
            timeout=120,
        )

    message = str(failed.value)
    assert "for the following indices" in message and "Got: 1 Expected: 2" in message
    assert "\n" not in message


def test_it_plans_tensorrt_calibration_for_every_network_input(tmp_path):
    network = [
        {"name": "image", "shape": [-1, 3, 8, 8], "dtype": "float32"},
        {"name": "ids", "shape": [-1, 4], "dtype": "int32"},
    ]
    contract = {
        "inputs": {
            "image": batch_entry(["batch", 3, 8, 8], {"sizes": [2, 4]}),
            "ids": batch_entry(["batch", 4], {"sizes": [2, 4]}),
        }
    }
    dataset = tmp_path / "calibration.npz"
    np.savez(dataset, image=np.zeros((9, 3, 8, 8)), ids=np.ones((9, 4), np.int64))
    model_io = tensorrt_plan.network_model_io(network, contract)

    batch, batches, shapes = tensorrt_plan.calibration_feeds(dataset, model_io, 512)

    assert batch == 4 and len(batches) == 2  # 9 samples: two whole batches of 4
    assert shapes == {"image": (4, 3, 8, 8), "ids": (4, 4)}
    assert batches[0]["image"].dtype == np.float32 and batches[0]["ids"].dtype == np.int32


def test_it_refuses_a_batch_for_a_model_without_a_batch_axis(tmp_path):
    model, model_io, _ = prepare(CASES[4], tmp_path)

    with pytest.raises(JobError, match="batch_size is 4 but no input of the model has a batch"):
        benchmark_onnxruntime(model, {**FEW, "batch_size": 4}, model_io=model_io)
