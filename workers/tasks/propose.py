"""Guess a model's task from its outputs' names and shapes (and its graph's operators).

A proposal is a starting point the user confirms: {"task", "params", "why"}, why being one
sentence they read. Shapes hold ints, symbols (strings), None or -1 for unknown sizes.
"""

import re

from workers.tasks.base import TASKS, TaskError, known, shape_of
from workers.tasks.detection import BOX_CHANNELS, anchors_layout, nms_roles

NMS_OPERATORS = ("NonMaxSuppression", "EfficientNMS_TRT")
# Words in an output's name that say what it holds (a word matches when it starts with one).
TEXT_WORDS = ("ctc", "text", "rec", "ocr", "logit", "char")
POSE_WORDS = ("pose", "kpt", "keypoint")
EMBEDDING_WORDS = ("emb", "feat", "vector", "descriptor", "hidden")
HEATMAP_WORDS = ("heatmap",)
# A class map or heatmap is at least this many pixels high and wide.
MIN_MAP_SIZE = 8
# A head whose channels also fit this many keypoints or more is said to fit a pose head.
MIN_HINTED_KEYPOINTS = 4
# The tasks whose boxes are clipped to the image, and the channel counts an image has.
BOX_TASKS = ("detection", "instance_segmentation", "keypoints")
IMAGE_CHANNELS = (1, 3, 4)


def propose(inputs, outputs, operators=None):
    """Return {"task", "params", "why"}: the task the outputs most likely mean, params filled."""
    outputs = [{**output, "shape": shape_of(output)} for output in outputs]
    operators = operators or {}
    for rule in (_graph_nms, _instance_segmentation, _one_output):
        found = rule(inputs or [], outputs, operators)
        if found:
            return _checked(*found, outputs, inputs or [])
    return _generic(f"{len(outputs)} outputs that fit no known head: each is compared with FP32")


def _checked(task, params, why, outputs, inputs=()):
    """Return a proposal with its params normalised; generic when they do not hold."""
    if task in BOX_TASKS and (size := image_size(inputs)):
        params = {**params, "image_size": size}
    try:
        return {"task": task, "params": TASKS[task].normalise(params, outputs), "why": why}
    except TaskError as error:
        return _generic(f"{why}, but {error}: every output is compared with FP32 instead")


def image_size(inputs):
    """Return [height, width] of the first image-shaped input (NCHW or NHWC), when fixed."""
    for spec in inputs:
        shape = shape_of(spec)
        if len(shape) != 4 or not all(known(dim) and dim for dim in shape[1:]):
            continue
        if shape[1] in IMAGE_CHANNELS:
            return [shape[2], shape[3]]
        if shape[3] in IMAGE_CHANNELS:
            return [shape[1], shape[2]]
    return None


def _generic(why):
    return {"task": "generic", "params": {}, "why": why}


def _graph_nms(inputs, outputs, operators):
    """Propose an NMS-in-graph head: outputs named boxes/scores/classes, or an NMS operator
    with one [N, K, 6] output."""
    roles = nms_roles([output["name"] for output in outputs])
    if all(roles[role] for role in ("boxes", "scores", "classes")):
        named = ", ".join(repr(roles[role]) for role in ("boxes", "scores", "classes"))
        count = f" and a count {roles['count']!r}" if roles["count"] else ""
        why = f"outputs {named}{count}: detections after NMS in the graph"
        return "detection", {"head": "nms_outputs", "outputs": roles}, why
    operator = next((name for name in NMS_OPERATORS if name in operators), None)
    if operator is None:
        return None
    rows = [output for output in outputs if len(output["shape"]) == 3 and output["shape"][2] == 6]
    if len(rows) == 1:
        why = (
            f"the graph runs {operator} and its output {_shape(rows[0])} holds rows "
            "x1, y1, x2, y2, score, class"
        )
        return "detection", {"head": "nms_rows", "output": rows[0]["name"]}, why
    return (
        "generic",
        {},
        (
            f"the graph runs {operator} but its outputs are neither boxes/scores/classes nor "
            "rows of 6: declare the detection head, or compare every output"
        ),
    )


def _instance_segmentation(inputs, outputs, operators):
    """Propose instance segmentation: a YOLO-style head and a prototype output [N, E, h, w]."""
    heads = [output for output in outputs if anchors_layout(output["shape"])]
    protos = [output for output in outputs if len(output["shape"]) == 4]
    if len(outputs) != 2 or len(heads) != 1 or len(protos) != 1:
        return None
    head, proto = heads[0], protos[0]
    params = {
        "head": anchors_layout(head["shape"]),
        "output": head["name"],
        "protos": proto["name"],
    }
    stride = _stride(inputs, proto["shape"])
    if stride:
        params["mask_stride"] = stride
    count = proto["shape"][1]
    channels = head["shape"][1 if params["head"] == "anchors_last" else 2]
    classes = channels - BOX_CHANNELS[params["head"]] - count if known(count) else "its"
    why = (
        f"outputs {_shape(head)} and prototypes {_shape(proto)}: a YOLO-style segmentation head, "
        f"{_box_text(params['head'])}, {classes} class scores and {count} mask coefficients "
        "per anchor"
    )
    return "instance_segmentation", params, why


def _stride(inputs, proto_shape):
    """Return input pixels per prototype pixel, when an image input and the prototypes say."""
    images = [shape_of(spec) for spec in inputs if len(shape_of(spec)) == 4]
    if not images or not known(images[0][2]) or not known(proto_shape[2]) or not proto_shape[2]:
        return None
    stride = images[0][2] / proto_shape[2]
    return int(stride) if stride == int(stride) else stride


def _one_output(inputs, outputs, operators):
    """Propose the task of a model with one output, by its rank, shape and name."""
    if len(outputs) != 1:
        return None
    output = outputs[0]
    rank = len(output["shape"])
    rule = {2: _two_dims, 3: _three_dims, 4: _four_dims}.get(rank)
    return rule(output) if rule else None


def _two_dims(output):
    """[N, D]: an embedding when its name says so, else class scores."""
    size = output["shape"][1]
    if _named(output, EMBEDDING_WORDS):
        return (
            "embedding",
            {"output": output["name"]},
            (
                f"one output {_shape(output)} named {output['name']!r}: a vector compared by "
                "cosine similarity"
            ),
        )
    return (
        "classification",
        {"output": output["name"]},
        (f"one output {_shape(output)}: a score per class, {size} classes"),
    )


def _three_dims(output):
    """[N, a, b]: text by name, an embedding by name, a YOLO-style head, a class map, or text."""
    shape = output["shape"]
    if _named(output, TEXT_WORDS):
        return _text(output)
    if _named(output, EMBEDDING_WORDS):
        return (
            "embedding",
            {"output": output["name"]},
            (
                f"one output {_shape(output)} named {output['name']!r}: features compared by "
                "cosine similarity"
            ),
        )
    if _integers(output) and _map_sized(shape[1], shape[2]):
        return (
            "semantic_segmentation",
            {"output": output["name"], "layout": "labels"},
            (f"one integer output {_shape(output)}: a class per pixel"),
        )
    if anchors_layout(shape):
        return _yolo(output)
    return _text(output)


def _yolo(output):
    """Propose detection (or keypoints, when named so and the channels fit) of a YOLO head."""
    head = anchors_layout(output["shape"])
    channels = output["shape"][1 if head == "anchors_last" else 2]
    pose = head == "anchors_last" and (channels - 5) % 3 == 0 and channels > 5
    keypoints = (channels - 5) // 3
    if pose and _named(output, POSE_WORDS):
        return (
            "keypoints",
            {"head": head, "output": output["name"], "keypoints": keypoints},
            (
                f"one output {_shape(output)} named like a pose head: YOLO-pose, 4 box values, a "
                f"score, then {keypoints} keypoints (x, y, visibility) per anchor"
            ),
        )
    classes = channels - BOX_CHANNELS[head]
    why = (
        f"one output {_shape(output)}: a YOLO-style head, {_box_text(head)} then {classes} "
        "class scores per anchor"
    )
    if pose and keypoints >= MIN_HINTED_KEYPOINTS:
        why += (
            f" ({channels} channels also fit a pose head with {keypoints} keypoints: "
            "declare keypoints if it is one)"
        )
    return "detection", {"head": head, "output": output["name"]}, why


def _text(output):
    """Propose greedy CTC text recognition of [N, T, V] (or [T, N, V]) step scores."""
    shape = output["shape"]
    time_first = known(shape[0]) and shape[0] > 1 and (not known(shape[1]) or shape[1] == 1)
    layout = "TNV" if time_first else "NTV"
    named = f" named {output['name']!r}" if _named(output, TEXT_WORDS) else ""
    return (
        "text_recognition",
        {"output": output["name"], "layout": layout},
        (
            f"one output {_shape(output)}{named}: per-step scores over {shape[2]} tokens "
            f"(layout {layout}), read by greedy CTC with blank 0"
        ),
    )


def _four_dims(output):
    """[N, C, H, W]: heatmaps by name, a class map (logits), or class scores at 1 x 1."""
    _, channels, height, width = output["shape"]
    if height == 1 and width == 1:
        return _two_dims(output)
    if not _map_sized(height, width) or not known(channels):
        return None
    if _named(output, HEATMAP_WORDS) or _named(output, POSE_WORDS):
        return (
            "keypoints",
            {"head": "heatmaps", "output": output["name"]},
            (
                f"one output {_shape(output)} named like heatmaps: {channels} keypoints, each at "
                "its map's peak"
            ),
        )
    if channels < 2:
        return None
    return (
        "semantic_segmentation",
        {"output": output["name"], "layout": "logits"},
        (
            f"one output {_shape(output)}: per-pixel scores for {channels} classes "
            "(argmax per pixel)"
        ),
    )


def _box_text(head):
    """Return what comes before the class scores of an anchor head, in words."""
    return "4 box values" if head == "anchors_last" else "4 box values, an objectness score"


def _named(output, words):
    """Return True when a word of the output's name starts with one of words."""
    parts = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", str(output["name"]))
    return any(part.lower().startswith(word) for part in parts for word in words)


def _integers(output):
    """Return True when the output's dtype is an integer type."""
    return str(output.get("dtype") or "").lstrip("u").startswith("int")


def _map_sized(height, width):
    """Return True when height and width are a map's: each symbolic, or >= MIN_MAP_SIZE."""
    return all(not known(size) or size >= MIN_MAP_SIZE for size in (height, width))


def _shape(output):
    """Return an output's shape as text: [1, 84, 8400], symbols as written, None as ?."""
    dims = ("?" if dim is None else str(dim) for dim in output["shape"])
    return f"[{', '.join(dims)}]"
