"""Boxes in numpy: formats, IoU, and the per-class NMS that anchor-style detection heads need.

Our own NMS, not a runtime's: the FP32 source and the engine are decoded by the same code,
so a difference in their detections is a difference in their outputs.
"""

import numpy as np

BOX_FORMATS = ("cxcywh", "xyxy", "xywh")
# Candidates above the score threshold that NMS looks at, best first (YOLO's max_nms).
MAX_CANDIDATES = 30000


def to_xyxy(boxes, box_format):
    """Return [k, 4] boxes as x1, y1, x2, y2 from cxcywh (centre), xywh (corner) or xyxy."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if box_format == "xyxy":
        return boxes.copy()
    x, y, w, h = boxes.T
    if box_format == "cxcywh":
        x, y = x - w / 2, y - h / 2
    return np.stack([x, y, x + w, y + h], axis=1)


def areas(boxes):
    """Return the area of each xyxy box (0 for an inverted one)."""
    return np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)


def iou_matrix(first, second):
    """Return the IoU of every xyxy box of first [n, 4] with every one of second [m, 4]."""
    first, second = np.asarray(first).reshape(-1, 4), np.asarray(second).reshape(-1, 4)
    top_left = np.maximum(first[:, None, :2], second[None, :, :2])
    bottom_right = np.minimum(first[:, None, 2:], second[None, :, 2:])
    overlap = np.prod(np.clip(bottom_right - top_left, 0, None), axis=2)
    union = areas(first)[:, None] + areas(second)[None, :] - overlap
    return np.where(union > 0, overlap / np.where(union > 0, union, 1), 0.0)


def nms(boxes, scores, classes, iou_threshold, limit):
    """Return the indices greedy NMS keeps, class by class, best score first, at most limit.

    A box is dropped when its IoU with a kept box of its class is above iou_threshold.
    """
    order = np.argsort(-scores, kind="stable")[:MAX_CANDIDATES]
    kept = []
    for value in np.unique(classes[order]):
        kept.extend(_greedy(boxes, order[classes[order] == value], iou_threshold, limit))
    kept = np.asarray(kept, dtype=np.int64)
    return kept[np.argsort(-scores[kept], kind="stable")][:limit]


def _greedy(boxes, order, iou_threshold, limit):
    """Return the indices of one class that greedy NMS keeps, order being best first."""
    kept = []
    while order.size and len(kept) < limit:
        best, order = order[0], order[1:]
        kept.append(best)
        order = order[iou_matrix(boxes[best], boxes[order])[0] <= iou_threshold]
    return kept
