"""Golden pairs on the worker: reading both formats, and the np.isclose comparison."""

import numpy as np
import onnxruntime
import pytest

from tests.golden_models import (
    WRONG_BIAS,
    golden_inputs,
    golden_npz,
    golden_pb_zip,
    linear_model,
    run_model,
)
from workers.checks.golden import (
    GoldenFileError,
    check_golden,
    compare_output,
    evaluate_golden,
    read_golden,
    summary,
)

INPUTS, OUTPUTS = ["x"], ["logits", "features"]


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def session_runner(model):
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return lambda feeds: session.run(None, feeds)


def test_it_reads_npz_pairs_along_the_leading_axis(tmp_path):
    pairs = read_golden(write(tmp_path, "g.npz", golden_npz()), INPUTS, OUTPUTS)
    assert len(pairs) == 4
    feeds, expected = pairs[2]
    np.testing.assert_array_equal(feeds["x"], golden_inputs()[2])
    assert feeds["x"].shape == (1, 4) and set(expected) == {"logits", "features"}


def test_it_reads_onnx_test_data_named_or_by_position(tmp_path):
    for named in (True, False):
        path = write(tmp_path, f"g{named}.zip", golden_pb_zip(named=named, root=None))
        pairs = read_golden(path, INPUTS, OUTPUTS)
        assert len(pairs) == 3 and set(pairs[0][1]) == {"logits", "features"}
        np.testing.assert_array_equal(pairs[1][0]["x"], golden_inputs(3)[1])


def test_an_output_subset_is_checked_alone(tmp_path):
    path = write(tmp_path, "g.npz", golden_npz(features=None))
    assert set(read_golden(path, INPUTS, OUTPUTS)[0][1]) == {"logits"}


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"extra": np.zeros((4, 1))}, "'extra', which is neither an input nor an output"),
        ({"x": None}, "no array for the model input 'x'"),
        ({"logits": None, "features": None}, "holds no expected output"),
        ({"logits": np.zeros((3, 1, 3), np.float32)}, "disagree on the number of pairs"),
        ({"logits": np.array(["a", "b", "c", "d"])}, "golden pairs are numbers"),
        ({"logits": np.full((4, 1, 3), np.nan, np.float32)}, "NaN or infinite"),
    ],
)
def test_it_refuses_a_malformed_npz(tmp_path, arrays, message):
    with pytest.raises(GoldenFileError, match=message):
        read_golden(write(tmp_path, "g.npz", golden_npz(**arrays)), INPUTS, OUTPUTS)


def test_it_refuses_a_zip_bomb_before_reading(tmp_path):
    with pytest.raises(GoldenFileError, match="expands to"):
        read_golden(write(tmp_path, "g.npz", golden_npz()), INPUTS, OUTPUTS, max_bytes=100)


def test_the_right_model_reproduces_its_pairs_and_a_wrong_one_is_named(tmp_path):
    pairs = read_golden(write(tmp_path, "g.npz", golden_npz()), INPUTS, OUTPUTS)

    right = check_golden(session_runner(linear_model()), pairs, OUTPUTS, 1e-4, 1e-3)
    wrong = check_golden(session_runner(linear_model(WRONG_BIAS)), pairs, OUTPUTS, 1e-4, 1e-3)

    assert right["passed"] and right["failing"] == []
    assert not wrong["passed"] and wrong["failing"] == ["logits"]
    logits = next(o for o in wrong["outputs"] if o["name"] == "logits")
    assert logits["mismatched"] == 4 and logits["elements"] == 12
    assert logits["mismatched_fraction"] == pytest.approx(4 / 12)
    assert logits["max_abs_error"] == pytest.approx(0.2, abs=1e-6)


def test_it_follows_np_isclose_at_the_edge():
    expected = [np.array([1.0, 0.0], np.float32)]
    inside = [np.array([1.0 + 1e-4 + 0.9e-3, 0.9e-4], np.float32)]
    outside = [np.array([1.0, 1.2e-4], np.float32)]
    assert compare_output("y", inside, expected, 1e-4, 1e-3)["passed"]
    report = compare_output("y", outside, expected, 1e-4, 1e-3)
    assert not report["passed"] and report["mismatched"] == 1 and report["worst_pair"] == 0


def test_the_worst_pair_is_the_one_furthest_past_its_tolerance():
    expected = [np.zeros(3), np.zeros(3), np.full(3, 100.0)]
    actual = [np.zeros(3), np.full(3, 0.05), np.full(3, 100.06)]
    report = compare_output("y", actual, expected, 0.01, 1e-3)
    # Pair 2 is off by more (0.06) but its relative allowance (0.1) covers it; pair 1 is not.
    assert report["worst_pair"] == 1 and report["mismatched"] == 3
    assert report["max_abs_error"] == pytest.approx(0.06)


def test_a_wrong_shape_or_nan_fails_without_breaking_the_report():
    shape = compare_output("y", [np.zeros((1, 4))], [np.zeros((1, 3))], 1e-4, 1e-3)
    assert not shape["passed"] and "shape [1, 4]" in shape["shape_error"]
    nan = compare_output("y", [np.array([np.nan, 1.0])], [np.array([0.0, 1.0])], 1e-4, 1e-3)
    assert not nan["passed"] and nan["nonfinite"] == 1 and nan["max_abs_error"] == 0.0


def test_evaluate_golden_checks_the_fp32_source_too(tmp_path):
    import onnx

    source = tmp_path / "source.onnx"
    onnx.save(linear_model(), str(source))
    golden = write(tmp_path, "g.zip", golden_pb_zip())
    params = {"set": 7, "input_names": INPUTS, "output_names": OUTPUTS, "atol": 1e-4, "rtol": 1e-3}

    result = evaluate_golden(session_runner(linear_model(WRONG_BIAS)), source, golden, params)

    assert result["set"] == 7 and result["pairs"] == 3 and result["failing"] == ["logits"]
    assert result["reference"] == {"passed": True, "failing": []}
    line = summary(result)
    assert "not reproduced: 'logits'" in line and "the FP32 source reproduces them" in line


def test_outputs_of_the_expected_model_match_run_model():
    outputs = run_model(linear_model(), golden_inputs(2))
    assert outputs["logits"].shape == (2, 1, 3) and outputs["features"].shape == (2, 1, 4)
