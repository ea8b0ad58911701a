"""The conformance corpus's models of other tasks: their task, their metric, and the gate.

For each detector, the segmenter, the recogniser, the embedder and the new classifiers
(-1 dims, already in QDQ form, opset 6): the hub proposes the task the corpus names;
the evaluate job's headline matches a computation made here on its own (mAP by
pycocotools' COCOeval built in this file, mIoU, CER and cosine by hand); and a
candidate that changes the task's answer (boxes shifted by 10 px, a class swapped, two
characters swapped, a rotated vector) falls outside the class's tolerance once its
result is recorded, while the unchanged source and one with noise far below the
answer's margins stay within. The candidate is the source's own ONNX Runtime session,
its outputs changed after each run. The models go through auto mode in
tests/test_conformance.py.
"""

import contextlib
import io

import numpy as np
import onnx
import pytest

from deployhub.evaluation.models import AccuracyRun
from deployhub.jobs.models import JobKind
from deployhub.registry.inspect import inspect_onnx
from deployhub.registry.tasks import proposed_task
from tests.auto_builds import engine_of, job_of
from tests.conformance_models import (
    BY_NAME,
    CHARSET,
    datasets,
    declaration_of,
    modernised_opset6,
    onnx_file,
    source_objects,
    source_session,
    torch_missing,
)
from workers.checks.evaluate import evaluate
from workers.tasks import TASKS
from workers.tasks.detection import counted

SHIFT_PX = 10
ROTATION_DEGREES = 5  # cosine 0.9962, below the embedding floor of 0.999
NOISE = 1e-6  # relative: far below any answer's margin


# What changes each model's answer, on its outputs in model order -----------------------------


def _swap(array, axis, first, second):
    array = np.array(array)
    index = [slice(None)] * array.ndim
    index[axis] = [first, second]
    picked = array[tuple(index)]
    index[axis] = [second, first]
    array[tuple(index)] = picked
    return array


def shift_anchors_last(outputs):
    """Move every box SHIFT_PX to the right: cx is channel 0 of [N, 4 + C, A]."""
    [output] = outputs
    output = np.array(output)
    output[:, 0, :] += SHIFT_PX
    return [output]


def swap_anchors_last(outputs):
    """Swap the scores of classes 0 and 1 (channels 4 and 5 of [N, 4 + C, A])."""
    return [_swap(outputs[0], 1, 4, 5)]


def shift_anchors_first(outputs):
    """Move every box SHIFT_PX to the right: cx is column 0 of [N, A, 5 + C]."""
    [output] = outputs
    output = np.array(output)
    output[..., 0] += SHIFT_PX
    return [output]


def swap_anchors_first(outputs):
    """Swap the scores of classes 0 and 1 (columns 5 and 6 of [N, A, 5 + C])."""
    return [_swap(outputs[0], 2, 5, 6)]


def shift_nms(outputs):
    """Move every box of det_boxes [1, K, 4] (x1, y1, x2, y2) SHIFT_PX to the right."""
    count, boxes, scores, classes = outputs
    boxes = np.array(boxes)
    boxes[..., [0, 2]] += SHIFT_PX
    return [count, boxes, scores, classes]


def swap_nms(outputs):
    """Call class 0 class 1 and class 1 class 0 in det_classes."""
    count, boxes, scores, classes = outputs
    swapped = np.where(classes == 0, 1, np.where(classes == 1, 0, classes))
    return [count, boxes, scores, swapped.astype(classes.dtype)]


def swap_segments(outputs):
    """Swap the logits of classes 1 and 2 (the commonest) in out [N, C, H, W]."""
    return [_swap(outputs[0], 1, 1, 2)]


def swap_characters(outputs):
    """Swap the tokens of '0' and '1' (1 and 2) in the step scores [N, T, V]."""
    return [_swap(outputs[0], 2, CHARSET.index("0"), CHARSET.index("1"))]


def rotate_vectors(outputs):
    """Turn each embedding by ROTATION_DEGREES towards a fixed direction orthogonal to it."""
    [vectors] = outputs
    vectors = np.asarray(vectors, dtype=np.float64)
    direction = np.random.default_rng(0).normal(size=vectors.shape[1])
    away = direction - (vectors @ direction)[:, None] * vectors  # unit vectors in: orthogonal
    away /= np.linalg.norm(away, axis=1, keepdims=True)
    angle = np.radians(ROTATION_DEGREES)
    return [(np.cos(angle) * vectors + np.sin(angle) * away).astype(np.float32)]


def swap_classes(outputs):
    """Swap each sample's two best scores of a classifier's [N, C] output: a new top-1."""
    scores = np.array(outputs[0])
    rows = np.arange(len(scores))
    best, second = np.argsort(-scores, axis=1)[:, :2].T
    scores[rows, best], scores[rows, second] = scores[rows, second], scores[rows, best]
    return [scores]


def noise(outputs):
    """Add relative noise far below the answer's margins: the answer does not change."""
    rng = np.random.default_rng(1)
    return [
        output * (1 + NOISE * rng.standard_normal(output.shape)).astype(output.dtype)
        if output.dtype.kind == "f"
        else output
        for output in outputs
    ]


CHANGES = {
    "yolov8_anchors_last": {
        "boxes shifted": shift_anchors_last,
        "class swapped": swap_anchors_last,
    },
    "torch_yolov8_opset17": {
        "boxes shifted": shift_anchors_last,
        "class swapped": swap_anchors_last,
    },
    "yolov5_anchors_first": {
        "boxes shifted": shift_anchors_first,
        "class swapped": swap_anchors_first,
    },
    "nms_in_graph": {"boxes shifted": shift_nms, "class swapped": swap_nms},
    "semantic_segmenter": {"class swapped": swap_segments},
    "ctc_recogniser": {"characters swapped": swap_characters},
    "embedder": {"vector rotated": rotate_vectors},
    "minus_one_dims": {"top two swapped": swap_classes},
    "qdq_source": {"top two swapped": swap_classes},
    "old_opset6_batchnorm_add": {"top two swapped": swap_classes},
}
DETECTORS = ("yolov8_anchors_last", "torch_yolov8_opset17", "yolov5_anchors_first", "nms_in_graph")
CLASSIFIERS = ("minus_one_dims", "qdq_source", "old_opset6_batchnorm_add")
CANDIDATES = [
    pytest.param(name, change, id=f"{name}-{change}")
    for name, changes in CHANGES.items()
    for change in ("unchanged", "noise", *changes)
]


# The models written once, evaluated once per candidate ----------------------------------------


class Written:
    """One corpus model written to disk, its task as the hub proposes it, its datasets."""

    def __init__(self, model, folder):
        self.model = model
        self.path = onnx_file(model.write(folder))
        self.proposal = proposed_task(inspect_onnx(self.path))
        self.declaration = declaration_of(model, self.path, self.proposal)
        _, validation = datasets(model, self.path, self.declaration)
        self.dataset = folder / f"{model.name}-validation.npz"
        self.dataset.write_bytes(validation)
        self.reference = self.path
        if model.opset < 7:  # ONNX Runtime runs opset 6 only as its opset-13 twin
            self.reference = folder / f"{model.name}-twin.onnx"
            self.reference.write_bytes(modernised_opset6(onnx.load(str(self.path))))
        self.session = source_session(self.path, self.model)
        self.results = {}

    def labels(self):
        with np.load(self.dataset) as data:
            return {name: data[name] for name in data.files if name != "inputs"}

    def inputs(self):
        with np.load(self.dataset) as data:
            return data["inputs"]

    def change(self, name):
        return {"unchanged": lambda outputs: outputs, "noise": noise, **CHANGES[self.model.name]}[
            name
        ]

    def candidate_outputs(self, change):
        """Return each sample's outputs of the candidate, run one sample at a time."""
        name = self.session.get_inputs()[0].name
        return [
            self.change(change)(self.session.run(None, {name: sample[None]}))
            for sample in self.inputs()
        ]

    def evaluated(self, change):
        """Return the evaluate job's result for the candidate (computed once)."""
        if change not in self.results:
            alter = self.change(change)
            self.results[change] = evaluate(
                lambda feeds: alter(self.session.run(None, feeds)),
                self.reference,
                self.dataset,
                {"task": self.declaration},
            )
        return self.results[change]

    def decoded(self, change, **overrides):
        """Return the candidate's objects, decoded here as the evaluate job decodes them
        (with params overridden)."""
        task = TASKS[self.declaration["task"]]
        params = {**self.declaration["params"], **overrides}
        names = [output.name for output in self.session.get_outputs()]
        return [
            found
            for outputs in self.candidate_outputs(change)
            for found in task.decode(outputs, names, params, 1, 1)
        ]


class WrittenModels(dict):
    """The models written so far: each is written when first asked for (skipped without
    torch where it is a torch export)."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def __missing__(self, name):
        model = BY_NAME[name]
        if model.needs_torch and (why := torch_missing()):
            pytest.skip(why)
        self[name] = Written(model, self.folder)
        return self[name]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return WrittenModels(tmp_path_factory.mktemp("conformance-tasks"))


# The task ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CHANGES))
def test_it_proposes_the_task_the_corpus_names(written, name):
    model = written[name]

    assert model.proposal["task"] == model.model.task, model.proposal["why"]
    assert model.declaration["task"] == model.model.task


@pytest.mark.parametrize(
    ("name", "head"),
    [
        ("yolov8_anchors_last", "anchors_last"),
        ("torch_yolov8_opset17", "anchors_last"),
        ("yolov5_anchors_first", "anchors_first"),
        ("nms_in_graph", "nms_outputs"),
    ],
)
def test_it_proposes_each_detector_by_its_head(written, name, head):
    params = written[name].proposal["params"]

    assert params["head"] == head
    if head != "nms_outputs":
        assert params["classes"] == 4 and params["box_format"] == "cxcywh"


@pytest.mark.parametrize("name", DETECTORS)
def test_its_detectors_find_a_few_boxes_an_image_in_pixels(written, name):
    labels = written[name].labels()

    per_image = np.bincount(labels["label_sample"], minlength=32)
    assert 2 <= per_image.mean() <= 8 and per_image.max() <= 20, per_image
    sizes = labels["label_boxes"][:, 2:] - labels["label_boxes"][:, :2]
    assert np.median(sizes) > 4 and np.all(sizes > 0)  # pixels of a 32 x 32 input
    assert len(np.unique(labels["label_classes"])) == 4


# The metric against a computation of its own ---------------------------------------------------


def coco_map(objects, labels):
    """Return mAP@0.5:0.95 by pycocotools' COCOeval, ground truth and results built here."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    def xywh(box):
        return [float(box[0]), float(box[1]), float(box[2] - box[0]), float(box[3] - box[1])]

    truth = COCO()
    truth.dataset = {
        "images": [{"id": index} for index in range(len(objects))],
        "categories": [{"id": int(c)} for c in np.unique(labels["label_classes"])],
        "annotations": [
            {
                "id": number + 1,
                "image_id": int(sample),
                "category_id": int(label),
                "bbox": xywh(box),
                "area": xywh(box)[2] * xywh(box)[3],
                "iscrowd": 0,
            }
            for number, (box, label, sample) in enumerate(
                zip(
                    labels["label_boxes"],
                    labels["label_classes"],
                    labels["label_sample"],
                    strict=True,
                )
            )
        ],
    }
    found = [
        {"image_id": index, "category_id": int(label), "bbox": xywh(box), "score": float(score)}
        for index, objects_ in enumerate(objects)
        for box, score, label in zip(
            objects_["boxes"], objects_["scores"], objects_["classes"], strict=True
        )
    ]
    with contextlib.redirect_stdout(io.StringIO()):
        truth.createIndex()
        evaluation = COCOeval(truth, truth.loadRes(found), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return evaluation.stats[0]


@pytest.mark.parametrize("name", DETECTORS)
@pytest.mark.parametrize("change", ["unchanged", "boxes shifted", "class swapped"])
def test_its_detectors_map_is_cocoevals(written, name, change):
    model = written[name]
    labels = model.labels()

    result = model.evaluated(change)

    objects = counted(model.decoded(change), model.declaration["params"])  # as it reports them
    assert result["engine"]["map"] == pytest.approx(coco_map(objects, labels), abs=1e-9)
    assert result["reference"]["map"] == pytest.approx(1.0)  # the labels are its detections


@pytest.mark.parametrize("name", DETECTORS)
def test_its_changed_detections_are_the_sources_shifted_or_swapped(written, name):
    model = written[name]
    unclipped = {"image_size": None}  # a box moved past the border stays whole
    params = {**model.declaration["params"], **unclipped}
    truth = _rows(counted(model.decoded("unchanged", **unclipped), params))

    shifted = _rows(counted(model.decoded("boxes shifted", **unclipped), params))
    swapped = _rows(counted(model.decoded("class swapped", **unclipped), params))

    assert shifted == pytest.approx(_sorted(truth + [SHIFT_PX, 0, SHIFT_PX, 0, 0]), abs=1e-3)
    renamed = truth.copy()
    renamed[:, 4] = np.choose(np.minimum(truth[:, 4], 2).astype(int), [1, 0, truth[:, 4]])
    assert swapped == pytest.approx(_sorted(renamed), abs=1e-3)
    assert len(truth) == len(model.labels()["label_classes"])


def _rows(objects):
    rows = [np.column_stack([found["boxes"], found["classes"]]) for found in objects]
    return _sorted(np.concatenate(rows))


def _sorted(rows):
    return rows[np.lexsort(rows.T[::-1])]


def test_its_segmenters_miou_is_the_confusion_matrixs(written):
    model = written["semantic_segmenter"]
    truth = model.labels()["label_masks"]

    result = model.evaluated("class swapped")

    found = np.stack(
        [outputs[0][0].argmax(axis=0) for outputs in model.candidate_outputs("class swapped")]
    )
    classes = int(max(truth.max(), found.max())) + 1
    confusion = np.bincount(truth.ravel() * classes + found.ravel(), minlength=classes**2)
    confusion = confusion.reshape(classes, classes)
    union = confusion.sum(axis=0) + confusion.sum(axis=1) - np.diag(confusion)
    present = union > 0
    miou = np.mean(np.diag(confusion)[present] / union[present])
    assert result["engine"]["miou"] == pytest.approx(miou)
    assert result["engine"]["miou"] < 0.9
    assert result["reference"]["miou"] == pytest.approx(1.0)


def edit_distance(first, second):
    """Return the Levenshtein distance of two strings (dynamic programming, row by row)."""
    row = list(range(len(second) + 1))
    for i, a in enumerate(first, 1):
        previous, row[0] = row[0], i
        for j, b in enumerate(second, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (a != b))
    return row[-1]


def greedy_text(steps):
    """Return greedy CTC's string of [T, V] step scores: argmax, repeats collapsed, no blank."""
    best = steps.argmax(axis=1)
    kept = [t for index, t in enumerate(best) if t != 0 and (index == 0 or t != best[index - 1])]
    return "".join(CHARSET[t] for t in kept)


def test_its_recognisers_cer_is_the_edit_distance(written):
    model = written["ctc_recogniser"]
    truth = [str(text) for text in model.labels()["label_texts"]]

    result = model.evaluated("characters swapped")

    found = [
        greedy_text(outputs[0][0]) for outputs in model.candidate_outputs("characters swapped")
    ]
    cer = sum(map(edit_distance, truth, found)) / sum(map(len, truth))
    assert result["engine"]["cer"] == pytest.approx(cer)
    assert result["engine"]["cer"] > 0.05
    assert result["reference"]["cer"] == 0.0
    assert all(len(text) >= 3 for text in truth)


def test_its_embedders_cosine_is_numpys(written):
    model = written["embedder"]
    reference = [
        model.session.run(None, {"image": sample[None]})[0][0] for sample in model.inputs()
    ]

    result = model.evaluated("vector rotated")

    found = [outputs[0][0] for outputs in model.candidate_outputs("vector rotated")]
    cosines = [
        a @ b / np.linalg.norm(a) / np.linalg.norm(b) for a, b in zip(reference, found, strict=True)
    ]
    assert result["agreement"]["cosine_min"] == pytest.approx(min(cosines), abs=1e-6)
    assert min(cosines) == pytest.approx(np.cos(np.radians(ROTATION_DEGREES)), abs=1e-5)
    assert result["reference"] == {} and result["metric"] is None  # no labelled metric


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_its_classifiers_top1_is_numpys(written, name):
    model = written[name]
    labels = model.labels()["labels"]

    result = model.evaluated("top two swapped")

    found = np.array(
        [outputs[0][0].argmax() for outputs in model.candidate_outputs("top two swapped")]
    )
    assert result["engine"]["top1"] == pytest.approx(np.mean(found == labels))
    assert result["reference"]["top1"] == 1.0


def test_its_labels_are_the_sources_own_answers(written):
    model = written["ctc_recogniser"]
    samples = {"x": model.inputs()}

    objects = source_objects(model.path, model.model, samples, model.declaration)

    assert [found["text"] for found in objects] == list(model.labels()["label_texts"])


# The gate: recorded, judged against the class's tolerance --------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "change"), CANDIDATES)
def test_the_gate_rejects_a_build_that_changes_the_answer_and_accepts_one_that_does_not(
    written, version, device_class, name, change
):
    result = written[name].evaluated(change)
    engine = engine_of(version, device_class, f"{name}-{change}")
    job = job_of(version, device_class, JobKind.EVALUATE, engine)

    run = AccuracyRun.record(job, result)

    breach = run.tolerance_breach(device_class)
    assert run.task == written[name].model.task
    if change in ("unchanged", "noise"):
        assert breach == "", (name, change, result["agreement"], result["engine"])
    else:
        assert breach, (name, change, result["agreement"], result["engine"])
        assert breach.startswith(run.headline), breach  # "mAP@0.5:0.95 41.20 points below"
