"""The labels a dataset holds for its model's task: which kind, and whether they will do.

A task is scored with class labels, boxes, masks or strings (or none). This module picks
the labels an upload holds for the version's task, refuses another task's, checks the
arrays (the names README.md's label table gives: labels, label_boxes, label_classes, label_sample,
label_keypoints, label_masks, label_texts), and says in a line what they hold. Reading
them from an image zip's files is label_formats.py's. datasets.py reports a LabelError as
a DatasetError.
"""

import numpy as np

KINDS = {
    "classification": "classes",
    "detection": "boxes",
    "keypoints": "boxes",
    "instance_segmentation": "boxes",
    "semantic_segmentation": "masks",
    "text_recognition": "texts",
    "embedding": None,
    "generic": None,
}
NOUNS = {
    "classification": "a classifier",
    "detection": "a detector",
    "keypoints": "a keypoint detector",
    "instance_segmentation": "an instance segmenter",
    "semantic_segmentation": "a semantic segmenter",
    "text_recognition": "a text recogniser",
    "embedding": "an embedding model",
    "generic": "a model without a labelled metric",
}
# The task labels of a kind are for when the version's task scores none.
KIND_TASKS = {
    "classes": "classification",
    "boxes": "detection",
    "masks": "semantic_segmentation",
    "texts": "text_recognition",
}
WHAT = {"classes": "class labels", "boxes": "boxes", "masks": "masks", "texts": "strings"}
FORMATS = {
    "classes": "class labels: labels.csv (filename,label) in the image zip, or a labels array "
    "in the .npz.",
    "boxes": "boxes: a COCO annotations.json or YOLO labels/*.txt in the image zip, or "
    "label_boxes, label_classes and label_sample arrays in the .npz.",
    "masks": "masks: masks/<image stem>.png (one class id per pixel, 255 = ignore) in the image "
    "zip, or a label_masks array in the .npz.",
    "texts": "strings: labels.txt (filename<TAB>text) or labels.csv (filename,text) in the image "
    "zip, or a label_texts array in the .npz.",
}
# The .npz arrays of each kind; boxes need the first three together.
ARRAYS = {
    "classes": ("labels",),
    "boxes": ("label_boxes", "label_classes", "label_sample", "label_keypoints"),
    "masks": ("label_masks",),
    "texts": ("label_texts",),
}
IGNORE = 255  # the class id of a mask pixel that is not scored
SUMMARY_LENGTH = 200  # Dataset.label_summary's max_length


class LabelError(ValueError):
    """The dataset's labels cannot be used; the message says why and what would do."""


def label_kind(task):
    """Return the kind of labels a task is scored with (None: it has no labelled metric)."""
    if task not in KINDS:
        raise LabelError(f"The version's task {task!r} is not one of {', '.join(KINDS)}.")
    return KINDS[task]


def needs_message(task):
    """Say what a validation dataset for the task must hold."""
    return f"A validation dataset for {NOUNS[task]} needs {FORMATS[label_kind(task)]}"


def labels_task(found, task, *, require_labels):
    """Return the task whose labels to read from what the upload holds, or None for none.

    found maps each kind of labels the upload holds to where (for the messages). Labels
    for another task than the version's are refused. A task without a labelled metric
    (embedding, generic) scores none, so it keeps any labels for what they are: the
    dataset is the model's, and a version with a labelled task may use them. Missing
    labels are refused for validation, except class labels, whose absence datasets.py
    reports in the words it always has.
    """
    want = label_kind(task)
    if want in found:
        return task
    if found and want is None:
        return KIND_TASKS[next(iter(found))]
    if found:
        kind, where = next(iter(found.items()))
        raise LabelError(
            f"The dataset holds {WHAT[kind]} ({where}), which are not labels for this "
            f"version's task: it is {NOUNS[task]} ({task}), whose labels are {FORMATS[want]}"
        )
    if require_labels and want not in (None, "classes"):
        raise LabelError(needs_message(task))
    return None


def kinds_in_npz(files):
    """Return {kind: the arrays that show it} for the label arrays an .npz holds."""
    found = {}
    for kind, names in ARRAYS.items():
        held = [name for name in names if name in files]
        if held:
            found[kind] = ", ".join(held)
    return found


# -- Checks on the label arrays, whichever way they came ---------------------------------


def check_targets(kind, targets, count):
    """Check the label arrays of a kind against count samples; return them in stored dtypes."""
    return {"boxes": _check_boxes, "masks": _check_masks, "texts": _check_texts}[kind](
        targets, count
    )


def _check_boxes(targets, count):
    missing = [name for name in ARRAYS["boxes"][:3] if name not in targets]
    if missing:
        raise LabelError(
            "label_boxes, label_classes and label_sample go together (one row per box); the "
            f".npz has no {' or '.join(missing)}."
        )
    boxes = _boxes(targets["label_boxes"])
    checked = {
        "label_boxes": boxes,
        "label_classes": _per_box(targets["label_classes"], "label_classes", len(boxes)),
        "label_sample": _per_box(targets["label_sample"], "label_sample", len(boxes)),
    }
    if checked["label_classes"].min() < 0:
        raise LabelError("label_classes must be class indices (0 or more); some are negative.")
    _check_samples(checked["label_sample"], count)
    if "label_keypoints" in targets:
        checked["label_keypoints"] = _keypoints(targets["label_keypoints"], len(boxes))
    return checked


def _boxes(boxes):
    if boxes.dtype.kind not in "iuf" or boxes.ndim != 2 or boxes.shape[1] != 4:
        raise LabelError(
            "label_boxes must be a float array of shape [boxes, 4] (x1, y1, x2, y2 in model-input "
            f"pixels); it is {boxes.dtype} with shape {boxes.shape}."
        )
    if not len(boxes):
        raise LabelError("label_boxes holds no boxes.")
    if not np.isfinite(boxes).all():
        raise LabelError("label_boxes contain NaN or infinite values.")
    wrong = np.flatnonzero((boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1]))
    if len(wrong):
        raise LabelError(
            f"label_boxes row {wrong[0]} is {boxes[wrong[0]].tolist()}: boxes are x1, y1, x2, y2 "
            "with x2 >= x1 and y2 >= y1."
        )
    return boxes.astype(np.float32)


def _per_box(values, name, boxes):
    if values.dtype.kind not in "iu" or values.shape != (boxes,):
        raise LabelError(
            f"{name} must be a 1-D integer array with one value per box ({boxes}); it is "
            f"{values.dtype} with shape {values.shape}."
        )
    return values.astype(np.int64)


def _check_samples(samples, count):
    outside = samples[(samples < 0) | (samples >= count)]
    if len(outside):
        raise LabelError(
            f"label_sample holds the index of each box's sample, 0 to {count - 1}; "
            f"{outside[0]} is not one."
        )


def _keypoints(points, boxes):
    if points.dtype.kind not in "iuf" or points.ndim != 3 or points.shape[::2] != (boxes, 3):
        raise LabelError(
            f"label_keypoints must be a float array of shape [boxes ({boxes}), keypoints, 3] "
            f"(x, y, visibility); it is {points.dtype} with shape {points.shape}."
        )
    if not np.isfinite(points).all():
        raise LabelError("label_keypoints contain NaN or infinite values.")
    return points.astype(np.float32)


def _check_masks(targets, count):
    masks = targets["label_masks"]
    if masks.dtype.kind not in "iu" or masks.ndim != 3:
        raise LabelError(
            "label_masks must be an integer array of shape [samples, height, width] (class ids, "
            f"255 = ignore); it is {masks.dtype} with shape {masks.shape}."
        )
    if len(masks) != count:
        raise LabelError(f"There are {len(masks)} masks for {count} samples; one per sample.")
    if masks.size and masks.min() < 0:
        raise LabelError("label_masks must be class ids (0 or more); some are negative.")
    return {"label_masks": masks}


def _check_texts(targets, count):
    texts = targets["label_texts"]
    if texts.dtype.kind != "U" or texts.ndim != 1:
        raise LabelError(
            "label_texts must be a 1-D array of strings (np.array(['cat', ...]), dtype <U...), "
            f"one per sample; it is {texts.dtype} with shape {texts.shape}."
        )
    if len(texts) != count:
        raise LabelError(f"There are {len(texts)} strings for {count} samples; one per sample.")
    return {"label_texts": texts}


# -- What the labels hold ----------------------------------------------------------------


def class_count(targets):
    """Return how many distinct classes the labels hold (None for strings or no labels)."""
    if "labels" in targets:
        return len(np.unique(targets["labels"]))
    if "label_classes" in targets:
        return len(np.unique(targets["label_classes"]))
    if "label_masks" in targets:
        return int(np.count_nonzero(np.unique(targets["label_masks"]) != IGNORE))
    return None


def summarise(targets, count, notes=()):
    """Say in a line what the labels hold: '37 boxes in 5 of 8 images, 3 classes; ...'."""
    if not targets:
        return ""
    classes = plural(class_count(targets) or 0, "class", "classes")
    if "labels" in targets:
        line = f"{plural(count, 'label')}, {classes}"
    elif "label_boxes" in targets:
        line = _boxes_line(targets, count, classes)
    elif "label_masks" in targets:
        height, width = targets["label_masks"].shape[1:]
        line = f"{plural(count, 'mask')} of {width}x{height}, {classes}"
    else:
        lengths = [len(text) for text in targets["label_texts"]]
        line = f"{plural(count, 'string')} of {min(lengths)}-{max(lengths)} characters"
    line = "; ".join([line, *notes])
    return line if len(line) <= SUMMARY_LENGTH else line[: SUMMARY_LENGTH - 1] + "…"


def _boxes_line(targets, count, classes):
    boxes, images = len(targets["label_boxes"]), len(np.unique(targets["label_sample"]))
    where = f"{images} of {count} images" if images < count else plural(images, "image")
    line = f"{plural(boxes, 'box', 'boxes')} in {where}, {classes}"
    if "label_keypoints" in targets:
        line += f", {targets['label_keypoints'].shape[1]} keypoints each"
    return line


def plural(count, one, many=None):
    return f"{count} {one if count == 1 else many or one + 's'}"
