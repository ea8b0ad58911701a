"""Semantic segmentation: a class per pixel; mask IoU with FP32, mIoU against labelled masks.

Logits [N, C, H, W] are read by their argmax over C; labels [N, H, W] as they are. The
labelled mIoU comes from one confusion matrix over the whole set (ignore_index skipped).
"""

import numpy as np

from workers.tasks.base import (
    Headline,
    Task,
    TaskError,
    choice,
    known,
    output_param,
    output_rows,
    register,
    shape_of,
    whole,
)

LAYOUTS = ("logits", "labels")
IGNORE_INDEX = 255


@register
class SemanticSegmentation(Task):
    """A class map per sample: mean per-image mask IoU vs FP32; mIoU with labels."""

    name = "semantic_segmentation"
    label = "Semantic segmentation"
    agreement = Headline("mask_iou_mean", True, "mask IoU vs FP32")
    labelled = Headline("miou", True, "mIoU")
    labelled_keys = ("miou", "pixel_accuracy")
    label_arrays = ("label_masks",)
    params = ("output", "layout", "classes", "ignore_index")

    def normalise(self, params, outputs):
        params = super().normalise(params, outputs)
        output = output_param(self.name, params, outputs)
        shape = shape_of(output)
        layout = params.get("layout", "labels" if len(shape) == 3 else "logits")
        filled = {"output": output["name"], "layout": layout}
        choice(self.name, filled, "layout", LAYOUTS)
        rank = 4 if layout == "logits" else 3
        if shape and len(shape) != rank:
            raise TaskError(
                f"{self.name} layout {layout} reads an output of {rank} dimensions "
                f"({'[N, C, H, W]' if rank == 4 else '[N, H, W]'}); {output['name']!r} has "
                f"shape {shape}"
            )
        filled["classes"] = _classes(self.name, params, shape, layout)
        filled["ignore_index"] = whole(
            self.name, {"ignore_index": IGNORE_INDEX, **params}, "ignore_index"
        )
        return filled

    def decode(self, outputs, names, params, batch, real):
        rows = output_rows(outputs, names, params["output"], batch, real)
        if params["layout"] == "logits":
            return [{"mask": _compact(np.asarray(row).argmax(axis=0))} for row in rows]
        return [{"mask": _compact(np.asarray(row))} for row in rows]

    def agree(self, reference, candidate, params):
        ious, same, pixels = [], 0, 0
        for ours, theirs in zip(reference, candidate, strict=True):
            ious.append(image_iou(ours["mask"], theirs["mask"]))
            same += int(np.sum(ours["mask"] == theirs["mask"]))
            pixels += ours["mask"].size
        return {
            "mask_iou_mean": float(np.mean(ious)) if ious else None,
            "pixel_agreement": same / pixels if pixels else None,
        }

    def score(self, objects, labels, params):
        matrix = confusion(objects, labels["label_masks"], params)
        return matrix_scores(matrix)


def _classes(task, params, shape, layout):
    """Return the number of classes: declared, or the channel axis of logits (None: unknown)."""
    channels = shape[1] if layout == "logits" and shape and known(shape[1]) else None
    classes = params.get("classes", channels)
    if classes is not None:
        whole(task, {"classes": classes}, "classes", 1)
    if None not in (classes, channels) and classes != channels:
        raise TaskError(f"{task} param 'classes' is {classes} but the logits have {channels}")
    return classes


def _compact(mask):
    """Return a class map in the smallest integer type that holds it (memory: one per sample)."""
    mask = np.asarray(mask)
    if mask.dtype.kind not in "iu":
        mask = np.rint(mask).astype(np.int64)
    if mask.size and mask.min() >= 0 and mask.max() < 256:
        return mask.astype(np.uint8)
    return mask.astype(np.int32)


def image_iou(first, second):
    """Return the mean IoU over the classes present in either mask (1.0 for empty masks)."""
    classes = np.union1d(np.unique(first), np.unique(second))
    ious = [
        np.sum((first == value) & (second == value)) / np.sum((first == value) | (second == value))
        for value in classes
    ]
    return float(np.mean(ious)) if ious else 1.0


def resized(mask, shape):
    """Return a label mask at another size, by nearest neighbour (pixel centres)."""
    mask = np.asarray(mask)
    if mask.shape == tuple(shape):
        return mask
    rows = _nearest(mask.shape[0], shape[0])
    columns = _nearest(mask.shape[1], shape[1])
    return mask[rows[:, None], columns[None, :]]


def _nearest(source, target):
    """Return the source index nearest each target pixel's centre along one axis."""
    return np.minimum(((np.arange(target) + 0.5) * source / target).astype(np.int64), source - 1)


def confusion(objects, masks, params):
    """Return the confusion matrix [label, prediction] over every sample, ignore_index left out."""
    pairs = [
        (resized(label, found["mask"].shape).reshape(-1), found["mask"].reshape(-1))
        for found, label in zip(objects, masks, strict=True)
    ]
    labels = np.concatenate([label for label, _ in pairs]).astype(np.int64)
    predicted = np.concatenate([mask for _, mask in pairs]).astype(np.int64)
    kept = labels != params["ignore_index"]
    labels, predicted = labels[kept], predicted[kept]
    size = max(
        params["classes"] or 0, int(labels.max(initial=-1)) + 1, int(predicted.max(initial=-1)) + 1
    )
    return np.bincount(labels * size + predicted, minlength=size * size).reshape(size, size)


def matrix_scores(matrix):
    """Return miou (over classes in the labels or predictions) and pixel_accuracy."""
    hits = np.diag(matrix).astype(np.float64)
    union = matrix.sum(axis=0) + matrix.sum(axis=1) - hits
    present = union > 0
    total = matrix.sum()
    return {
        "miou": float(np.mean(hits[present] / union[present])) if present.any() else None,
        "pixel_accuracy": float(hits.sum() / total) if total else None,
    }
