"""The task-metric registry of the evaluate job: classification by default, others in one place."""

import numpy as np
import pytest

from tests.conftest import ASSETS
from tests.evaluation_inputs import MODEL, VALIDATION, session_runner
from workers import evaluate as evaluate_module
from workers.errors import JobError
from workers.evaluate import METRICS, evaluate, register_metric, task_of


@pytest.fixture
def registry(monkeypatch):
    """A copy of METRICS that a test may add to without touching the real one."""
    metrics = dict(METRICS)
    monkeypatch.setattr(evaluate_module, "METRICS", metrics)
    return metrics


def test_classification_is_registered_with_top1_as_its_headline():
    metric = METRICS["classification"]
    assert metric.headline == "top1" and metric.keys == ("top1", "top5")
    logits = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]])
    assert metric.compute(logits, np.array([1, 2])) == {"top1": 0.5, "top5": 1.0}


def test_an_evaluation_names_its_task_and_keeps_the_classification_keys():
    result = evaluate(session_runner(MODEL), MODEL, VALIDATION, {"max_samples": 20})
    assert result["task"] == "classification" and result["metric"] == "top1"
    assert set(result["reference"]) == {"top1", "top5"} == set(result["engine"])


def test_a_new_task_is_one_registered_function(registry):
    @register_metric("top1-error", headline="agreeing", keys=("agreeing",))
    def agreeing(outputs, labels):
        return {"agreeing": float(np.mean(outputs.argmax(1) == labels))}

    result = evaluate(
        session_runner(MODEL), MODEL, VALIDATION, {"max_samples": 20, "task": "top1-error"}
    )

    assert result["task"] == "top1-error" and result["metric"] == "agreeing"
    assert result["engine"] == result["reference"] and 0.5 < result["engine"]["agreeing"] <= 1


def test_a_task_registered_twice_raises(registry):
    with pytest.raises(ValueError, match="already registered"):
        register_metric("classification", headline="top1", keys=("top1",))


def test_a_headline_outside_the_keys_raises(registry):
    with pytest.raises(ValueError, match="headline"):
        register_metric("segmentation", headline="miou", keys=("pixel_accuracy",))


def test_an_unknown_task_is_refused_by_name():
    with pytest.raises(JobError, match="no metric is registered for the task 'detection'"):
        task_of({"task": "detection"}, None)


def test_labels_that_are_not_class_indices_need_a_task(tmp_path):
    inputs = np.load(ASSETS / "validation.npz", allow_pickle=False)["inputs"][:4]
    path = tmp_path / "boxes.npz"
    np.savez(path, inputs=inputs, labels=np.zeros((4, 4), np.float32))
    with pytest.raises(JobError, match="say which task"):
        evaluate(session_runner(MODEL), MODEL, path, {})
