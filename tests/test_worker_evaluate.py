"""The evaluate job's comparison of an engine with its FP32 source (real ONNX Runtime)."""

import numpy as np
import pytest

from tests.evaluation_inputs import MODEL, VALIDATION, session_runner
from workers.checks.evaluate import evaluate
from workers.errors import JobError


def test_the_source_against_itself_agrees_exactly():
    result = evaluate(session_runner(MODEL), MODEL, VALIDATION, {"max_samples": 100})
    assert result["samples"] == 100 and result["top1_agreement"] == 1.0
    assert result["max_abs_error"] == 0.0 and result["cosine_min"] == pytest.approx(1.0)
    assert result["engine"]["top1"] == result["reference"]["top1"] > 0.9


def test_a_wrong_engine_shows_in_every_metric():
    run = session_runner(MODEL)
    shuffled = lambda feeds: [np.roll(run(feeds)[0], 1, axis=1)]  # noqa: E731
    result = evaluate(shuffled, MODEL, VALIDATION, {"max_samples": 50})
    assert result["top1_agreement"] < 0.2 and result["engine"]["top1"] < 0.3
    assert result["max_abs_error"] > 1.0 and result["cosine_min"] < 0.9


def test_without_labels_only_agreement_is_measured(tmp_path):
    inputs = np.load(VALIDATION, allow_pickle=False)["inputs"][:10]
    path = tmp_path / "unlabelled.npz"
    np.savez(path, inputs=inputs)
    result = evaluate(session_runner(MODEL), MODEL, path, {})
    assert result["reference"] == {"top1": None, "top5": None}
    assert result["top1_agreement"] == 1.0


def test_an_output_of_another_shape_is_refused():
    with pytest.raises(JobError, match=r"output 0 has shape \[1, 3\], the source's \[1, 10\]"):
        evaluate(lambda feeds: [np.zeros((1, 3))], MODEL, VALIDATION, {"max_samples": 2})
