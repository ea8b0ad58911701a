"""Detection tasks (workers/tasks): the four heads decoded, NMS, agreement with FP32, COCO mAP.

Outputs are built by hand, a few objects among empty anchors, so every figure can be
worked out on paper; mAP is checked against pycocotools' COCOeval run here from files.
"""

import contextlib
import io
import json

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from workers.tasks import TASKS, normalise
from workers.tasks.boxes import iou_matrix, nms

DETECTION = TASKS["detection"]
# Five objects of three classes, far apart: (cx, cy, w, h, class, score), input pixels.
OBJECTS = [
    (20, 20, 20, 20, 0, 0.9),
    (80, 20, 20, 20, 1, 0.8),
    (140, 20, 20, 20, 2, 0.7),
    (20, 80, 20, 20, 0, 0.6),
    (80, 80, 20, 20, 1, 0.5),
]
CLASSES = 3
ANCHORS = 200


def anchors_last(objects, classes=CLASSES, anchors=ANCHORS, extra=None):
    """Return a [1, 4+C(+E), A] YOLOv8-style output holding objects in its first anchors."""
    width = 4 + classes + (0 if extra is None else extra.shape[1])
    output = np.zeros((1, width, anchors), np.float32)
    for anchor, (cx, cy, w, h, label, score) in enumerate(objects):
        output[0, :4, anchor] = cx, cy, w, h
        output[0, 4 + label, anchor] = score
        if extra is not None:
            output[0, 4 + classes :, anchor] = extra[anchor]
    return output


def declared(output, **params):
    """Return normalised anchors_last detection params for one output called output0."""
    outputs = [{"name": "output0", "dtype": "float32", "shape": list(output.shape)}]
    return normalise({"task": "detection", "params": {"head": "anchors_last", **params}}, outputs)[
        "params"
    ]


def decode(output, params, task=DETECTION):
    return task.decode([output], ["output0"], params, 1, 1)


def test_it_decodes_an_anchors_last_head_to_xyxy_boxes_above_the_threshold():
    output = anchors_last(OBJECTS + [(200, 200, 10, 10, 1, 0.1)])  # below 0.25 - 0.05
    params = declared(output)

    (found,) = decode(output, params)

    assert params["classes"] == CLASSES and params["box_format"] == "cxcywh"
    assert found["boxes"].tolist() == [
        [cx - 10, cy - 10, cx + 10, cy + 10] for cx, cy, *_ in OBJECTS
    ]
    assert found["classes"].tolist() == [label for *_, label, _ in OBJECTS]
    assert found["scores"] == pytest.approx([score for *_, score in OBJECTS])


def test_it_decodes_an_anchors_first_head_with_objectness_times_class_score():
    output = np.zeros((1, 300, 5 + 2), np.float32)
    output[0, 0] = [50, 50, 10, 20, 0.5, 0.2, 0.9]  # 0.5 x 0.9 = 0.45, class 1
    output[0, 1] = [10, 10, 4, 4, 0.4, 0.25, 0.1]  # 0.4 x 0.25 = 0.1: below 0.25 - 0.05
    outputs = [{"name": "out", "dtype": "float32", "shape": [1, 300, 7]}]
    params = normalise({"task": "detection", "params": {"head": "anchors_first"}}, outputs)[
        "params"
    ]

    (found,) = DETECTION.decode([output], ["out"], params, 1, 1)

    assert params["classes"] == 2
    assert found["boxes"].tolist() == [[45, 40, 55, 60]]
    assert found["classes"].tolist() == [1] and found["scores"] == pytest.approx([0.45])


def test_it_reads_nms_outputs_up_to_their_count():
    boxes = np.array([[[0, 0, 10, 10], [5, 5, 20, 20], [1, 1, 2, 2], [0, 0, 0, 0]]], np.float32)
    scores = np.array([[0.9, 0.6, 0.8, 0.0]], np.float32)
    classes = np.array([[3, 1, 2, 0]], np.int32)
    count = np.array([[2]], np.int32)  # the third row is past the count
    names = ["num_dets", "det_boxes", "det_scores", "det_classes"]
    outputs = [
        {"name": name, "dtype": str(array.dtype), "shape": list(array.shape)}
        for name, array in zip(names, [count, boxes, scores, classes], strict=True)
    ]
    params = normalise({"task": "detection", "params": {"head": "nms_outputs"}}, outputs)["params"]

    (found,) = DETECTION.decode([count, boxes, scores, classes], names, params, 1, 1)

    assert params["outputs"] == {
        "count": "num_dets",
        "boxes": "det_boxes",
        "scores": "det_scores",
        "classes": "det_classes",
    }
    assert found["boxes"].tolist() == [[0, 0, 10, 10], [5, 5, 20, 20]]
    assert found["classes"].tolist() == [3, 1]


def test_it_reads_nms_rows_best_first_without_padding():
    rows = np.array([[[0, 0, 4, 4, 0.3, 1], [2, 2, 8, 8, 0.95, 0], [0, 0, 0, 0, 0.0, -1]]])
    outputs = [{"name": "dets", "dtype": "float32", "shape": [1, 3, 6]}]
    params = normalise({"task": "detection", "params": {"head": "nms_rows"}}, outputs)["params"]

    (found,) = DETECTION.decode([rows], ["dets"], params, 1, 1)

    assert found["boxes"].tolist() == [[2, 2, 8, 8], [0, 0, 4, 4]]
    assert found["classes"].tolist() == [0, 1]


def test_it_decodes_each_real_sample_of_a_padded_batch():
    output = np.concatenate(
        [anchors_last(OBJECTS[:2]), anchors_last(OBJECTS[2:]), anchors_last([])]
    )

    found = DETECTION.decode([output], ["output0"], declared(output), 3, 2)

    assert [len(one["boxes"]) for one in found] == [2, 3]


def test_nms_drops_an_overlapping_box_of_the_same_class_only():
    boxes = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [1, 0, 11, 10], [50, 50, 60, 60]], float)
    scores = np.array([0.9, 0.8, 0.7, 0.6])
    classes = np.array([0, 0, 1, 0])  # box 1 overlaps box 0 (IoU 9/11); box 2 is another class

    assert nms(boxes, scores, classes, 0.45, 300).tolist() == [0, 2, 3]
    assert nms(boxes, scores, classes, 0.95, 300).tolist() == [0, 1, 2, 3]
    assert nms(boxes, scores, classes, 0.45, 2).tolist() == [0, 2]


def test_iou_is_overlap_over_union():
    iou = iou_matrix(np.array([[0, 0, 10, 10]]), np.array([[2, 0, 12, 10], [20, 20, 30, 30]]))
    assert iou.tolist() == [[pytest.approx(80 / 120), 0.0]]


def test_a_source_agrees_with_itself_and_with_tiny_noise():
    output = anchors_last(OBJECTS)
    params = declared(output)
    noisy = output + np.random.default_rng(0).normal(0, 1e-4, output.shape).astype(np.float32)

    itself = DETECTION.agree(decode(output, params), decode(output, params), params)
    noise = DETECTION.agree(decode(output, params), decode(noisy, params), params)

    assert itself["f1"] == 1.0 and itself["mean_iou"] == 1.0 and itself["score_error"] == 0.0
    assert noise["f1"] == 1.0 and noise["mean_iou"] > 0.999 and noise["score_error"] < 1e-3


def test_boxes_shifted_by_10_px_and_a_swapped_class_are_counted_as_misses():
    output = anchors_last(OBJECTS)
    params = declared(output)
    moved = list(OBJECTS)
    cx, cy, w, h, label, score = moved[1]
    moved[1] = (cx + 10, cy, w, h, label, score)  # 20 px boxes 10 px apart: IoU 1/3 < 0.5
    cx, cy, w, h, label, score = moved[3]
    moved[3] = (cx, cy, w, h, 2, score)  # another class

    agreement = DETECTION.agree(decode(output, params), decode(anchors_last(moved), params), params)

    # 3 matched, 2 extra, 2 missed
    assert agreement["precision"] == pytest.approx(3 / 5)
    assert agreement["recall"] == pytest.approx(3 / 5)
    assert agreement["f1"] == pytest.approx(6 / 10) and agreement["f1"] < 0.99
    assert agreement["mean_iou"] == 1.0


def test_a_small_shift_is_matched_and_shows_in_the_mean_iou():
    output = anchors_last(OBJECTS[:1])
    params = declared(output)
    cx, cy, w, h, label, score = OBJECTS[0]
    shifted = anchors_last([(cx + 2, cy, w, h, label, score - 0.1)])

    agreement = DETECTION.agree(decode(output, params), decode(shifted, params), params)

    assert agreement["f1"] == 1.0
    assert agreement["mean_iou"] == pytest.approx(18 * 20 / (2 * 400 - 18 * 20))
    assert agreement["score_error"] == pytest.approx(0.1)


def test_images_without_detections_on_either_side_agree():
    empty = anchors_last([])
    params = declared(empty)
    agreement = DETECTION.agree(decode(empty, params), decode(empty, params), params)
    assert agreement["f1"] == agreement["precision"] == agreement["recall"] == 1.0
    assert agreement["mean_iou"] is None


def test_a_candidate_that_finds_nothing_has_f1_0():
    params = declared(anchors_last([]))
    agreement = DETECTION.agree(
        decode(anchors_last(OBJECTS), params), decode(anchors_last([]), params), params
    )
    assert agreement["f1"] == agreement["recall"] == agreement["precision"] == 0.0


def detections(rng, count):
    """Return count samples of random decoded detections near random labelled boxes."""
    objects, boxes, classes, samples = [], [], [], []
    for sample in range(count):
        corners = rng.uniform(0, 200, (4, 2))
        truth = np.concatenate([corners, corners + rng.uniform(10, 60, (4, 2))], axis=1)
        labels = rng.integers(0, 3, 4)
        boxes.extend(truth)
        classes.extend(labels)
        samples.extend([sample] * 4)
        found = truth[:3] + rng.normal(0, 4, (3, 4))  # one missed, one extra
        found = np.concatenate([found, [[5, 5, 30, 30]]])
        objects.append(
            {
                "boxes": found,
                "scores": rng.uniform(0.3, 1, 4),
                "classes": np.concatenate([labels[:3], [1]]),
            }
        )
    labels = {
        "label_boxes": np.array(boxes, np.float32),
        "label_classes": np.array(classes, np.int64),
        "label_sample": np.array(samples, np.int64),
    }
    return objects, labels


def coco_box(box):
    x1, y1, x2, y2 = (float(value) for value in box)
    return [x1, y1, x2 - x1, y2 - y1]


def cocoeval_from_files(tmp_path, objects, labels):
    """Return COCOeval's stats from ground-truth and result JSON files (COCO's own way)."""
    rows = zip(labels["label_boxes"], labels["label_classes"], labels["label_sample"], strict=True)
    truth = {
        "images": [{"id": index + 1} for index in range(len(objects))],
        "categories": [{"id": int(label)} for label in set(labels["label_classes"].tolist())],
        "annotations": [
            {
                "id": index + 1,
                "image_id": int(sample) + 1,
                "category_id": int(label),
                "bbox": coco_box(box),
                "area": coco_box(box)[2] * coco_box(box)[3],
                "iscrowd": 0,
            }
            for index, (box, label, sample) in enumerate(rows)
        ],
    }
    results = [
        {"image_id": index + 1, "category_id": int(label), "bbox": coco_box(box), "score": score}
        for index, found in enumerate(objects)
        for box, score, label in zip(
            found["boxes"], found["scores"].tolist(), found["classes"], strict=True
        )
    ]
    (tmp_path / "truth.json").write_text(json.dumps(truth))
    (tmp_path / "results.json").write_text(json.dumps(results))
    with contextlib.redirect_stdout(io.StringIO()):
        ground = COCO(str(tmp_path / "truth.json"))
        evaluation = COCOeval(ground, ground.loadRes(str(tmp_path / "results.json")), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return evaluation.stats


def test_map_is_cocoevals_on_the_same_detections(tmp_path):
    objects, labels = detections(np.random.default_rng(3), 6)

    scored = DETECTION.score(objects, labels, {})
    stats = cocoeval_from_files(tmp_path, objects, labels)

    assert 0.1 < scored["map"] < 0.9  # neither nothing nor everything found
    assert scored["map"] == pytest.approx(stats[0]) and scored["map50"] == pytest.approx(stats[1])


def test_map_of_the_labels_themselves_is_1_and_of_nothing_0():
    objects, labels = detections(np.random.default_rng(4), 3)
    perfect = [
        {
            "boxes": labels["label_boxes"][labels["label_sample"] == index],
            "scores": np.ones(4),
            "classes": labels["label_classes"][labels["label_sample"] == index],
        }
        for index in range(3)
    ]
    nothing = [{"boxes": np.zeros((0, 4)), "scores": np.zeros(0), "classes": np.zeros(0)}] * 3

    assert DETECTION.score(perfect, labels, {}) == {"map": 1.0, "map50": 1.0}
    assert DETECTION.score(nothing, labels, {}) == {"map": 0.0, "map50": 0.0}


def segmentation_outputs(coefficients):
    """Return a [1, 4+1+2, A] head with coefficients per object, and [1, 2, 8, 8] prototypes."""
    protos = np.full((1, 2, 8, 8), -1.0, np.float32)
    protos[0, 0, :, :4] = 1.0  # prototype 0: the left half
    protos[0, 1, :4, :] = 1.0  # prototype 1: the top half
    objects = [(16, 16, 32, 32, 0, 0.9)]  # the whole 32 x 32 input: prototypes 0..8
    head = anchors_last(objects, classes=1, extra=np.array(coefficients, np.float32))
    return head, protos


def test_instance_masks_are_prototypes_combined_inside_the_box():
    task = TASKS["instance_segmentation"]
    head, protos = segmentation_outputs([[1.0, 0.0]])
    outputs = [
        {"name": "output0", "dtype": "float32", "shape": list(head.shape)},
        {"name": "output1", "dtype": "float32", "shape": list(protos.shape)},
    ]
    params = normalise({"task": task.name, "params": {"head": "anchors_last"}}, outputs)["params"]

    (found,) = task.decode([head, protos], ["output0", "output1"], params, 1, 1)

    assert params["protos"] == "output1" and params["extra_channels"] == 2
    assert params["classes"] == 1 and params["mask_stride"] == 4
    expected = np.zeros((8, 8), bool)
    expected[:, :4] = True
    assert found["masks"].shape == (1, 8, 8) and (found["masks"][0] == expected).all()


def test_instance_masks_are_cropped_to_their_box():
    task = TASKS["instance_segmentation"]
    protos = np.ones((1, 1, 8, 8), np.float32)
    head = anchors_last([(8, 8, 16, 16, 0, 0.9)], classes=1, extra=np.ones((1, 1), np.float32))
    params = {
        **normalise(
            {"task": task.name, "params": {"head": "anchors_last"}},
            [
                {"name": "a", "dtype": "float32", "shape": list(head.shape)},
                {"name": "p", "dtype": "float32", "shape": list(protos.shape)},
            ],
        )["params"]
    }

    (found,) = task.decode([head, protos], ["a", "p"], params, 1, 1)

    assert found["masks"][0].sum() == 16 and found["masks"][0][:4, :4].all()  # box 0..16 / 4


def test_mask_iou_of_matched_pairs():
    task = TASKS["instance_segmentation"]
    names = ["output0", "output1"]
    reference = segmentation_outputs([[1.0, 0.0]])  # left half: 32 pixels
    candidate = segmentation_outputs([[1.0, 1.0]])  # left and top: the top-left quarter
    outputs = [
        {"name": name, "dtype": "float32", "shape": list(array.shape)}
        for name, array in zip(names, reference, strict=True)
    ]
    params = normalise({"task": task.name, "params": {"head": "anchors_last"}}, outputs)["params"]

    agreement = task.agree(
        task.decode(list(reference), names, params, 1, 1),
        task.decode(list(candidate), names, params, 1, 1),
        params,
    )

    assert agreement["f1"] == 1.0
    # coefficients [1, 1] sum to 2 where both prototypes are 1, to 0 (not above 0) where one
    # is: 16 pixels, all inside the left half's 32
    assert agreement["mask_iou"] == pytest.approx(16 / 32)


def pose_output(points):
    """Return a YOLO-pose [1, 4+1+3K, A] output: one person at (50, 50), keypoints points."""
    return anchors_last(
        [(50, 50, 40, 80, 0, 0.9)], classes=1, extra=np.array(points, np.float32).reshape(1, -1)
    )


def test_keypoints_of_a_pose_head_and_their_pixel_error():
    task = TASKS["keypoints"]
    source = pose_output([[40, 30, 0.9], [60, 30, 0.8], [50, 90, 0.1]])
    engine = pose_output([[43, 34, 0.9], [60, 30, 0.8], [10, 10, 0.1]])  # 5 px; the last unseen
    outputs = [{"name": "pose", "dtype": "float32", "shape": list(source.shape)}]
    params = normalise({"task": "keypoints", "params": {"head": "anchors_last"}}, outputs)["params"]

    reference = task.decode([source], ["pose"], params, 1, 1)
    agreement = task.agree(reference, task.decode([engine], ["pose"], params, 1, 1), params)

    assert params["keypoints"] == 3 and params["classes"] == 1
    expected = [[[40, 30, 0.9], [60, 30, 0.8], [50, 90, 0.1]]]
    assert reference[0]["keypoints"] == pytest.approx(np.array(expected))
    assert agreement["f1"] == 1.0
    assert agreement["keypoint_error_px"] == pytest.approx((5 + 0) / 2)


def test_heatmap_keypoints_are_each_maps_peak():
    task = TASKS["keypoints"]
    maps = np.zeros((1, 2, 16, 12), np.float32)
    maps[0, 0, 3, 5] = 0.9  # y 3, x 5
    maps[0, 1, 10, 2] = 0.7
    moved = np.zeros_like(maps)
    moved[0, 0, 7, 8] = 0.9  # 3 right, 4 down: 5 px
    moved[0, 1, 10, 2] = 0.7
    outputs = [{"name": "heatmaps", "dtype": "float32", "shape": [1, 2, 16, 12]}]
    params = normalise({"task": "keypoints", "params": {"head": "heatmaps"}}, outputs)["params"]

    reference = task.decode([maps], ["heatmaps"], params, 1, 1)
    agreement = task.agree(reference, task.decode([moved], ["heatmaps"], params, 1, 1), params)

    assert params == {"head": "heatmaps", "output": "heatmaps", "keypoints": 2}
    assert reference[0]["keypoints"][0, :, :2].tolist() == [[5, 3], [2, 10]]
    assert agreement == {"keypoint_error_px": pytest.approx(2.5)}
    assert task.score(reference, {}, params) == {"map": None, "map50": None}


def test_a_borderline_box_one_side_drops_by_a_hair_is_no_disagreement():
    # The source scores a box 0.2505, the build 0.2495: the build's is decoded (it is within
    # the margin under the 0.25 threshold) to be matched, and not counted as missing.
    source = anchors_last(OBJECTS[:3] + [(80, 80, 20, 20, 1, 0.2505)])
    build = anchors_last(OBJECTS[:3] + [(80, 80, 20, 20, 1, 0.2495)])
    params = declared(source)
    (ours,), (theirs,) = decode(source, params), decode(build, params)

    agreement = DETECTION.agree([ours], [theirs], params)

    assert agreement["f1"] == 1.0 and agreement["recall"] == 1.0
    gone = anchors_last(OBJECTS[:3])  # the box really missing: a disagreement
    assert DETECTION.agree([ours], decode(gone, params), params)["recall"] == pytest.approx(3 / 4)


def test_map_scores_what_the_deployed_threshold_keeps_not_the_matching_margin():
    # A source scored on labels that are its own detections above 0.25 gets mAP 1.0, though
    # a box at 0.22 is decoded (under the threshold, for matching only).
    source = anchors_last(OBJECTS + [(200, 200, 10, 10, 1, 0.22)])
    params = declared(source)
    (found,) = decode(source, params)
    assert len(found["scores"]) == len(OBJECTS) + 1
    above = found["scores"] > 0.25
    labels = {
        "label_boxes": found["boxes"][above],
        "label_classes": found["classes"][above],
        "label_sample": np.zeros(int(above.sum()), dtype=np.int64),
    }

    assert DETECTION.score([found], labels, params)["map"] == pytest.approx(1.0)
