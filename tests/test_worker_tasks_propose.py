"""propose(): the task a model's outputs most likely mean, from their names and shapes."""

import pytest

from workers.tasks import normalise, propose

IMAGE = [{"name": "images", "dtype": "float32", "shape": [1, 3, 640, 640]}]


def output(name, shape, dtype="float32"):
    return {"name": name, "dtype": dtype, "shape": shape}


def proposed(*outputs, operators=None):
    return propose(IMAGE, list(outputs), operators)


@pytest.mark.parametrize("shape", [[1, 84, 8400], ["batch", 84, "anchors"], [None, 84, -1]])
def test_a_yolov8_head_is_detection_anchors_last_with_80_classes(shape):
    proposal = proposed(output("output0", shape))

    assert proposal["task"] == "detection"
    assert proposal["params"]["head"] == "anchors_last" and proposal["params"]["classes"] == 80
    assert "YOLO-style head, 4 box values then 80 class scores per anchor" in proposal["why"]


def test_a_yolov5_head_is_detection_anchors_first():
    proposal = proposed(output("output", [1, 25200, 85]))
    assert (proposal["task"], proposal["params"]["head"]) == ("detection", "anchors_first")
    assert proposal["params"]["classes"] == 80 and "objectness" in proposal["why"]


@pytest.mark.parametrize(
    "names", [("boxes", "scores", "classes"), ("det_boxes", "det_scores", "det_classes")]
)
def test_named_boxes_scores_and_classes_are_nms_in_the_graph(names):
    boxes, scores, classes = names
    proposal = proposed(
        output(boxes, [1, 100, 4]),
        output(scores, [1, 100]),
        output(classes, [1, 100], "int64"),
        output("num_dets", [1, 1], "int32"),
    )

    assert proposal["task"] == "detection" and proposal["params"]["head"] == "nms_outputs"
    assert proposal["params"]["outputs"] == {
        "boxes": boxes,
        "scores": scores,
        "classes": classes,
        "count": "num_dets",
    }


def test_an_nms_operator_with_rows_of_six_is_nms_rows():
    proposal = proposed(output("dets", [1, 100, 6]), operators={"NonMaxSuppression": 1})
    assert proposal["params"]["head"] == "nms_rows" and "NonMaxSuppression" in proposal["why"]


def test_an_nms_operator_with_unknown_outputs_is_generic_and_says_why():
    proposal = proposed(
        output("a", [1, 100, 5]), output("b", [1, 3]), operators={"EfficientNMS_TRT": 1}
    )
    assert proposal["task"] == "generic" and "EfficientNMS_TRT" in proposal["why"]


def test_a_pose_head_is_keypoints_only_when_its_name_says_so():
    pose = proposed(output("pose_out", [1, 56, 8400]))
    plain = proposed(output("output0", [1, 56, 8400]))

    assert pose["task"] == "keypoints" and pose["params"]["keypoints"] == 17
    assert plain["task"] == "detection" and "declare keypoints" in plain["why"]


def test_a_head_with_prototypes_is_instance_segmentation():
    proposal = proposed(output("output0", [1, 116, 8400]), output("output1", [1, 32, 160, 160]))

    assert proposal["task"] == "instance_segmentation"
    assert proposal["params"]["protos"] == "output1" and proposal["params"]["classes"] == 80
    assert proposal["params"]["mask_stride"] == 4  # 640 input pixels, 160 prototype pixels


def test_per_pixel_scores_are_semantic_segmentation_logits():
    proposal = proposed(output("out", [1, 21, 64, 64]))
    assert proposal["task"] == "semantic_segmentation"
    assert proposal["params"]["layout"] == "logits" and proposal["params"]["classes"] == 21


def test_heatmaps_are_keypoints():
    proposal = proposed(output("heatmaps", [1, 17, 64, 48]))
    assert proposal["task"] == "keypoints" and proposal["params"]["head"] == "heatmaps"


@pytest.mark.parametrize("shape, layout", [([1, 40, 97], "NTV"), ([40, 1, 97], "TNV")])
def test_per_step_logits_are_text_recognition(shape, layout):
    proposal = proposed(output("logits", shape))
    assert proposal["task"] == "text_recognition" and proposal["params"]["layout"] == layout


@pytest.mark.parametrize("name", ["embedding", "features", "emb", "image_embeds"])
def test_a_vector_named_like_one_is_an_embedding(name):
    assert proposed(output(name, [1, 512]))["task"] == "embedding"


@pytest.mark.parametrize("shape", [[1, 1000], ["N", 1000], [None, 10], [1, 1000, 1, 1]])
def test_one_2d_output_is_classification(shape):
    proposal = proposed(output("output", shape))
    assert proposal["task"] == "classification" and proposal["params"] == {"output": "output"}


def test_several_unknown_outputs_are_generic():
    proposal = proposed(output("a", [1, 10]), output("b", [1, 4, 4]))
    assert proposal == {
        "task": "generic",
        "params": {},
        "why": "2 outputs that fit no known head: each is compared with FP32",
    }


def test_a_proposal_is_a_declaration_normalise_accepts_as_it_is():
    outputs = [output("output0", [1, 116, 8400]), output("output1", [1, 32, 160, 160])]
    proposal = propose(IMAGE, outputs)
    declaration = normalise(proposal, outputs)
    assert declaration == {"task": proposal["task"], "params": proposal["params"]}
