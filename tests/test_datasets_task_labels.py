"""Datasets carry their task's labels: boxes, keypoints, masks and strings, as teams have them.

Files are made here (Pillow images, COCO json, YOLO txt, PNG masks, OCR lines); where the
labels land in the model input is checked against the preprocessed pixels themselves.
"""

import io
import json
import zipfile

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from PIL import Image, ImageDraw

from deployhub.registry.contract import default_contract
from deployhub.registry.datasets import STORED, DatasetError, load_npz, read_dataset
from deployhub.registry.label_formats import (
    Geometry,
    boxes_to_input,
    input_geometry,
    points_to_input,
)
from deployhub.registry.models import Dataset, Model
from deployhub.registry.uploads import create_version
from tests.api_calls import token_for
from tests.conftest import PASSWORD
from tests.io_models import FLOAT, io_model
from tests.registry_corpus import default_cap

CAP = default_cap()
MB = 1024 * 1024
WIDTH, HEIGHT = 200, 120  # every test image
# Stretch to 67x49, then crop 32x32: left = round(35 / 2) = 18, top = round(17 / 2) = 8
# (Python rounds halves to even, as torchvision's int(round(...)) does).
SPEC = {
    "resize": {"height": 49, "width": 67, "interpolation": "nearest"},
    "center_crop": {"height": 32, "width": 32},
    "layout": "NHWC",
}
INPUTS = [{"name": "image", "dtype": "float", "shape": ["N", 32, 32, 3]}]
DETECTOR_NEEDS = (
    "A validation dataset for a detector needs boxes: a COCO annotations.json or YOLO "
    "labels/*.txt in the image zip, or label_boxes, label_classes and label_sample arrays in "
    "the .npz."
)


def to_input(x, y):
    """Where an image pixel coordinate lands in the input, worked out by hand for SPEC."""
    return x * 67 / 200 - 18, y * 49 / 120 - 8


def png(boxes=(), size=(WIDTH, HEIGHT), fill=None):
    """Return a black PNG with a white rectangle per xyxy box (or the gray levels of fill)."""
    if fill is not None:
        image = Image.fromarray(fill.astype(np.uint8)).convert("RGB")
    else:
        image = Image.new("RGB", size)
        for x1, y1, x2, y2 in boxes:
            ImageDraw.Draw(image).rectangle((x1, y1, x2 - 1, y2 - 1), fill="white")
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def gray_png(array, mode="L"):
    """Return a single-channel PNG of class ids: gray levels (L) or palette indices (P)."""
    image = Image.frombytes(mode, array.shape[::-1], array.astype(np.uint8).tobytes())
    if mode == "P":  # a full palette, so the indices are written as they are
        image.putpalette([v for i in range(256) for v in (i, 255 - i, i // 2)])
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def zip_of(files):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data if isinstance(data, bytes) else str(data))
    return buffer.getvalue()


def npz_of(**arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def coco(images, annotations, categories=((1, "cat"),)):
    return json.dumps(
        {
            "images": [
                {"id": i, "file_name": name, "width": WIDTH, "height": HEIGHT}
                for i, name in enumerate(images, start=1)
            ],
            "annotations": annotations,
            "categories": [{"id": cid, "name": name} for cid, name in categories],
        }
    )


def read(tmp_path, data, *, task, filename="d.zip", require_labels=True):
    """Run the hub's dataset reader on an upload; return (facts, the stored arrays)."""
    path = tmp_path / filename
    path.write_bytes(data)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    params = {
        "filename": filename,
        "require_labels": require_labels,
        "inputs": INPUTS,
        "contract": default_contract(INPUTS),
        "preprocessing": SPEC,
        "task": task,
        "max_bytes": 10 * MB,
    }
    facts = read_dataset(path, work, params, cap=CAP)
    with np.load(work / STORED, allow_pickle=False) as stored:
        return facts, {name: stored[name] for name in stored.files}


def refusal(tmp_path, data, *, task, filename="d.zip", require_labels=True):
    with pytest.raises(DatasetError) as refused:
        read(tmp_path, data, task=task, filename=filename, require_labels=require_labels)
    work = tmp_path / "work"
    assert list(work.iterdir()) == []  # nothing stored, no scratch left
    return str(refused.value)


def white_extent(tensor):
    """Return the xyxy extent of the white pixels of an HWC input, in input pixels."""
    ys, xs = np.nonzero(tensor[..., 0] > 127)
    return [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]


# -- The geometry ------------------------------------------------------------------------


def test_it_maps_image_pixels_through_the_stretch_and_the_rounded_crop():
    geometry = input_geometry(SPEC, WIDTH, HEIGHT)

    assert geometry == Geometry(67 / 200, 49 / 120, 18, 8, 32, 32)
    assert input_geometry({"center_crop": {"height": 100, "width": 100}}, 101, 103) == Geometry(
        1.0, 1.0, 0, 2, 100, 100
    )  # round(0.5) = 0, round(1.5) = 2
    assert input_geometry({}, 640, 480) == Geometry(1.0, 1.0, 0, 0, 640, 480)


def test_it_clips_boxes_to_the_input_and_drops_those_with_nothing_left():
    geometry = input_geometry(SPEC, WIDTH, HEIGHT)
    boxes = [(60, 30, 140, 90), (10, 10, 120, 50), (0, 0, 40, 40)]

    mapped, kept = boxes_to_input(boxes, geometry)

    (x1, y1), (x2, y2) = to_input(60, 30), to_input(140, 90)
    np.testing.assert_allclose(mapped[0], [x1, y1, x2, y2], atol=1e-4)
    np.testing.assert_allclose(mapped[1], [0, 0, to_input(120, 0)[0], to_input(0, 50)[1]], 1e-5)
    assert kept.tolist() == [True, True, False]


def test_keypoints_outside_the_input_become_invisible():
    geometry = input_geometry(SPEC, WIDTH, HEIGHT)

    points = points_to_input([[100, 60, 2], [5, 5, 2], [120, 70, 1]], geometry)

    np.testing.assert_allclose(points[0], [*to_input(100, 60), 2], atol=1e-4)
    assert points[1, 2] == 0 and points[2, 2] == 1


# -- Image zips ----------------------------------------------------------------------------


def test_a_coco_zip_gives_boxes_where_the_objects_are_in_the_input(tmp_path):
    box = (60, 30, 140, 90)
    annotations = [
        {"id": 1, "image_id": 1, "bbox": [60, 30, 80, 60], "category_id": 7},
        {"id": 2, "image_id": 2, "bbox": [0, 0, 40, 40], "category_id": 3},  # cropped away
        {"id": 3, "image_id": 2, "bbox": [50, 20, 10, 10], "category_id": 1, "iscrowd": 1},
    ]
    document = coco(["a.png", "b.png"], annotations, [(7, "dog"), (1, "cat"), (3, "car")])
    files = {"images/a.png": png([box]), "images/b.png": png(), "images/c.png": png()}

    facts, stored = read(
        tmp_path, zip_of({**files, "annotations.json": document}), task="detection"
    )

    # The white rectangle, found in the preprocessed pixels, is where the label says.
    np.testing.assert_allclose(stored["label_boxes"][0], white_extent(stored["inputs"][0]), atol=1)
    assert stored["label_classes"].tolist() == [2]  # ids 1, 3, 7: dog (7) is class 2
    assert stored["label_sample"].tolist() == [0]
    assert stored["label_boxes"].dtype == np.float32 and "labels" not in stored
    assert facts["task"] == "detection" and facts["labels"] and facts["classes"] == 1
    assert facts["label_summary"] == (
        "1 box in 1 of 3 images, 1 class; 1 crowd annotation left out; class i is the i-th "
        "category by id: 0 cat, 1 car, 2 dog; 1 box outside the model input left out"
    )


def test_a_coco_file_listing_more_images_than_the_zip_holds_keeps_those_it_has(tmp_path):
    # The whole val2017 annotations beside a few of its images, as teams have them.
    annotations = [
        {"id": 1, "image_id": 1, "bbox": [60, 30, 80, 60], "category_id": 1},
        {"id": 2, "image_id": 2, "bbox": [10, 10, 40, 40], "category_id": 1},
        {"id": 3, "image_id": 3, "bbox": [10, 10, 40, 40], "category_id": 1},
    ]
    document = coco(["a.png", "elsewhere.png", "too.png"], annotations)

    facts, stored = read(
        tmp_path, zip_of({"a.png": png(), "annotations.json": document}), task="detection"
    )

    assert stored["label_sample"].tolist() == [0] and len(stored["inputs"]) == 1
    assert "2 listed images not in the archive left out" in facts["label_summary"]


def test_coco_keypoints_are_mapped_with_their_boxes(tmp_path):
    keypoints = [100, 60, 2, 5, 5, 2]
    annotations = [
        {"image_id": 1, "bbox": [60, 30, 80, 60], "category_id": 1, "keypoints": keypoints}
    ]
    files = {"a.png": png(), "annotations.json": coco(["a.png"], annotations)}

    facts, stored = read(tmp_path, zip_of(files), task="keypoints")

    assert stored["label_keypoints"].shape == (1, 2, 3)
    np.testing.assert_allclose(stored["label_keypoints"][0, 0], [*to_input(100, 60), 2], 1e-4)
    assert stored["label_keypoints"][0, 1, 2] == 0  # (5, 5) is cropped away
    assert facts["task"] == "keypoints" and "2 keypoints each" in facts["label_summary"]


@pytest.mark.parametrize(
    "layout",
    [
        {"images/a.png": "PNG", "labels/a.txt": "LINES"},
        {"a.png": "PNG", "a.txt": "LINES"},
        {"images/val/a.png": "PNG", "labels/val/a.txt": "LINES"},
    ],
    ids=["labels folder", "beside the image", "mirrored folders"],
)
def test_yolo_labels_are_read_from_each_usual_place(tmp_path, layout):
    box = (60, 30, 140, 90)
    line = "4 0.5 0.5 0.4 0.5\n"  # cx, cy, w, h of the box, as fractions of 200x120
    content = {"PNG": png([box]), "LINES": line}
    files = {name: content[kind] for name, kind in layout.items()}

    facts, stored = read(tmp_path, zip_of({**files, "other.png": png()}), task="detection")

    (x1, y1), (x2, y2) = to_input(60, 30), to_input(140, 90)
    sample = stored["label_sample"][0]
    np.testing.assert_allclose(stored["label_boxes"], [[x1, y1, x2, y2]], atol=1e-4)
    np.testing.assert_allclose(stored["label_boxes"][0], white_extent(stored["inputs"][sample]), 1)
    assert stored["label_classes"].tolist() == [4] and len(stored["inputs"]) == 2
    assert facts["label_summary"] == "1 box in 1 of 2 images, 1 class"


def test_yolo_pose_lines_carry_keypoints_and_segment_lines_a_polygon(tmp_path):
    pose = "0 0.5 0.5 0.4 0.5 0.5 0.5 2 0.025 0.04 1\n"
    facts, stored = read(tmp_path, zip_of({"a.png": png(), "a.txt": pose}), task="keypoints")
    np.testing.assert_allclose(stored["label_keypoints"][0, 0], [*to_input(100, 60), 2], 1e-4)
    assert stored["label_keypoints"][0, 1, 2] == 0

    polygon = "1 0.3 0.25 0.7 0.25 0.5 0.75\n"  # its bounding box is (60, 30, 140, 90)
    files = {"a.png": png(), "a.txt": polygon}
    _, stored = read(tmp_path, zip_of(files), task="instance_segmentation")
    (x1, y1), (x2, y2) = to_input(60, 30), to_input(140, 90)
    np.testing.assert_allclose(stored["label_boxes"], [[x1, y1, x2, y2]], atol=1e-4)


def test_png_masks_are_resized_and_cropped_like_their_images(tmp_path):
    classes = (np.arange(WIDTH)[None, :] // 25 % 4).repeat(HEIGHT, axis=0).astype(np.uint8)
    classes[:10] = 255  # ignored pixels
    other = np.full((HEIGHT, WIDTH), 2, np.uint8)
    files = {
        "images/a.png": png(fill=classes),  # the image's gray levels are its classes
        "images/b.png": png(fill=other),
        "masks/a.png": gray_png(classes),
        "masks/b.png": gray_png(other, "P"),
    }

    facts, stored = read(tmp_path, zip_of(files), task="semantic_segmentation")

    assert stored["label_masks"].shape == (2, 32, 32) and stored["label_masks"].dtype == np.uint8
    np.testing.assert_array_equal(stored["label_masks"], stored["inputs"][..., 0])
    assert facts["classes"] == 4 and facts["label_summary"] == "2 masks of 32x32, 4 classes"


def test_ocr_lines_give_one_string_per_image(tmp_path):
    lines = "a.png\tStraße 12\n\nwords/b.png\t東京\n"
    files = {"a.png": png(), "words/b.png": png(), "unlisted.png": png(), "labels.txt": lines}

    facts, stored = read(tmp_path, zip_of(files), task="text_recognition")

    assert stored["label_texts"].tolist() == ["Straße 12", "東京"]
    assert stored["label_texts"].dtype.kind == "U" and len(stored["inputs"]) == 2
    assert facts["label_summary"] == "2 strings of 2-9 characters" and facts["classes"] is None

    csv_lines = 'filename,text\nb.png,"1,50 €"\n'  # found by its file name alone
    files = {"words/b.png": png(), "labels.csv": csv_lines}
    _, stored = read(tmp_path, zip_of(files), task="text_recognition")
    assert stored["label_texts"].tolist() == ["1,50 €"]


def test_a_classifiers_zip_is_read_as_before(tmp_path):
    files = {"a.png": png(), "b.png": png(), "labels.csv": "filename,label\na.png,3\nb.png,1\n"}

    facts, stored = read(tmp_path, zip_of(files), task="classification")

    assert stored["labels"].tolist() == [3, 1]
    assert facts["task"] == "classification" and facts["label_summary"] == "2 labels, 2 classes"


def test_a_calibration_zip_may_carry_labels_or_none(tmp_path):
    files = {"a.png": png(), "masks/a.png": gray_png(np.zeros((HEIGHT, WIDTH), np.uint8))}

    facts, stored = read(tmp_path, zip_of({"a.png": png()}), task="detection", require_labels=False)
    assert facts["task"] == "" and facts["label_summary"] == "" and not facts["labels"]
    assert sorted(stored) == ["inputs"]
    facts, _ = read(tmp_path, zip_of(files), task="semantic_segmentation", require_labels=False)
    assert facts["task"] == "semantic_segmentation"


# -- Refusals of image zips ----------------------------------------------------------------


def test_a_detectors_validation_set_needs_boxes(tmp_path):
    assert refusal(tmp_path, zip_of({"a.png": png()}), task="detection") == DETECTOR_NEEDS
    message = refusal(
        tmp_path, npz_of(inputs=np.zeros((2, 32, 32, 3))), task="detection", filename="d.npz"
    )
    assert message == DETECTOR_NEEDS


@pytest.mark.parametrize(
    "task, message",
    [
        (
            "semantic_segmentation",
            "A validation dataset for a semantic segmenter needs masks: "
            "masks/<image stem>.png (one class id per pixel, 255 = ignore) in the image zip, or a "
            "label_masks array in the .npz.",
        ),
        (
            "text_recognition",
            "A validation dataset for a text recogniser needs strings: "
            "labels.txt (filename<TAB>text) or labels.csv (filename,text) in the image zip, or a "
            "label_texts array in the .npz.",
        ),
        ("keypoints", "A validation dataset for a keypoint detector needs boxes: a COCO"),
    ],
)
def test_each_task_says_what_its_validation_set_needs(tmp_path, task, message):
    assert refusal(tmp_path, zip_of({"a.png": png()}), task=task).startswith(message)


def test_it_refuses_labels_for_another_task_than_the_versions(tmp_path):
    classified = {"a.png": png(), "labels.csv": "filename,label\na.png,1\n"}
    assert refusal(tmp_path, zip_of(classified), task="detection") == (
        "The dataset holds class labels (labels.csv with a label column), which are not labels "
        "for this version's task: it is a detector (detection), whose labels are boxes: a COCO "
        "annotations.json or YOLO labels/*.txt in the image zip, or label_boxes, label_classes "
        "and label_sample arrays in the .npz."
    )
    boxed = {"a.png": png(), "labels/a.txt": "0 0.5 0.5 0.2 0.2\n"}
    message = refusal(tmp_path, zip_of(boxed), task="classification", require_labels=False)
    assert message.startswith("The dataset holds boxes (YOLO labels/*.txt), which are not")
    assert "it is a classifier (classification), whose labels are class labels: labels.csv" in (
        message
    )


def test_a_model_without_a_labelled_metric_keeps_labels_for_what_they_are(tmp_path):
    boxed = {"a.png": png(), "labels/a.txt": "0 0.5 0.5 0.2 0.2\n"}

    facts, stored = read(tmp_path, zip_of(boxed), task="embedding")

    assert facts["task"] == "detection" and "label_boxes" in stored


def coco_zip(document):
    return zip_of({"a.png": png(), "annotations.json": document})


ONE_BOX = [{"image_id": 1, "bbox": [60, 30, 80, 60], "category_id": 1}]


@pytest.mark.parametrize(
    "files, message",
    [
        ({"a.png": png(), "annotations.json": "{not json"}, "annotations.json is not valid JSON"),
        ({"a.png": png(), "annotations.json": "{}"}, "annotations.json is not COCO: it needs"),
        (
            {"a.png": png(), "x.json": coco(["a.png"], ONE_BOX), "y.json": "{}"},
            "The archive holds several .json files (x.json, y.json); name the COCO file "
            "annotations.json.",
        ),
        (
            {"a.png": png(), "annotations.json": coco(["gone.png"], ONE_BOX)},
            "annotations.json lists 1 image and none of them is in the archive.",
        ),
        (
            {
                "a.png": png(),
                "annotations.json": coco(["a.png"], [{**ONE_BOX[0], "category_id": 9}]),
            },
            "annotations.json: an annotation names category id 9, which is not in its categories.",
        ),
        (
            {
                "a.png": png(),
                "annotations.json": coco(["a.png"], [{**ONE_BOX[0], "bbox": [1, 2, -3, 4]}]),
            },
            "an annotation's bbox is [1, 2, -3, 4]; a COCO bbox is [x, y, width, height]",
        ),
        (
            {"a.png": png(size=(100, 60)), "annotations.json": coco(["a.png"], ONE_BOX)},
            "'a.png' is 100x60 pixels but its annotation says 200x120; boxes are in the pixels "
            "of the image as stored.",
        ),
        (
            {
                "a.png": png(),
                "annotations.json": coco(["a.png"], [{**ONE_BOX[0], "bbox": [0, 0, 9, 9]}]),
            },
            "No box lies inside the model input after the resize and center crop (1 box left out).",
        ),
        (
            {"a.png": png(), "labels/a.txt": "0 120 60 80 60\n"},
            "labels/a.txt line 1: YOLO coordinates are fractions of the image, 0 to 1; these are "
            "'120 60 80 60' (pixels?).",
        ),
        (
            {"a.png": png(), "labels/a.txt": "0 0.5 0.5 0.2\n"},
            "labels/a.txt line 1: a line is 'class cx cy w h'; this one has 4 numbers.",
        ),
        (
            {"a.png": png(), "labels/a.txt": "\ncar 0.5 0.5 0.2 0.2\n"},
            "labels/a.txt line 2: 'car 0.5 0.5 0.2 0.2' is not a list of numbers.",
        ),
        ({"a.png": png(), "labels/a.txt": ""}, "The labels hold no boxes"),
    ],
)
def test_it_explains_what_is_wrong_with_boxes(tmp_path, files, message):
    assert message in refusal(tmp_path, zip_of(files), task="detection")


@pytest.mark.parametrize(
    "masks, message",
    [
        (
            {"masks/a.png": gray_png(np.zeros((HEIGHT, WIDTH), np.uint8))},
            "1 of 2 images have no mask, the first 'b.png': each image needs "
            "masks/<image stem>.png.",
        ),
        (
            {"masks/a.png": png(), "masks/b.png": png()},
            "masks/a.png is a RGB image; a mask holds one class id per pixel: save it "
            "single-channel",
        ),
        (
            {"masks/a.png": gray_png(np.zeros((60, 100), np.uint8)), "masks/b.png": b""},
            "masks/a.png is 100x60 pixels but 'a.png' is 200x120; a mask has its image's size.",
        ),
    ],
)
def test_it_explains_what_is_wrong_with_masks(tmp_path, masks, message):
    files = {"a.png": png(), "b.png": png(), **masks}
    assert message in refusal(tmp_path, zip_of(files), task="semantic_segmentation")


@pytest.mark.parametrize(
    "files, message",
    [
        (
            {"labels.txt": "a.png Straße\n"},
            "labels.txt line 1: a line is the image's file name, "
            "a tab, then its text; this one has no tab.",
        ),
        ({"labels.txt": "a.png\t\n"}, "labels.txt line 1: 'a.png' has no text."),
        ({"labels.txt": "z.png\tx\n"}, "labels.txt line 1 names 'z.png', which is not an image"),
        ({"labels.csv": "filename,word\na.png,x\n"}, "needs strings: labels.txt"),
    ],
)
def test_it_explains_what_is_wrong_with_strings(tmp_path, files, message):
    files = {"a.png": png(), **files}
    assert message in refusal(tmp_path, zip_of(files), task="text_recognition")


# -- .npz uploads ----------------------------------------------------------------------------

SAMPLES = np.zeros((3, 32, 32, 3), np.float32)
BOXES = {
    "label_boxes": np.array([[1, 2, 10, 12], [0, 0, 31, 31]], np.float64),
    "label_classes": np.array([0, 5]),
    "label_sample": np.array([0, 2]),
}


def test_an_npz_holds_each_tasks_arrays(tmp_path):
    keypoints = np.ones((2, 17, 3))
    facts, stored = read(
        tmp_path,
        npz_of(inputs=SAMPLES, **BOXES, label_keypoints=keypoints),
        task="keypoints",
        filename="d.npz",
    )
    assert stored["label_boxes"].dtype == np.float32 and stored["label_keypoints"].shape == (
        2,
        17,
        3,
    )
    assert facts["label_summary"] == "2 boxes in 2 of 3 images, 2 classes, 17 keypoints each"

    masks = np.array([np.full((32, 32), c, np.uint8) for c in (0, 1, 255)])
    facts, stored = read(
        tmp_path,
        npz_of(inputs=SAMPLES, label_masks=masks),
        task="semantic_segmentation",
        filename="d.npz",
    )
    np.testing.assert_array_equal(stored["label_masks"], masks)
    assert facts["classes"] == 2

    texts = np.array(["a", "bc", "déf"])
    facts, stored = read(
        tmp_path,
        npz_of(inputs=SAMPLES, label_texts=texts),
        task="text_recognition",
        filename="d.npz",
    )
    assert stored["label_texts"].tolist() == ["a", "bc", "déf"]
    assert facts["task"] == "text_recognition"


@pytest.mark.parametrize(
    "labels, message",
    [
        (
            {k: v for k, v in BOXES.items() if k != "label_sample"},
            "label_boxes, label_classes and label_sample go together (one row per box); the .npz "
            "has no label_sample.",
        ),
        (
            {**BOXES, "label_boxes": np.zeros((2, 5))},
            "label_boxes must be a float array of shape "
            "[boxes, 4] (x1, y1, x2, y2 in model-input pixels); it is float64 with shape (2, 5).",
        ),
        (
            {**BOXES, "label_boxes": np.array([[1, 2, 10, 12], [9, 0, 3, 31]])},
            "label_boxes row 1 is [9, 0, 3, 31]: boxes are x1, y1, x2, y2 with x2 >= x1 and "
            "y2 >= y1.",
        ),
        (
            {**BOXES, "label_boxes": np.array([[1, 2, 10, np.nan], [0, 0, 1, 1]])},
            "label_boxes contain NaN or infinite values.",
        ),
        (
            {**BOXES, "label_sample": np.array([0, 3])},
            "label_sample holds the index of each box's sample, 0 to 2; 3 is not one.",
        ),
        (
            {**BOXES, "label_classes": np.array([0.0, 1.0])},
            "label_classes must be a 1-D integer array with one value per box (2)",
        ),
        ({**BOXES, "label_classes": np.array([0, -1])}, "some are negative"),
        (
            {**BOXES, "label_keypoints": np.ones((1, 17, 3))},
            "label_keypoints must be a float array of shape [boxes (2), keypoints, 3]",
        ),
    ],
)
def test_it_checks_npz_boxes(tmp_path, labels, message):
    data = npz_of(inputs=SAMPLES, **labels)
    assert message in refusal(tmp_path, data, task="detection", filename="d.npz")


@pytest.mark.parametrize(
    "task, labels, message",
    [
        (
            "semantic_segmentation",
            {"label_masks": np.zeros((2, 32, 32), np.uint8)},
            "There are 2 masks for 3 samples; one per sample.",
        ),
        (
            "semantic_segmentation",
            {"label_masks": np.zeros((3, 32, 32))},
            "label_masks must be an integer array of shape [samples, height, width]",
        ),
        (
            "text_recognition",
            {"label_texts": np.array([b"a", b"b", b"c"])},
            "label_texts must be a 1-D array of strings (np.array(['cat', ...]), dtype <U...), one "
            "per sample; it is |S1 with shape (3,).",
        ),
        (
            "text_recognition",
            {"label_texts": np.array(["a", "b"])},
            "There are 2 strings for 3 samples; one per sample.",
        ),
        (
            "classification",
            {"label_texts": np.array(["a", "b", "c"])},
            "The dataset holds strings (label_texts), which are not labels for this version's task",
        ),
        ("text_recognition", {"labels": np.arange(3)}, "The dataset holds class labels (labels)"),
    ],
)
def test_it_checks_npz_masks_and_strings(tmp_path, task, labels, message):
    data = npz_of(inputs=SAMPLES, **labels)
    assert message in refusal(tmp_path, data, task=task, filename="d.npz")


def test_a_classifiers_npz_keeps_its_old_message(tmp_path):
    path = tmp_path / "d.npz"
    path.write_bytes(npz_of(inputs=SAMPLES))
    with pytest.raises(DatasetError, match="needs one integer class label per sample"):
        load_npz(path, require_labels=True, cap=CAP)


# -- Through the hub -------------------------------------------------------------------------


def detector(team, user):
    model = Model.objects.create(team=team, name="boxes", created_by=user)
    upload = SimpleUploadedFile("boxes.onnx", io_model([("image", FLOAT, ["N", 32, 32, 3])]))
    version = create_version(model, upload, user, preprocessing=SPEC)
    version.task = {"task": "detection", "params": {}}
    version.save(update_fields=["task"])
    return version


def post(client, user, version, filename, data):
    return client.post(
        f"/api/v1/versions/{version.pk}/datasets",
        {"kind": "validation", "name": "val", "file": SimpleUploadedFile(filename, data)},
        **token_for(user),
    )


def stored_files(root):
    return sorted(p.name for p in root.rglob("*") if p.is_file())


def test_a_detectors_coco_validation_set_is_stored_with_its_boxes(
    client, alice, demo_team, storage_root
):
    version = detector(demo_team, alice)
    files = {"a.png": png([(60, 30, 140, 90)]), "b.png": png()}
    document = coco(["a.png", "b.png"], ONE_BOX)
    before = stored_files(storage_root)
    refused = post(
        client,
        alice,
        version,
        "val.zip",
        zip_of({**files, "labels.csv": "filename,label\na.png,1\nb.png,0\n"}),
    )
    assert (
        refused.status_code == 400
        and "not labels for this version's task" in refused.json()["error"]
    )
    assert not Dataset.objects.exists() and stored_files(storage_root) == before

    response = post(
        client, alice, version, "val.zip", zip_of({**files, "annotations.json": document})
    )

    assert response.status_code == 201, response.json()
    dataset = Dataset.objects.get()
    assert dataset.task == "detection" and dataset.has_labels and dataset.classes == 1
    assert dataset.label_summary.startswith("1 box in 1 of 2 images, 1 class; class i is")
    with np.load(dataset.file.path, allow_pickle=False) as stored:
        assert sorted(stored.files) == ["inputs", "label_boxes", "label_classes", "label_sample"]
        (x1, y1), (x2, y2) = to_input(60, 30), to_input(140, 90)
        np.testing.assert_allclose(stored["label_boxes"], [[x1, y1, x2, y2]], atol=1e-4)
    client.login(username="alice", password=PASSWORD)
    page = client.get(version.get_absolute_url()).content.decode()
    assert "detection: 1 box in 1 of 2 images, 1 class" in page
