"""The task registry the evaluate job scores with: classification by default, others by name."""

import numpy as np
import pytest

from tests.conftest import ASSETS
from tests.evaluation_inputs import MODEL, VALIDATION, session_runner
from workers.checks.evaluate import evaluate, task_of
from workers.errors import JobError
from workers.tasks import TASKS, Headline, Task, register
from workers.tasks.classification import Classification


@pytest.fixture
def registry():
    """TASKS, put back as it was after the test: a test may register a task of its own."""
    saved = dict(TASKS)
    yield TASKS
    TASKS.clear()
    TASKS.update(saved)


def test_classification_is_registered_with_top1_as_its_headline():
    task = TASKS["classification"]
    assert task.labelled.key == "top1" and task.labelled_keys == ("top1", "top5")
    objects = [{"scores": np.array([0.1, 0.9, 0.0])}, {"scores": np.array([0.8, 0.1, 0.1])}]
    assert task.score(objects, {"labels": np.array([1, 2])}, {}) == {"top1": 0.5, "top5": 1.0}


def test_an_evaluation_names_its_task_and_keeps_the_classification_keys():
    result = evaluate(session_runner(MODEL), MODEL, VALIDATION, {"max_samples": 20})
    assert result["task"] == "classification" and result["metric"] == "top1"
    assert result["agreement_metric"] == "top1_agreement"
    assert result["agreement"] == {"top1_agreement": result["top1_agreement"]}
    assert set(result["reference"]) == {"top1", "top5"} == set(result["engine"])


def test_a_new_task_is_one_registered_class(registry):
    @register
    class Agreeing(Classification):
        name = "top1-error"
        labelled = Headline("agreeing", True, "agreeing")
        labelled_keys = ("agreeing",)

        def score(self, objects, labels, params):
            best = [found["scores"].argmax() for found in objects]
            return {"agreeing": float(np.mean(np.array(best) == labels["labels"]))}

    result = evaluate(
        session_runner(MODEL), MODEL, VALIDATION, {"max_samples": 20, "task": "top1-error"}
    )

    assert result["task"] == "top1-error" and result["metric"] == "agreeing"
    assert result["engine"] == result["reference"] and 0.5 < result["engine"]["agreeing"] <= 1


def test_a_task_registered_twice_raises(registry):
    with pytest.raises(ValueError, match="already registered"):
        register(Classification)


def test_a_headline_outside_the_keys_raises(registry):
    class Segmentation(Task):
        name = "segmentation"
        labelled = Headline("miou", True, "mIoU")
        labelled_keys = ("pixel_accuracy",)

    with pytest.raises(ValueError, match="headline"):
        register(Segmentation)


def test_an_unknown_task_is_refused_by_name():
    with pytest.raises(JobError, match="no metric is registered for the task 'depth'"):
        task_of({"task": "depth"}, None)


def test_labels_that_are_not_class_indices_need_a_task(tmp_path):
    inputs = np.load(ASSETS / "validation.npz", allow_pickle=False)["inputs"][:4]
    path = tmp_path / "boxes.npz"
    np.savez(path, inputs=inputs, labels=np.zeros((4, 4), np.float32))
    with pytest.raises(JobError, match="say which task"):
        evaluate(session_runner(MODEL), MODEL, path, {})
