"""Object detection: the four head layouts decoded to boxes, agreement by matching, COCO mAP.

Heads (docs in /tmp spec section 1, the declaration's params):
    anchors_last   [N, 4+C(+E), A]  YOLOv8/v11: box, C class scores, no objectness
    anchors_first  [N, A, 5+C(+E)]  YOLOv5/v7: box, objectness, C class scores
    nms_outputs    boxes [N,K,4], scores [N,K], classes [N,K], optional count [N] or [N,1]
    nms_rows       [N, K, 6], rows x1,y1,x2,y2,score,class
Anchor heads go through our NMS (workers/tasks/boxes.py), per class; heads with NMS in the
graph keep their rows (count, then our score threshold). E extra channels per anchor (mask
coefficients, keypoints) ride along for instance segmentation and keypoints.
"""

import numpy as np

from workers.tasks.base import (
    Headline,
    Task,
    TaskError,
    choice,
    fraction,
    known,
    output_param,
    output_rows,
    register,
    shape_of,
    whole,
)
from workers.tasks.boxes import BOX_FORMATS, nms, to_xyxy
from workers.tasks.coco import mean_average_precision
from workers.tasks.matching import detection_agreement, matches

HEADS = ("anchors_last", "anchors_first", "nms_outputs", "nms_rows")
ANCHOR_HEADS = ("anchors_last", "anchors_first")
PARAMS = (
    "head",
    "output",
    "outputs",
    "box_format",
    "classes",
    "extra_channels",
    "score_threshold",
    "iou_threshold",
    "max_detections",
    "image_size",
)
DEFAULTS = {"score_threshold": 0.25, "iou_threshold": 0.45, "max_detections": 300}
# Channels before the class scores: the box, and for anchors_first the objectness.
BOX_CHANNELS = {"anchors_last": 4, "anchors_first": 5}
# The outputs of a head with NMS in the graph, found by what their names contain.
NMS_ROLES = {
    "count": ("num", "count"),
    "boxes": ("box",),
    "scores": ("score", "conf"),
    "classes": ("class", "label"),
}
# A YOLO-style output: anchors on an axis this large (or symbolic), channels on one this small.
MIN_ANCHORS = 100
# Detections are decoded this far below the score threshold, to be matched, never counted.
MATCH_MARGIN = 0.05
MIN_CHANNELS = 5


def anchors_layout(shape):
    """Return the anchor head of a YOLO-style [N, a, b] shape, or None when it is not one.

    The anchors are the large axis (>= 100 or symbolic), the channels the small one (>= 5):
    channels first is anchors_last ([N, 4+C, A]), channels last anchors_first ([N, A, 5+C]).
    """
    if len(shape) != 3:
        return None
    first, second = shape[1], shape[2]
    if _channels_axis(first, second):
        return "anchors_last"
    if _channels_axis(second, first):
        return "anchors_first"
    return None


def _channels_axis(channels, anchors):
    """Return True when channels looks like a YOLO channel axis beside an anchor axis."""
    if not known(channels) or channels < MIN_CHANNELS:
        return False
    return not known(anchors) or (anchors >= MIN_ANCHORS and anchors > channels)


def nms_roles(names, given=None):
    """Return {role: output name} of an NMS-in-graph head: given names, else by name hints."""
    given, found = dict(given or {}), {}
    for role, hints in NMS_ROLES.items():
        taken = set(found.values()) | set(given.values())
        found[role] = given.get(role) or next(
            (name for name in names if name not in taken and any(h in name.lower() for h in hints)),
            None,
        )
    return found


def detection_params(task, params, outputs, heads=HEADS, extra=0):
    """Return a detection declaration's params filled and checked against the outputs.

    extra is the default number of extra channels (mask coefficients, keypoints); None:
    the channels left after the box and the declared classes.
    """
    head = _head(task, params, outputs, heads)
    in_graph = head not in ANCHOR_HEADS
    filled = {"head": head, **DEFAULTS, **params}
    filled["box_format"] = params.get("box_format", "xyxy" if in_graph else "cxcywh")
    choice(task, filled, "box_format", BOX_FORMATS)
    if head == "nms_outputs":
        filled["outputs"] = _nms_outputs(task, params, outputs)
        filled.pop("output", None)
    else:
        filled["output"] = output_param(task, params, outputs, default=_first_3d(outputs))["name"]
        filled.pop("outputs", None)
    filled.update(_classes(task, filled, outputs, extra))
    if head == "nms_rows":
        _check_rows(task, filled, outputs)
    fraction(task, filled, "score_threshold")
    fraction(task, filled, "iou_threshold")
    whole(task, filled, "max_detections", 1)
    _check_image_size(task, filled)
    return {key: filled[key] for key in PARAMS if key in filled}


def _check_image_size(task, params):
    """Refuse an image_size that is not [height, width] in pixels (None: boxes are not clipped)."""
    size = params.setdefault("image_size", None)
    if size is None:
        return
    if (
        not isinstance(size, list | tuple)
        or len(size) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in size)
    ):
        raise TaskError(
            f"{task} param 'image_size' must be [height, width] in pixels, or null, got {size!r}"
        )
    params["image_size"] = list(size)


def _head(task, params, outputs, heads):
    """Return the declared head, or the one the outputs show when none is declared."""
    if "head" not in params:
        guessed = _guessed_head(outputs)
        if guessed not in heads:
            raise TaskError(
                f"{task} param 'head' is missing and the outputs do not show it: "
                f"give one of {', '.join(heads)}"
            )
        return guessed
    return choice(task, params, "head", heads)


def _guessed_head(outputs):
    """Return the head outputs plainly have: NMS outputs by name, or one YOLO-style output."""
    roles = nms_roles([output["name"] for output in outputs])
    if all(roles[role] for role in ("boxes", "scores", "classes")):
        return "nms_outputs"
    shapes = [shape_of(output) for output in outputs if len(shape_of(output)) == 3]
    return anchors_layout(shapes[0]) if len(shapes) == 1 else None


def _first_3d(outputs):
    """Return the name of the first 3-D output (None: the first output)."""
    return next((output["name"] for output in outputs if len(shape_of(output)) == 3), None)


def _check_rows(task, params, outputs):
    """Refuse an nms_rows output whose rows are not 6 values (x1, y1, x2, y2, score, class)."""
    output = next(output for output in outputs if output["name"] == params["output"])
    shape = shape_of(output)
    if shape and known(shape[-1]) and shape[-1] != 6:
        raise TaskError(
            f"{task} head nms_rows reads rows of 6 values (x1, y1, x2, y2, score, class); "
            f"{output['name']!r} has shape {shape}"
        )


def _nms_outputs(task, params, outputs):
    """Return {"boxes","scores","classes","count"} output names of a head with NMS in the graph."""
    given = params.get("outputs") or {}
    named = isinstance(given, dict) and all(v is None or isinstance(v, str) for v in given.values())
    if not named or set(given) - set(NMS_ROLES):
        raise TaskError(
            f"{task} param 'outputs' must map some of {', '.join(NMS_ROLES)} to output names, "
            f"got {given!r}"
        )
    names = [output["name"] for output in outputs]
    roles = nms_roles(names, given)
    for role, name in roles.items():
        if name is None and role != "count":
            raise TaskError(
                f"{task} param 'outputs' needs {role!r}: no output is named like it "
                f"(outputs: {', '.join(map(repr, names))})"
            )
        if name is not None and name not in names:
            raise TaskError(
                f"{task} param 'outputs' names no output of the model for {role!r}: {name!r} "
                f"(outputs: {', '.join(map(repr, names))})"
            )
    return roles


def _classes(task, params, outputs, extra):
    """Return classes and extra_channels: given, or read from an anchor head's channel axis."""
    head = params["head"]
    classes, extra = params.get("classes"), params.get("extra_channels", extra)
    for key, value in (("classes", classes), ("extra_channels", extra)):
        if value is not None:
            whole(task, {key: value}, key, 1 if key == "classes" else 0)
    if head not in ANCHOR_HEADS:
        return {"classes": classes, "extra_channels": 0}
    channels = _channel_count(task, params, outputs)
    if classes is None and (channels is None or extra is None):
        raise TaskError(
            f"{task} param 'classes' is needed: the channel axis of {params['output']!r} does "
            "not say how many of its channels are class scores"
        )
    if channels is None:
        return {"classes": classes, "extra_channels": extra or 0}
    base = BOX_CHANNELS[head]
    extra = channels - base - classes if extra is None else extra
    classes = channels - base - extra if classes is None else classes
    if classes < 1 or extra < 0 or base + classes + extra != channels:
        raise TaskError(
            f"{task}: {params['output']!r} has {channels} channels per anchor, not {base} box "
            f"values + {classes} classes + {extra} extra channels: check 'classes' and "
            "'extra_channels'"
        )
    return {"classes": classes, "extra_channels": extra}


def _channel_count(task, params, outputs):
    """Return the size of an anchor head's channel axis (None when symbolic or unknown)."""
    output = next(output for output in outputs if output["name"] == params["output"])
    shape = shape_of(output)
    if shape and len(shape) != 3:
        raise TaskError(
            f"{task} head {params['head']} reads a 3-D output; {output['name']!r} has shape "
            f"{shape}: check 'head' and 'output'"
        )
    axis = 1 if params["head"] == "anchors_last" else 2
    return shape[axis] if shape and known(shape[axis]) else None


def counted(objects, params):
    """Return each sample's detections above the score threshold: what the deployed model
    reports (the margin under it is decoded for matching only)."""
    threshold = params.get("score_threshold", DEFAULTS["score_threshold"])
    return [_above(found, threshold) for found in objects]


def _above(found, threshold):
    keep = np.asarray(found["scores"]) > threshold
    return {
        key: value[keep] if isinstance(value, np.ndarray) and len(value) == len(keep) else value
        for key, value in found.items()
    }


def decode_floor(params):
    """Return the score detections are decoded down to: the threshold less MATCH_MARGIN.

    A box a hair under the threshold on one side still matches its twin a hair over it on the
    other (workers/tasks/matching.py): a build is not failed for flipping a borderline box.
    """
    return max(0.0, params["score_threshold"] - MATCH_MARGIN)


def detections(outputs, names, params, batch, real):
    """Return each real sample's detections: boxes xyxy, scores, classes, extras [k, E]; boxes
    clipped to the image (image_size), as YOLO's own post-processing clips them."""
    found = _detections(outputs, names, params, batch, real)
    if params.get("image_size"):
        height, width = params["image_size"]
        for sample in found:
            sample["boxes"] = np.clip(sample["boxes"], 0, [width, height, width, height])
    return found


def _detections(outputs, names, params, batch, real):
    head = params["head"]
    if head == "nms_outputs":
        roles = params["outputs"]
        rows = {
            role: output_rows(outputs, names, name, batch, real) if name else [None] * real
            for role, name in roles.items()
        }
        return [
            _graph_rows(boxes, scores, classes, count, params)
            for boxes, scores, classes, count in zip(
                rows["boxes"], rows["scores"], rows["classes"], rows["count"], strict=False
            )
        ]
    rows = output_rows(outputs, names, params["output"], batch, real)
    if head == "nms_rows":
        return [_table_rows(np.asarray(row).reshape(-1, 6), params) for row in rows]
    return [_anchors(np.asarray(row), params) for row in rows]


def _anchors(row, params):
    """Return the detections of one sample of an anchor head, after our per-class NMS."""
    head, count = params["head"], params["classes"]
    table = row.T if head == "anchors_last" else row
    base = BOX_CHANNELS[head]
    if table.ndim != 2 or table.shape[1] != base + count + params["extra_channels"]:
        raise TaskError(
            f"a sample of {params['output']!r} has shape {list(row.shape)}, not the "
            f"{base} + {count} classes + {params['extra_channels']} extra channels declared"
        )
    class_scores = table[:, base : base + count].astype(np.float64)
    if base == 5:
        class_scores = class_scores * table[:, 4:5]
    best = class_scores.max(axis=1)
    keep = np.flatnonzero(best > decode_floor(params))
    found = {
        "boxes": to_xyxy(table[keep, :4], params["box_format"]),
        "scores": best[keep],
        "classes": class_scores[keep].argmax(axis=1).astype(np.int64),
        "extras": table[keep, base + count :].astype(np.float64),
    }
    kept = nms(
        found["boxes"],
        found["scores"],
        found["classes"],
        params["iou_threshold"],
        params["max_detections"],
    )
    return {key: value[kept] for key, value in found.items()}


def _graph_rows(boxes, scores, classes, count, params):
    """Return one sample's detections from NMS-in-graph boxes, scores, classes and count."""
    boxes = np.asarray(boxes).reshape(-1, 4)
    table = np.column_stack(
        [boxes, np.asarray(scores).reshape(-1), np.asarray(classes).reshape(-1)]
    )
    if count is not None:
        table = table[: int(np.asarray(count).reshape(-1)[0])]
    return _table_rows(table, params)


def _table_rows(table, params):
    """Return the detections of rows x1,y1,x2,y2 (or the box format), score, class: those
    above the score threshold with a class (>= 0), best first, at most max_detections."""
    table = np.asarray(table, dtype=np.float64)
    table = table[(table[:, 4] > decode_floor(params)) & (table[:, 5] >= 0)]
    table = table[np.argsort(-table[:, 4], kind="stable")][: params["max_detections"]]
    return {
        "boxes": to_xyxy(table[:, :4], params["box_format"]),
        "scores": table[:, 4],
        "classes": np.rint(table[:, 5]).astype(np.int64),
        "extras": np.zeros((len(table), 0)),
    }


def without_extras(found):
    """Return a detection object as the spec has it: no extras."""
    return {key: value for key, value in found.items() if key != "extras"}


@register
class Detection(Task):
    """Boxes, scores and classes: F1 of matched detections vs FP32; COCO mAP with labels."""

    name = "detection"
    label = "Object detection"
    agreement = Headline("f1", True, "detection F1 vs FP32")
    labelled = Headline("map", True, "mAP@0.5:0.95")
    labelled_keys = ("map", "map50")
    label_arrays = ("label_boxes", "label_classes", "label_sample")
    params = PARAMS
    heads = HEADS

    def normalise(self, params, outputs):
        params = super().normalise(params, outputs)
        return detection_params(self.name, params, outputs, self.heads)

    def decode(self, outputs, names, params, batch, real):
        return [without_extras(found) for found in detections(outputs, names, params, batch, real)]

    def agree(self, reference, candidate, params):
        pairs = matches(reference, candidate)
        return detection_agreement(reference, candidate, pairs, params["score_threshold"])

    def score(self, objects, labels, params):
        return mean_average_precision(counted(objects, params), labels)
