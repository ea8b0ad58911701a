"""mAP of decoded detections against labelled boxes, by pycocotools' COCOeval (bbox).

The ground truth and the detections are built in memory (no files); COCOeval's prints go
nowhere. Image ids are sample indices + 1, category ids the class ids.
"""

import contextlib
import io

import numpy as np


def mean_average_precision(objects, labels):
    """Return {"map": mAP@0.5:0.95, "map50": mAP@0.5} of detections against labels.

    labels: label_boxes [M, 4] xyxy, label_classes [M], label_sample [M]. Both are None
    without a labelled box (nothing to measure); 0.0 without a detection.
    """
    truth = _truth(labels, len(objects))
    if not truth["annotations"]:
        return {"map": None, "map50": None}
    found = _detections(objects)
    if not found:
        return {"map": 0.0, "map50": 0.0}
    stats = _evaluate(truth, found)
    return {"map": _stat(stats[0]), "map50": _stat(stats[1])}


def _evaluate(truth, found):
    """Return COCOeval's summary stats for in-memory ground truth and detections."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        ground = COCO()
        ground.dataset = truth
        ground.createIndex()
        evaluation = COCOeval(ground, ground.loadRes(found), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return evaluation.stats


def _stat(value):
    """Return a COCOeval stat as a float, None where it could not measure (-1)."""
    return None if value < 0 else float(value)


def _truth(labels, count):
    """Return a COCO ground-truth dataset of count images and their labelled boxes."""
    boxes = np.asarray(labels["label_boxes"], dtype=np.float64).reshape(-1, 4)
    classes = np.asarray(labels["label_classes"]).astype(np.int64)
    samples = np.asarray(labels["label_sample"]).astype(np.int64)
    annotations = [
        {
            "id": index + 1,
            "image_id": int(sample) + 1,
            "category_id": int(label),
            "bbox": _xywh(box),
            "area": _xywh(box)[2] * _xywh(box)[3],
            "iscrowd": 0,
        }
        for index, (box, label, sample) in enumerate(zip(boxes, classes, samples, strict=True))
    ]
    return {
        "images": [{"id": index + 1} for index in range(count)],
        "annotations": annotations,
        "categories": [{"id": int(label)} for label in np.unique(classes)],
    }


def _detections(objects):
    """Return COCO results (image_id, category_id, bbox, score) of decoded detections."""
    return [
        {
            "image_id": index + 1,
            "category_id": int(label),
            "bbox": _xywh(box),
            "score": float(score),
        }
        for index, found in enumerate(objects)
        for box, score, label in zip(found["boxes"], found["scores"], found["classes"], strict=True)
    ]


def _xywh(box):
    """Return an xyxy box as COCO's [x, y, width, height]."""
    x1, y1, x2, y2 = (float(value) for value in box)
    return [x1, y1, x2 - x1, y2 - y1]
