"""Detections of a candidate matched to the FP32 source's, and how well they agree.

Matching is greedy by score: each candidate detection, best first, takes the unmatched
source detection of its class that it overlaps most, at IoU >= 0.5. Images where neither
has a detection agree and add nothing to the counts.
"""

import numpy as np

from workers.tasks.base import mean_or_none
from workers.tasks.boxes import iou_matrix

MATCH_IOU = 0.5
# A keypoint counts in the pixel error when the source sees it at least this surely.
VISIBLE = 0.5


def match(reference, candidate, threshold=MATCH_IOU):
    """Return (candidate index, reference index, IoU) of each matched pair of one image."""
    ious = iou_matrix(candidate["boxes"], reference["boxes"])
    ious[
        np.asarray(candidate["classes"])[:, None] != np.asarray(reference["classes"])[None, :]
    ] = -1
    taken = np.zeros(ious.shape[1], dtype=bool)
    pairs = []
    for index in np.argsort(-np.asarray(candidate["scores"]), kind="stable"):
        row = np.where(taken, -1.0, ious[index])
        if row.size and row.max() >= threshold:
            best = int(row.argmax())
            taken[best] = True
            pairs.append((int(index), best, float(row[best])))
    return pairs


def matches(reference, candidate):
    """Return the matched pairs of every image, reference and candidate side by side."""
    return [match(ours, theirs) for ours, theirs in zip(reference, candidate, strict=True)]


def detection_agreement(reference, candidate, pairs, threshold=0.0):
    """Return precision, recall, f1, mean_iou and score_error of candidate against reference.

    Only detections scoring above threshold count: precision is the share of the
    candidate's that match one of the source's, recall the share of the source's that
    match one of the candidate's. Their match may score a little under the threshold (the
    decoders keep a margin below it), so a borderline box that one side keeps and the other
    drops by a hair is no disagreement. A share with nothing to count is 1.0 when the other
    side has none either, else 0.0; mean_iou and score_error are None without pairs.
    """
    counted = [
        (theirs["scores"][i] > threshold, ours["scores"][j] > threshold, iou, i, j)
        for ours, theirs, image in zip(reference, candidate, pairs, strict=True)
        for i, j, iou in image
    ]
    shown = sum(int(np.sum(np.asarray(found["scores"]) > threshold)) for found in candidate)
    wanted = sum(int(np.sum(np.asarray(found["scores"]) > threshold)) for found in reference)
    precision = _share(sum(1 for c, _, _, _, _ in counted if c), shown, wanted)
    recall = _share(sum(1 for _, r, _, _, _ in counted if r), wanted, shown)
    kept = [pair for pair in counted if pair[0] or pair[1]]
    return {
        "precision": precision,
        "recall": recall,
        "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "mean_iou": mean_or_none([iou for _, _, iou, _, _ in kept]),
        "score_error": _score_error(reference, candidate, pairs, threshold),
    }


def _score_error(reference, candidate, pairs, threshold):
    """Return the mean score difference of matched pairs either side counts (None if none)."""
    return mean_or_none(
        [
            abs(float(theirs["scores"][i]) - float(ours["scores"][j]))
            for ours, theirs, image in zip(reference, candidate, pairs, strict=True)
            for i, j, _ in image
            if theirs["scores"][i] > threshold or ours["scores"][j] > threshold
        ]
    )


def _share(part, whole, other):
    """Return part / whole; with nothing to divide by, 1.0 when other is 0 too, else 0.0."""
    if whole:
        return part / whole
    return 1.0 if other == 0 else 0.0


def mask_iou(reference, candidate, pairs):
    """Return the mean IoU of the masks of matched pairs (None without pairs)."""
    return mean_or_none(
        [
            _mask_iou(ours["masks"][j], theirs["masks"][i])
            for ours, theirs, image in zip(reference, candidate, pairs, strict=True)
            for i, j, _ in image
        ]
    )


def _mask_iou(first, second):
    """Return the IoU of two boolean masks (1.0 when both are empty)."""
    union = np.logical_or(first, second).sum()
    return float(np.logical_and(first, second).sum() / union) if union else 1.0


def keypoint_error(reference, candidate, pairs):
    """Return the mean pixel distance of matched pairs' keypoints the source sees (None if none)."""
    distances = []
    for ours, theirs, image in zip(reference, candidate, pairs, strict=True):
        for i, j, _ in image:
            source, engine = ours["keypoints"][j], theirs["keypoints"][i]
            seen = source[:, 2] >= VISIBLE
            distances.extend(np.hypot(*(engine[seen, :2] - source[seen, :2]).T))
    return mean_or_none(distances)
