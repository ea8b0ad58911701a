"""Detection heads that carry more per object: instance masks from prototypes, keypoints.

instance_segmentation: an anchor head whose E extra channels are mask coefficients, and a
prototype output [N, E, h, w]; an object's mask is where coefficients x prototypes > 0
(sigmoid > 0.5) inside its box, at the prototypes' size. keypoints: a YOLO-pose head
(anchors_last, [N, 4+1+3K, A]) or heatmaps [N, K, H, W] (argmax per map, heatmap pixels).
"""

import numpy as np

from workers.tasks.base import (
    Headline,
    TaskError,
    choice,
    known,
    known_params,
    mean_or_none,
    output_param,
    output_rows,
    register,
    shape_of,
    whole,
)
from workers.tasks.coco import mean_average_precision
from workers.tasks.detection import (
    ANCHOR_HEADS,
    PARAMS,
    Detection,
    counted,
    detection_agreement,
    detection_params,
    detections,
    matches,
    without_extras,
)
from workers.tasks.matching import keypoint_error, mask_iou

# Model-input pixels per prototype pixel: YOLOv8/v11-seg's prototypes are a quarter size.
MASK_STRIDE = 4


@register
class InstanceSegmentation(Detection):
    """Detections with masks: detection F1 and mask IoU vs FP32; box mAP with labels."""

    name = "instance_segmentation"
    guards = (Headline("mask_iou", True, "mask IoU of matched instances vs FP32"),)
    label = "Instance segmentation"
    params = (*PARAMS, "protos", "mask_stride")
    heads = ANCHOR_HEADS

    def normalise(self, params, outputs):
        params = known_params(self.name, params, self.params)
        protos = output_param(self.name, params, outputs, "protos", _first_4d(outputs))
        channels = _prototype_channels(self.name, protos)
        filled = detection_params(self.name, params, outputs, self.heads, extra=channels)
        if channels is not None and filled["extra_channels"] != channels:
            raise TaskError(
                f"{self.name}: {protos['name']!r} has {channels} prototypes but the head has "
                f"{filled['extra_channels']} extra channels (mask coefficients) per anchor"
            )
        filled["protos"] = protos["name"]
        filled["mask_stride"] = _stride(self.name, params.get("mask_stride", MASK_STRIDE))
        return filled

    def decode(self, outputs, names, params, batch, real):
        found = detections(outputs, names, params, batch, real)
        protos = output_rows(outputs, names, params["protos"], batch, real)
        return [
            {**without_extras(one), "masks": instance_masks(one, np.asarray(row), params)}
            for one, row in zip(found, protos, strict=False)
        ]

    def agree(self, reference, candidate, params):
        pairs = matches(reference, candidate)
        agreement = detection_agreement(reference, candidate, pairs, params["score_threshold"])
        return {**agreement, "mask_iou": mask_iou(reference, candidate, pairs)}


def instance_masks(found, protos, params):
    """Return [k, h, w] bool masks: coefficients x prototypes above 0, inside each box."""
    channels, height, width = protos.shape
    logits = found["extras"] @ protos.reshape(channels, -1).astype(np.float64)
    boxes = found["boxes"] / params["mask_stride"]
    columns, rows = np.arange(width)[None, None, :], np.arange(height)[None, :, None]
    x1, y1, x2, y2 = (edge[:, None, None] for edge in boxes.T)
    inside = (columns >= x1) & (columns < x2) & (rows >= y1) & (rows < y2)
    return (logits.reshape(-1, height, width) > 0) & inside


def _first_4d(outputs):
    """Return the name of the first 4-D output (the prototypes), None when there is none."""
    return next((output["name"] for output in outputs if len(shape_of(output)) == 4), None)


def _prototype_channels(task, protos):
    """Return the number of prototypes of a [N, E, h, w] output (None when symbolic)."""
    shape = shape_of(protos)
    if shape and len(shape) != 4:
        raise TaskError(
            f"{task} param 'protos' must name the prototype output [N, E, h, w]; "
            f"{protos['name']!r} has shape {shape}"
        )
    return shape[1] if shape and known(shape[1]) else None


def _stride(task, value):
    """Return a mask_stride: a positive number of input pixels per prototype pixel."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise TaskError(
            f"{task} param 'mask_stride' must be a number above 0 (input pixels per prototype "
            f"pixel), got {value!r}"
        )
    return value


@register
class Keypoints(Detection):
    """Keypoints: pixel error of matched keypoints vs FP32 (lower is better); box mAP."""

    name = "keypoints"
    label = "Keypoints"
    agreement = Headline("keypoint_error_px", False, "keypoint error vs FP32 (px)")
    # The error is of matched detections only: a build that finds a quarter of them is no
    # good however exactly it places their keypoints.
    guards = (Headline("f1", True, "detection F1 vs FP32"),)
    params = (*PARAMS, "keypoints")
    heads = ("anchors_last", "heatmaps")

    def normalise(self, params, outputs):
        params = known_params(self.name, params, self.params)
        if params.get("head") == "heatmaps":
            return _heatmap_params(self.name, params, outputs)
        pose = _with_classes(self.name, params)
        filled = detection_params(self.name, pose, outputs, self.heads[:1])
        return {**filled, "keypoints": _pose_keypoints(self.name, params, filled)}

    def decode(self, outputs, names, params, batch, real):
        if params["head"] == "heatmaps":
            rows = output_rows(outputs, names, params["output"], batch, real)
            return [{"keypoints": heatmap_peaks(np.asarray(row))} for row in rows]
        count = params["keypoints"]
        return [
            {**without_extras(one), "keypoints": one["extras"].reshape(-1, count, 3)}
            for one in detections(outputs, names, params, batch, real)
        ]

    def agree(self, reference, candidate, params):
        if params["head"] == "heatmaps":
            return {"keypoint_error_px": _peak_distance(reference, candidate)}
        pairs = matches(reference, candidate)
        agreement = detection_agreement(reference, candidate, pairs, params["score_threshold"])
        return {**agreement, "keypoint_error_px": keypoint_error(reference, candidate, pairs)}

    def score(self, objects, labels, params):
        if params["head"] == "heatmaps":
            return self.unscored()  # no boxes to measure
        return mean_average_precision(counted(objects, params), labels)


def _with_classes(task, params):
    """Return pose params: 3 extra channels per declared keypoint, else one class (YOLO-pose)
    and every channel after it (extra_channels None)."""
    if "keypoints" in params:
        return {"extra_channels": 3 * whole(task, params, "keypoints", 1), **params}
    return {"classes": 1, "extra_channels": None, **params}


def _pose_keypoints(task, params, filled):
    """Return K of a pose head: declared, or its extra channels / 3."""
    extra = filled["extra_channels"]
    if "keypoints" not in params and not extra:
        raise TaskError(
            f"{task} param 'keypoints' is needed: the channel axis of {filled['output']!r} "
            "does not say how many keypoints there are"
        )
    count = params.get("keypoints", extra // 3)
    if count < 1 or extra != 3 * count:
        raise TaskError(
            f"{task} param 'keypoints': the head has {extra} channels after its class scores, "
            f"not 3 (x, y, visibility) per keypoint for {count} keypoints"
        )
    return count


def _heatmap_params(task, params, outputs):
    """Return the params of a heatmap head [N, K, H, W]: output and K, checked."""
    choice(task, params, "head", ("heatmaps",))
    output = output_param(task, params, outputs, default=_first_4d(outputs))
    shape = shape_of(output)
    if shape and len(shape) != 4:
        raise TaskError(
            f"{task} head heatmaps reads an output [N, K, H, W]; {output['name']!r} has "
            f"shape {shape}"
        )
    maps = shape[1] if shape and known(shape[1]) else None
    count = params.get("keypoints", maps)
    if count is None:
        raise TaskError(f"{task} param 'keypoints' is needed: the heatmap axis is symbolic")
    whole(task, {"keypoints": count}, "keypoints", 1)
    if maps is not None and count != maps:
        raise TaskError(
            f"{task} param 'keypoints' is {count} but {output['name']!r} has {maps} heatmaps"
        )
    return {"head": "heatmaps", "output": output["name"], "keypoints": count}


def heatmap_peaks(maps):
    """Return [1, K, 3] keypoints of [K, H, W] heatmaps: each map's argmax x, y and value."""
    count, _, width = maps.shape
    flat = maps.reshape(count, -1).astype(np.float64)
    peaks = flat.argmax(axis=1)
    y, x = np.divmod(peaks, width)
    return np.stack([x, y, flat.max(axis=1)], axis=1)[None].astype(np.float64)


def _peak_distance(reference, candidate):
    """Return the mean pixel distance of heatmap peaks, every keypoint of every sample."""
    distances = [
        np.hypot(*(theirs["keypoints"][0, :, :2] - ours["keypoints"][0, :, :2]).T)
        for ours, theirs in zip(reference, candidate, strict=True)
    ]
    return mean_or_none(np.concatenate(distances)) if distances else None
