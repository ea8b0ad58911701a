"""Tasks other than detection (workers/tasks): decoders, agreement with FP32, labelled metrics,
and the declarations normalise() fills and refuses.

Every expected figure is worked out by hand in the test that checks it.
"""

import numpy as np
import pytest

from workers.errors import JobError
from workers.tasks import DEFAULT_TOLERANCES, TASKS, TaskError, normalise, propose


def output(name, shape, dtype="float32"):
    return {"name": name, "dtype": dtype, "shape": shape}


def test_every_task_of_the_spec_is_registered_with_its_headlines_and_tolerance():
    headlines = {
        name: (task.agreement.key, task.labelled and task.labelled.key)
        for name, task in TASKS.items()
    }
    assert headlines == {
        "classification": ("top1_agreement", "top1"),
        "detection": ("f1", "map"),
        "instance_segmentation": ("f1", "map"),
        "keypoints": ("keypoint_error_px", "map"),
        "semantic_segmentation": ("mask_iou_mean", "miou"),
        "text_recognition": ("exact_agreement", "cer"),
        "embedding": ("cosine_min", None),
        "generic": ("cosine_min", None),
    }
    assert set(DEFAULT_TOLERANCES) == set(TASKS)
    assert not TASKS["keypoints"].agreement.higher_is_better
    assert not TASKS["text_recognition"].labelled.higher_is_better


def test_a_task_error_is_a_job_error_and_a_value_error():
    assert issubclass(TaskError, JobError) and issubclass(TaskError, ValueError)


@pytest.mark.parametrize(
    "declaration, outputs, message",
    [
        ({"task": "depth"}, [output("y", [1, 10])], "unknown task 'depth'"),
        (
            {"task": "detection", "params": {"clases": 3}},
            [output("y", [1, 7, 200])],
            "detection takes no param 'clases'",
        ),
        (
            {"task": "classification", "params": {"output": "nope"}},
            [output("y", [1, 10])],
            "classification param 'output' names no output of the model: 'nope'",
        ),
        (
            {"task": "detection", "params": {"head": "anchors_last", "classes": 9}},
            [output("y", [1, 84, 8400])],
            "84 channels per anchor, not 4 box values \\+ 9 classes",
        ),
        (
            {"task": "detection", "params": {"head": "anchors_last"}},
            [output("y", [1, "C", "A"])],
            "detection param 'classes' is needed",
        ),
        (
            {"task": "detection", "params": {"head": "yolo"}},
            [output("y", [1, 84, 8400])],
            "detection param 'head' must be one of anchors_last, anchors_first, nms_outputs",
        ),
        (
            {"task": "detection", "params": {}},
            [output("y", [1, 10])],
            "detection param 'head' is missing",
        ),
        (
            {"task": "detection", "params": {"head": "anchors_last", "score_threshold": 2}},
            [output("y", [1, 84, 8400])],
            "'score_threshold' must be a number from 0 to 1",
        ),
        (
            {"task": "detection", "params": {"head": "nms_outputs"}},
            [output("det_boxes", [1, 100, 4]), output("det_scores", [1, 100])],
            "detection param 'outputs' needs 'classes'",
        ),
        (
            {"task": "text_recognition", "params": {"charset": "abc"}},
            [output("y", [1, 40, 5])],
            "text_recognition param 'charset' has 3 characters but the output has 5 classes",
        ),
        (
            {"task": "semantic_segmentation", "params": {"classes": 3}},
            [output("y", [1, 21, 64, 64])],
            "'classes' is 3 but the logits have 21",
        ),
        (
            {"task": "keypoints", "params": {"head": "heatmaps", "keypoints": 5}},
            [output("y", [1, 17, 64, 48])],
            "'keypoints' is 5 but 'y' has 17 heatmaps",
        ),
        (
            {"task": "instance_segmentation", "params": {"head": "anchors_last", "classes": 80}},
            [output("y", [1, 116, 8400]), output("p", [1, 16, 160, 160])],
            "80 classes \\+ 16 extra channels",
        ),
    ],
)
def test_it_refuses_a_declaration_naming_the_param(declaration, outputs, message):
    with pytest.raises(TaskError, match=message):
        normalise(declaration, outputs)


def test_it_fills_the_defaults_and_reads_classes_from_the_shape():
    params = normalise({"task": "detection", "params": {}}, [output("out", [1, 84, "anchors"])])

    assert params == {
        "task": "detection",
        "params": {
            "head": "anchors_last",
            "output": "out",
            "box_format": "cxcywh",
            "classes": 80,
            "extra_channels": 0,
            "score_threshold": 0.25,
            "iou_threshold": 0.45,
            "max_detections": 300,
            "image_size": None,
        },
    }


def test_it_clips_boxes_to_the_image_it_proposes_from_the_input():
    inputs = [{"name": "images", "dtype": "float", "shape": [1, 3, 40, 64]}]
    outputs = [output("out", [1, 6, 100])]
    declaration = propose(inputs, outputs)
    assert declaration["params"]["image_size"] == [40, 64]
    row = np.zeros((1, 6, 100), dtype=np.float32)
    row[0, :, 0] = [60, 38, 20, 10, 0.9, 0.1]  # centre near the corner: x2 70, y2 43
    [found] = TASKS["detection"].decode([row], ["out"], declaration["params"], 1, 1)
    assert found["boxes"].tolist() == [[50.0, 33.0, 64.0, 40.0]]
    unclipped = {**declaration["params"], "image_size": None}
    [found] = TASKS["detection"].decode([row], ["out"], unclipped, 1, 1)
    assert found["boxes"].tolist() == [[50.0, 33.0, 70.0, 43.0]]


def test_extra_channels_after_the_class_scores_are_declared():
    outputs = [output("out", [1, 25200, 117])]
    declaration = {"task": "detection", "params": {"head": "anchors_first", "classes": 80}}
    with pytest.raises(TaskError, match="check 'classes' and 'extra_channels'"):
        normalise(declaration, outputs)

    declaration["params"]["extra_channels"] = 32
    assert normalise(declaration, outputs)["params"]["classes"] == 80


def test_classification_agreement_is_the_share_of_equal_top_classes():
    task = TASKS["classification"]
    params = normalise({"task": "classification"}, [output("logits", [1, 3])])["params"]
    source = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5], [1, 0, 0]])
    engine = np.array([[0.2, 0.7, 0.1], [0.1, 0.8, 0.1], [0.2, 0.3, 0.5], [0.9, 0, 0.1]])

    agreement = task.agree(
        task.decode([source], ["logits"], params, 4, 4),
        task.decode([engine], ["logits"], params, 4, 4),
        params,
    )

    assert params == {"output": "logits"} and agreement == {"top1_agreement": 0.75}


def test_semantic_segmentation_decodes_logits_by_argmax_over_classes():
    task = TASKS["semantic_segmentation"]
    logits = np.zeros((2, 3, 2, 2), np.float32)
    logits[0, 2, 0, 1] = logits[0, 1, 1, :] = 1.0
    logits[1, 1] = 1.0
    params = normalise({"task": task.name}, [output("out", [2, 3, 2, 2])])["params"]

    found = task.decode([logits], ["out"], params, 2, 1)  # the second row is padding

    assert params == {"output": "out", "layout": "logits", "classes": 3, "ignore_index": 255}
    assert len(found) == 1 and found[0]["mask"].tolist() == [[0, 2], [1, 1]]


def masks(*rows):
    return [{"mask": np.array(mask)} for mask in rows]


def test_mask_agreement_is_the_mean_class_iou_per_image():
    task = TASKS["semantic_segmentation"]
    reference = masks([[0, 0], [1, 1]], [[2, 2], [2, 2]])
    candidate = masks([[0, 1], [1, 1]], [[2, 2], [2, 2]])

    agreement = task.agree(reference, candidate, {})

    # image 1: class 0 1/2, class 1 2/3; image 2: 1
    assert agreement["mask_iou_mean"] == pytest.approx(((1 / 2 + 2 / 3) / 2 + 1) / 2)
    assert agreement["pixel_agreement"] == pytest.approx(7 / 8)


def test_miou_comes_from_one_confusion_matrix_ignoring_255():
    task = TASKS["semantic_segmentation"]
    found = masks([[0, 0], [1, 1]], [[2, 2], [2, 0]])
    labels = np.array([[[0, 1], [1, 1]], [[2, 2], [255, 0]]])
    params = {"classes": 3, "ignore_index": 255}

    scores = task.score(found, {"label_masks": labels}, params)

    # class 0: 2 hits, 2 labelled, 3 predicted -> 2/3; class 1: 2, 3, 2 -> 2/3; class 2: 2/2
    assert scores["miou"] == pytest.approx((2 / 3 + 2 / 3 + 1) / 3)
    assert scores["pixel_accuracy"] == pytest.approx(6 / 7)
    larger = labels.repeat(2, axis=1).repeat(2, axis=2)  # label masks at twice the size
    assert task.score(found, {"label_masks": larger}, params) == scores


def ctc_steps(tokens, vocabulary):
    """Return one-hot [T, V] step scores whose argmax per step is tokens."""
    steps = np.zeros((len(tokens), vocabulary), np.float32)
    steps[np.arange(len(tokens)), tokens] = 1.0
    return steps


CHARSET = "-abcdefghijklmnopqrstuvwxyz"  # the blank at 0: h is 8, e 5, l 12, o 15


def test_text_is_greedy_ctc_repeats_collapsed_and_blanks_dropped():
    task = TASKS["text_recognition"]
    steps = ctc_steps([0, 8, 8, 0, 5, 12, 12, 0, 12, 15, 15], len(CHARSET))
    outputs = [output("logits", [1, 11, len(CHARSET)])]
    params = normalise({"task": task.name, "params": {"charset": CHARSET}}, outputs)["params"]

    (found,) = task.decode([steps[None]], ["logits"], params, 1, 1)
    (time_first,) = task.decode([steps[:, None]], ["logits"], {**params, "layout": "TNV"}, 1, 1)

    assert found == {"tokens": [8, 5, 12, 12, 15], "text": "hello"} == time_first


def test_text_without_a_charset_is_its_token_ids():
    task = TASKS["text_recognition"]
    params = normalise({"task": task.name}, [output("rec", [1, 4, 6])])["params"]
    (found,) = task.decode([ctc_steps([3, 0, 3, 5], 6)[None]], ["rec"], params, 1, 1)
    assert found == {"tokens": [3, 3, 5], "text": "3 3 5"}


def texts(*strings):
    return [{"tokens": [CHARSET.index(c) for c in text], "text": text} for text in strings]


def test_cer_is_edit_distances_over_label_lengths():
    task = TASKS["text_recognition"]
    labels = {"label_texts": np.array(["hello", "world", "ok"])}

    scores = task.score(texts("hallo", "word", "ok"), labels, {"charset": CHARSET})

    assert scores["cer"] == pytest.approx(2 / 12)  # one substitution, one deletion
    assert scores["exact"] == pytest.approx(1 / 3)


def test_text_agreement_compares_strings_with_the_sources():
    task = TASKS["text_recognition"]
    agreement = task.agree(texts("hello", "world"), texts("hello", "wordl"), {})
    assert agreement == {"exact_agreement": 0.5, "cer_vs_source": pytest.approx(2 / 10)}


def test_embedding_agreement_is_cosine_similarity():
    task = TASKS["embedding"]
    params = normalise({"task": "embedding"}, [output("embedding", [2, 2])])["params"]
    source = np.array([[1.0, 0.0], [1.0, 1.0]])
    engine = np.array([[1.0, 1.0], [2.0, 2.0]])

    agreement = task.agree(
        task.decode([source], ["embedding"], params, 2, 2),
        task.decode([engine], ["embedding"], params, 2, 2),
        params,
    )

    assert agreement["cosine_min"] == pytest.approx(np.sqrt(0.5))
    assert agreement["cosine_mean"] == pytest.approx((np.sqrt(0.5) + 1) / 2)


def test_generic_compares_every_output_and_names_each():
    task = TASKS["generic"]
    names = ["a", "b"]
    source = [np.array([[1.0, 0.0]]), np.array([[2.0, 4.0]])]
    engine = [np.array([[1.0, 0.0]]), np.array([[2.0, 5.0]])]

    agreement = task.agree(
        task.decode(source, names, {}, 1, 1), task.decode(engine, names, {}, 1, 1), {}
    )

    whole = (1 * 1 + 4 + 20) / (np.sqrt(21) * np.sqrt(30))  # [1, 0, 2, 4] . [1, 0, 2, 5]
    assert agreement["cosine_min"] == pytest.approx(whole)
    assert agreement["max_rel_error"] == pytest.approx(0.25)
    assert agreement["per_output"] == [
        {"name": "a", "cosine_min": 1.0, "max_rel_error": 0.0},
        {
            "name": "b",
            "cosine_min": pytest.approx(24 / (np.sqrt(20) * np.sqrt(29))),
            "max_rel_error": pytest.approx(0.25),
        },
    ]
