"""The evaluate job with a task: a real ONNX detector and segmenter, run by ONNX Runtime.

The detector pools an 80 x 80 image into a 10 x 10 grid: each cell is an anchor with a
fixed 12 px box and a class score per channel (its mean brightness), so its detections,
and the labels that match them, can be worked out with numpy alone.
"""

import json

import numpy as np
import onnxruntime
import pytest
from onnx import numpy_helper

from tests.feeds_models import FLOAT, node, save, value
from workers.checks.evaluate import evaluate
from workers.errors import JobError
from workers.measure import feeds

SIZE, CELL, CLASSES = 80, 8, 3
GRID = SIZE // CELL
BOX = 12
SAMPLES = 6
DECLARATION = {"task": "detection", "params": {"head": "anchors_last"}}
KEYS = {
    "samples",
    "max_abs_error",
    "mean_abs_error",
    "max_rel_error",
    "mean_rel_error",
    "cosine_min",
    "cosine_mean",
    "output_max_abs_errors",
    "task",
    "params",
    "agreement",
    "agreement_metric",
    "metric",
    "reference",
    "engine",
    "top1_agreement",
}


def grid_boxes():
    """Return the [A, 4] cxcywh box of every anchor, row by row."""
    rows, columns = np.divmod(np.arange(GRID * GRID), GRID)
    centres = np.stack([columns, rows], axis=1) * CELL + CELL / 2
    return np.concatenate([centres, np.full((GRID * GRID, 2), BOX)], axis=1).astype(np.float32)


def detector(path):
    """Save a YOLOv8-shaped detector: images [1, 3, 80, 80] -> output0 [1, 4+3, 100]."""
    nodes = [
        node(
            "AveragePool", ["images"], ["pooled"], kernel_shape=[CELL, CELL], strides=[CELL, CELL]
        ),
        node("Reshape", ["pooled", "flat"], ["means"]),
        node("Sub", ["means", "half"], ["centred"]),
        node("Mul", ["centred", "gain"], ["logits"]),
        node("Sigmoid", ["logits"], ["scores"]),
        node("Concat", ["boxes", "scores"], ["output0"], axis=1),
    ]
    constants = {
        "flat": np.array([1, CLASSES, GRID * GRID], np.int64),
        "half": np.array(0.5, np.float32),
        "gain": np.array(8.0, np.float32),
        "boxes": grid_boxes().T[None],
    }
    initializers = [numpy_helper.from_array(array, name) for name, array in constants.items()]
    inputs = [value("images", FLOAT, [1, CLASSES, SIZE, SIZE])]
    outputs = [value("output0", FLOAT, [1, 4 + CLASSES, GRID * GRID])]
    return save(path, nodes, inputs, outputs, initializers)


def grid_labels(images):
    """Return every cell's box (xyxy) labelled with its brightest channel, worked out in numpy."""
    means = images.reshape(len(images), CLASSES, GRID, CELL, GRID, CELL).mean(axis=(3, 5))
    classes = means.argmax(axis=1).reshape(len(images), -1)
    centres = grid_boxes()[:, :2]
    boxes = np.concatenate([centres - BOX / 2, centres + BOX / 2], axis=1)
    return {
        "label_boxes": np.tile(boxes, (len(images), 1)).astype(np.float32),
        "label_classes": classes.reshape(-1).astype(np.int64),
        "label_sample": np.repeat(np.arange(len(images)), len(boxes)),
    }


@pytest.fixture
def detection(tmp_path):
    """Return (model, labelled dataset, unlabelled dataset) for the detector."""
    images = np.random.default_rng(7).random((SAMPLES, CLASSES, SIZE, SIZE), dtype=np.float32)
    labelled, unlabelled = tmp_path / "labelled.npz", tmp_path / "unlabelled.npz"
    np.savez(labelled, inputs=images, **grid_labels(images))
    np.savez(unlabelled, inputs=images)
    return detector(tmp_path / "detector.onnx"), labelled, unlabelled


def runner(path, change=None):
    """Return run(feeds) -> outputs of a real session, each output passed through change."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda fed: [change(out) if change else out for out in session.run(None, fed)]


def shifted(output):
    """Return a YOLO output with every box's centre 10 px to the right."""
    output = output.copy()
    output[:, 0] += 10
    return output


def test_a_detector_against_itself_agrees_and_scores_its_labels(detection):
    model, labelled, _ = detection

    result = evaluate(runner(model), model, labelled, {"task": DECLARATION})

    assert set(result) == KEYS and result["samples"] == SAMPLES
    assert result["task"] == "detection" and result["params"]["classes"] == CLASSES
    assert result["agreement_metric"] == "f1" and result["metric"] == "map"
    assert result["agreement"]["f1"] == 1.0 and result["agreement"]["mean_iou"] == 1.0
    assert result["top1_agreement"] is None
    assert result["reference"] == result["engine"] == {"map": 1.0, "map50": 1.0}
    assert json.loads(json.dumps(result, allow_nan=False)) == result  # what the hub receives


def test_a_detector_whose_boxes_moved_disagrees_and_scores_lower(detection):
    model, labelled, _ = detection

    result = evaluate(runner(model, shifted), model, labelled, {"task": DECLARATION})

    assert result["agreement"]["f1"] < 0.99
    assert json.loads(json.dumps(result, allow_nan=False)) == result
    assert result["engine"]["map"] < result["reference"]["map"] == 1.0
    assert result["max_abs_error"] == pytest.approx(10.0)


def test_without_labels_a_detector_is_only_compared(detection):
    model, _, unlabelled = detection

    result = evaluate(runner(model), model, unlabelled, {"task": "detection"})

    assert result["params"]["head"] == "anchors_last"  # read from the output's shape
    assert result["agreement"]["f1"] == 1.0
    assert result["reference"] == result["engine"] == {"map": None, "map50": None}


def test_labels_of_samples_past_max_samples_are_left_out(detection):
    model, labelled, _ = detection

    result = evaluate(runner(model), model, labelled, {"task": DECLARATION, "max_samples": 2})

    assert result["samples"] == 2 and result["reference"]["map"] == 1.0


def test_a_declaration_that_does_not_fit_the_model_fails_the_job_naming_the_param(detection):
    model, labelled, _ = detection
    declaration = {"task": "detection", "params": {"head": "anchors_last", "output": "boxes"}}

    with pytest.raises(JobError, match="param 'output' names no output of the model: 'boxes'"):
        evaluate(runner(model), model, labelled, {"task": declaration})


def segmenter(path):
    """Save a model whose per-pixel class scores are its input: [1, 3, 16, 16] both."""
    inputs = [value("images", FLOAT, [1, 3, 16, 16])]
    outputs = [value("logits", FLOAT, [1, 3, 16, 16])]
    return save(path, [node("Identity", ["images"], ["logits"])], inputs, outputs)


def test_a_segmenter_is_measured_by_mask_iou_and_miou(tmp_path):
    images = np.random.default_rng(2).random((5, 3, 16, 16), dtype=np.float32)
    dataset = tmp_path / "masks.npz"
    np.savez(dataset, inputs=images, label_masks=images.argmax(axis=1).astype(np.uint8))
    model = segmenter(tmp_path / "segmenter.onnx")
    declaration = {"task": "semantic_segmentation", "params": {}}

    def favour_class_0(output):
        output = output.copy()
        output[:, 0] += 0.3
        return output

    same = evaluate(runner(model), model, dataset, {"task": declaration})
    other = evaluate(runner(model, favour_class_0), model, dataset, {"task": declaration})

    assert same["agreement"] == {"mask_iou_mean": 1.0, "pixel_agreement": 1.0}
    assert same["reference"] == same["engine"] == {"miou": 1.0, "pixel_accuracy": 1.0}
    assert other["agreement"]["mask_iou_mean"] < 0.9 and other["engine"]["miou"] < 0.9
    assert other["metric"] == "miou" and other["agreement_metric"] == "mask_iou_mean"


MODEL_IO = {"inputs": [{"name": "x", "dtype": "float", "shape": ["N", 2]}], "contract": None}


def test_a_dataset_keeps_the_labels_of_its_first_samples(tmp_path):
    path = tmp_path / "labels.npz"
    np.savez(
        path,
        inputs=np.zeros((5, 2), np.float32),
        label_boxes=np.arange(20, dtype=np.float32).reshape(5, 4),
        label_classes=np.array([3, 1, 2, 0, 4]),
        label_sample=np.array([0, 1, 1, 4, 2]),
        label_texts=np.array(["a", "b", "c", "d", "e"]),
    )

    _, labels = feeds.load_dataset(path, MODEL_IO, max_samples=2)

    assert labels["label_sample"].tolist() == [0, 1, 1]
    assert labels["label_classes"].tolist() == [3, 1, 2]
    assert labels["label_boxes"][:, 0].tolist() == [0, 4, 8]
    assert labels["label_texts"].tolist() == ["a", "b"]


def test_a_dataset_without_labels_has_none(tmp_path):
    path = tmp_path / "plain.npz"
    np.savez(path, inputs=np.zeros((3, 2), np.float32))
    assert feeds.load_dataset(path, MODEL_IO)[1] is None


def test_boxes_without_the_sample_they_belong_to_are_refused(tmp_path):
    path = tmp_path / "boxes.npz"
    np.savez(path, inputs=np.zeros((3, 2), np.float32), label_boxes=np.zeros((4, 4), np.float32))
    with pytest.raises(JobError, match="no 1-D integer 'label_sample'"):
        feeds.load_dataset(path, MODEL_IO)
