"""A detector taken through the product as a team would: API upload with a COCO validation set,
its task proposed, auto mode on a real worker judging builds on mAP, the explorer and the
release evidence naming mAP, and the same pages in Chromium.

The detector is the conformance corpus's YOLOv8-style head (random weights, trained-like
scores: a few confident boxes per image). The COCO labels are the FP32 source's own
detections on the images, so its mAP is about 1 and a build's mAP drop is its disagreement.
"""

import io
import json
import zipfile

import numpy as np
import onnxruntime
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from PIL import Image
from playwright.sync_api import expect

from deployhub.engines import auto
from deployhub.engines.models import AutoRun
from deployhub.registry.models import ModelVersion
from tests.api_calls import call, token_for
from tests.browser import sign_in
from tests.conformance_models import DETECTOR, write_yolov8_anchors_last
from tests.conformance_run import QUICK_BENCHMARKS
from tests.conftest import run_python, wait_until
from workers.checks.preprocessing import compile_preprocess
from workers.tasks import TASKS, normalise

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

IMAGES, WIDTH, HEIGHT = 12, 48, 40  # photos of another size than the input: labels are mapped
# Uniform noise pixels normalised to about N(0, 1), the inputs the corpus's detector expects.
SPEC = {
    "resize": {"height": DETECTOR.size, "width": DETECTOR.size, "interpolation": "nearest"},
    "scale": 1 / 255,
    "mean": [0.5] * 3,
    "std": [0.29] * 3,
}
CATEGORIES = [{"id": 10 * (index + 1), "name": f"thing-{index}"} for index in range(4)]
MAP = "mAP@0.5:0.95"


def coco_zip(model_path):
    """Return a zip of PNG photos and annotations.json: the source's detections, in the photos'
    pixels, with COCO category ids that are not the class indices (10, 20, 30, 40)."""
    session = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    outputs = [{"name": o.name, "dtype": "float", "shape": o.shape} for o in session.get_outputs()]
    declaration = normalise({"task": "detection", "params": {}}, outputs)
    preprocess, rng = compile_preprocess(SPEC), np.random.default_rng(26)
    images, annotations, buffer = [], [], io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for index in range(IMAGES):
            pixels = rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
            photo = Image.fromarray(pixels)
            png = io.BytesIO()
            photo.save(png, format="PNG")
            archive.writestr(f"images/{index}.png", png.getvalue())
            images.append(
                {"id": index, "file_name": f"images/{index}.png", "width": WIDTH, "height": HEIGHT}
            )
            tensor = preprocess(photo)[None]
            raw = session.run(None, {session.get_inputs()[0].name: tensor})
            [found] = TASKS["detection"].decode(
                raw, [o["name"] for o in outputs], declaration["params"], 1, 1
            )
            annotations += _annotations(found, index, len(annotations))
        document = {"images": images, "annotations": annotations, "categories": CATEGORIES}
        archive.writestr("annotations.json", json.dumps(document))
    assert len(annotations) >= IMAGES, "the detector should find a few boxes per photo"
    return buffer.getvalue()


def _annotations(found, image_id, first_id):
    scale = np.array([WIDTH, HEIGHT, WIDTH, HEIGHT]) / DETECTOR.size
    rows = []
    for offset, (box, cls) in enumerate(zip(found["boxes"], found["classes"], strict=True)):
        x1, y1, x2, y2 = (np.asarray(box) * scale).tolist()
        rows.append(
            {
                "id": first_id + offset + 1,
                "image_id": image_id,
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "category_id": CATEGORIES[int(cls)]["id"],
                "area": (x2 - x1) * (y2 - y1),
                "iscrowd": 0,
            }
        )
    return rows


def upload_detector(client, headers, folder):
    path = write_yolov8_anchors_last(folder)
    answer = client.post(
        "/api/v1/models",
        {
            "name": "street-detector",
            "file": SimpleUploadedFile("street-detector.onnx", path.read_bytes()),
            "preprocessing": json.dumps(SPEC),
        },
        **headers,
    )
    assert answer.status_code == 201, answer.content
    version = ModelVersion.objects.get(model__name="street-detector")
    archive = coco_zip(path)
    for kind in ("calibration", "validation"):
        answer = client.post(
            f"/api/v1/versions/{version.pk}/datasets",
            {"kind": kind, "name": kind, "file": SimpleUploadedFile("coco.zip", archive)},
            **headers,
        )
        assert answer.status_code == 201, answer.content
    return version


def test_a_detector_is_recommended_by_its_map_through_the_api_and_the_pages(
    client,
    alice,
    device_class,
    make_device,
    start_worker,
    live_server,
    browser,
    tmp_path,
    monkeypatch,
):
    for name, value in QUICK_BENCHMARKS.items():
        monkeypatch.setattr(auto, name, value)
    headers = token_for(alice)
    token = headers["HTTP_AUTHORIZATION"].removeprefix("Bearer ")
    version = upload_detector(client, headers, tmp_path)

    declared = client.get(f"/api/v1/versions/{version.pk}/task", **headers).json()
    assert declared["task"] == "detection" and declared["params"]["head"] == "anchors_last"
    assert declared["confirmed"] is False
    validation = version.model.datasets.get(name="validation")
    assert validation.task == "detection" and "boxes" in validation.label_summary

    device, device_token = make_device()
    worker = start_worker(device, device_token, python=run_python())  # make run's worker
    answer = call(client, token, f"versions/{version.pk}/auto", {"device_class": device_class.slug})
    assert answer.status_code == 202, answer.content
    run_id = answer.json()["auto_run"]["id"]
    wait_until(
        lambda: AutoRun.objects.get(pk=run_id).state == "done",
        600,
        "auto mode to finish on the detector",
        interval=1,
        on_timeout=worker.output,
    )
    body = client.get(f"/api/v1/auto-runs/{run_id}", **headers).json()

    measured = [b for b in body["builds"] if b["accuracy"]]
    assert measured, body["summary"]
    for build in measured:
        accuracy = build["accuracy"]
        assert accuracy["task"] == "detection" and accuracy["headline"] == MAP, accuracy
        assert (
            accuracy["reference_metric"] > 0.5
        )  # the labels are the source's own answers (clipped)
        drop = accuracy["drop_points"]
        assert build["within_tolerance"] == (drop <= 1.0), (build["precision"], drop)
    best = body["recommended"]
    assert best is not None, body["summary"]
    run = AutoRun.objects.get(pk=run_id)
    eligible = auto._eligible([b for b in run.builds.all() if b.accuracy and b.benchmark])
    assert run.recommended == min(eligible, key=auto._decisive_ms)

    tradeoffs = client.get(f"/api/v1/models/{version.model_id}/tradeoffs", **headers).json()
    [facet] = tradeoffs["facets"]
    assert facet["task"] == "detection" and facet["accuracy_metric"] == MAP

    release = call(client, token, f"engines/{best['engine']}/releases", {})
    assert release.status_code == 201, release.content
    release_id = release.json()["id"]
    submitted = call(client, token, f"releases/{release_id}/submit", {})
    assert submitted.status_code == 200, submitted.content
    gates = {gate["gate"]: gate for gate in submitted.json()["gates"]}
    assert MAP in gates["accuracy"]["reason"], gates["accuracy"]
    evidence = json.dumps(submitted.json().get("evidence"))
    assert MAP in evidence

    page = browser.new_page()
    page.set_default_timeout(30_000)
    sign_in(page, live_server, "alice")
    page.goto(f"{live_server.url}{version.get_absolute_url()}")
    expect(page.locator("#task-name")).to_have_text("detection")
    expect(page.locator("#task-state")).to_contain_text("proposed")
    page.goto(f"{live_server.url}{run.get_absolute_url()}")
    expect(page.locator("#auto-tolerance")).to_contain_text(MAP)
    expect(page.locator("#auto-builds")).to_contain_text(MAP)
    page.goto(f"{live_server.url}{version.model.get_absolute_url()}")
    expect(page.locator(".js-plotly-plot .ytitle").first).to_contain_text(MAP)
    page.goto(f"{live_server.url}/releases/{release_id}/")
    expect(page.locator("body")).to_contain_text(MAP)
