"""Builds are judged in their task's own terms: a detector by its detections, never by top-1.

The evaluate results are stored as a worker sends them (AccuracyRun.record); the worker's
decoders and metrics are tests/test_worker_tasks*.py, a real run is tests/test_e2e_tasks.py.
"""

import json

import pytest

from deployhub.core import accuracy
from deployhub.devices.forms import DeviceClassEditForm
from deployhub.engines import auto
from deployhub.engines.gates import accuracy_gate
from deployhub.engines.models import AutoBuild, AutoRun
from deployhub.evaluation.models import AccuracyRun
from deployhub.figures.tradeoffs import explore
from deployhub.jobs.models import JobKind
from deployhub.releases.evidence import _accuracy_delta
from tests.auto_builds import engine_of, job_of
from tests.benchmark_results import LATENCY, result
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

DETECTOR = {"task": "detection", "params": {"head": "anchors_last", "classes": 80}}


def evaluate_result(task, agreement_metric, agreement, metric=None, reference=None, engine=None):
    """An evaluate job's result as workers/checks/evaluate.py sends it for a task."""
    return {
        "samples": 8,
        "max_abs_error": 0.03,
        "mean_abs_error": 0.001,
        "max_rel_error": 0.01,
        "mean_rel_error": 0.001,
        "cosine_min": 0.999995,
        "cosine_mean": 0.999999,
        "output_max_abs_errors": [0.03],
        "top1_agreement": None,
        "task": task,
        "params": {},
        "agreement": {agreement_metric: agreement},
        "agreement_metric": agreement_metric,
        "metric": metric,
        "reference": {metric: reference} if metric else {},
        "engine": {metric: engine} if metric else {},
    }


def measured(run, name, p50, evaluation):
    """Add a measured build of the run whose evaluation is `evaluation`."""
    from deployhub.benchmarks.models import BenchmarkRun

    version, device_class = run.model_version, run.device_class
    engine = engine_of(version, device_class, name)
    body = result(latency_ms={**LATENCY, "p50": p50, "p99": p50 * 1.2, "min": p50 * 0.9})
    benchmark_job = job_of(version, device_class, JobKind.BENCHMARK, engine)
    BenchmarkRun.record(benchmark_job, body)
    evaluate_job = job_of(version, device_class, JobKind.EVALUATE, engine)
    AccuracyRun.record(evaluate_job, evaluation)
    return AutoBuild.objects.create(
        auto_run=run,
        backend="openvino",
        precision=name,
        engine=engine,
        benchmark_job=benchmark_job,
        evaluate_job=evaluate_job,
        finished=True,
    )


@pytest.fixture
def detector_run(version, device_class):
    version.task = DETECTOR
    version.save()
    device_class.frame_budget_ms = 33.3
    device_class.save()
    return AutoRun.objects.create(model_version=version, device_class=device_class)


def test_it_recommends_the_fast_detector_build_whose_detections_agree(detector_run):
    # A detector whose bf16 build matches the source at F1 1.0 (top-1 over boxes says 0.03).
    measured(detector_run, "fp32", 34.5, evaluate_result("detection", "f1", 1.0))
    measured(detector_run, "bf16", 9.0, evaluate_result("detection", "f1", 0.9995))
    measured(detector_run, "int8", 5.0, evaluate_result("detection", "f1", 0.91))

    auto.rank(detector_run)
    detector_run.refresh_from_db()
    builds = {b.precision: b for b in detector_run.builds.all()}

    assert detector_run.recommended.precision == "bf16"
    assert builds["bf16"].within_tolerance and builds["fp32"].within_tolerance
    assert builds["int8"].within_tolerance is False
    breach = builds["int8"].accuracy.tolerance_breach(detector_run.device_class)
    assert breach == "detection F1 vs FP32 is 0.91 (tolerance: at least 0.99)"


def test_it_judges_a_labelled_detector_on_its_map_drop(detector_run):
    fast = measured(
        detector_run,
        "int8",
        5.0,
        evaluate_result("detection", "f1", 0.95, "map", reference=0.412, engine=0.405),
    )
    worse = measured(
        detector_run,
        "int4",
        4.0,
        evaluate_result("detection", "f1", 0.97, "map", reference=0.412, engine=0.390),
    )

    auto.rank(detector_run)
    detector_run.refresh_from_db()

    # 0.7 points of mAP lost is within the default 1 point, whatever F1 says; 2.2 is not.
    assert detector_run.recommended == fast
    assert worse.accuracy.metric_drop_points == pytest.approx(2.2)
    assert worse.accuracy.tolerance_breach(detector_run.device_class) == (
        "mAP@0.5:0.95 2.20 points below the FP32 reference (tolerance 1)"
    )
    assert fast.accuracy.headline == "mAP@0.5:0.95"


def test_a_text_recogniser_loses_points_when_its_cer_rises(version, device_class):
    run = AutoRun.objects.create(model_version=version, device_class=device_class)
    build = measured(
        run,
        "int8",
        5.0,
        evaluate_result("text_recognition", "exact_agreement", 0.99, "cer", 0.020, 0.031),
    )
    assert build.accuracy.metric_drop_points == pytest.approx(1.1)
    assert build.accuracy.tolerance_breach(device_class) == (
        "character error rate 1.10 points above the FP32 reference (tolerance 0.5)"
    )
    # A lower CER scores higher when builds are ranked.
    assert build.accuracy.score == pytest.approx(-0.031)


def test_a_class_may_override_a_task_tolerance(detector_run):
    device_class = detector_run.device_class
    build = measured(detector_run, "int8", 5.0, evaluate_result("detection", "f1", 0.97))
    assert not build.accuracy.within_tolerance
    device_class.task_tolerances = {"detection": {"agreement": 0.95}}
    device_class.save()
    build.accuracy.engine.device_class.refresh_from_db()
    assert build.accuracy.within_tolerance
    assert device_class.tolerance_for("detection") == accuracy.Tolerance(1.0, 0.95)


def test_a_classifier_keeps_its_top1_tolerance(device_class):
    device_class.accuracy_tolerance = 2.0
    assert device_class.tolerance_for("classification") == accuracy.Tolerance(2.0, 0.98)


@pytest.mark.parametrize(
    "overrides, error",
    [
        ({"detektion": {"drop": 1}}, "'detektion' is not a task"),
        ({"detection": {"drop": -1}}, "detection.drop must be a finite number of 0 or more"),
        ({"detection": {"drop": None}}, "detection.drop must be a finite number of 0 or more"),
        ({"detection": {"agreement": 1.5}}, "detection.agreement is a share from 0 to 1"),
        ({"detection": {"floor": 1}}, 'detection: give {"drop": points, "agreement": bound}'),
        ([1, 2], "Tolerances per task are a JSON object"),
        ('{"detection": {"drop": NaN}}', "NaN"),
    ],
)
def test_it_refuses_bad_tolerances_per_task(device_class, overrides, error):
    data = {
        "name": device_class.name,
        "serving_pattern": device_class.serving_pattern,
        "frame_budget_ms": 33.3,
        "accuracy_tolerance": 1.0,
        "task_tolerances": overrides if isinstance(overrides, str) else json.dumps(overrides),
    }
    form = DeviceClassEditForm(data, instance=device_class)
    assert not form.is_valid()
    assert error in " ".join(form.errors["task_tolerances"])


def test_the_gate_and_the_evidence_name_the_tasks_headline(detector_run):
    build = measured(
        detector_run,
        "bf16",
        9.0,
        evaluate_result("detection", "f1", 0.999, "map", reference=0.412, engine=0.409),
    )
    gate = accuracy_gate(build.engine)
    assert gate.status == "passed"
    assert "mAP@0.5:0.95 0.409" in gate.reason
    other = measured(
        detector_run,
        "fp32",
        30.0,
        evaluate_result("detection", "f1", 1.0, "map", reference=0.412, engine=0.412),
    )
    delta = _accuracy_delta(build.accuracy, other.accuracy)
    assert delta["name"] == "mAP@0.5:0.95" and delta["delta"] == pytest.approx(-0.3)


def test_the_explorer_plots_map_against_latency(client, alice, detector_run):
    measured(
        detector_run,
        "bf16",
        9.0,
        evaluate_result("detection", "f1", 0.999, "map", reference=0.412, engine=0.409),
    )
    measured(
        detector_run,
        "fp32",
        30.0,
        evaluate_result("detection", "f1", 1.0, "map", reference=0.412, engine=0.412),
    )
    explorer = explore(detector_run.model_version.model)
    [facet] = explorer.facets
    assert facet.title == "mAP@0.5:0.95"
    assert sorted(facet.accuracy(p) for p in facet.points) == [0.409, 0.412]
    assert facet.band == pytest.approx((0.402, 0.412))
    client.login(username="alice", password=PASSWORD)
    model = detector_run.model_version.model
    figure = client.get(f"/models/{model.pk}/tradeoffs.json").json()["figure"]
    assert figure["layout"]["yaxis"]["title"]["text"] == "mAP@0.5:0.95"
    assert {0.409, 0.412} <= {y for trace in figure["data"] for y in trace.get("y") or []}


def test_an_older_classifier_run_still_reads_its_top1_agreement(version, device_class):
    engine = engine_of(version, device_class, "old")
    job = job_of(version, device_class, JobKind.EVALUATE, engine)
    old = {
        "samples": 10,
        "top1_agreement": 0.95,
        "max_abs_error": 0.1,
        "mean_abs_error": 0.01,
        "cosine_min": 0.99,
        "cosine_mean": 0.995,
    }
    run = AccuracyRun.record(job, old)
    assert (run.task, run.agreement_metric, run.agreement) == (
        "classification",
        "top1_agreement",
        0.95,
    )
    assert run.tolerance_breach(device_class) == (
        "top-1 agrees with the FP32 reference on 95.0% of samples (tolerance: at least 99.0%)"
    )


def test_keypoints_are_judged_on_their_detections_too(version, device_class):
    # Exact keypoints on a quarter of the source's people: the pixel error alone would pass.
    version.task = {"task": "keypoints", "params": {}}
    version.save()
    run = AutoRun.objects.create(model_version=version, device_class=device_class)
    result = evaluate_result("keypoints", "keypoint_error_px", 0.0)
    result["agreement"]["f1"] = 0.4
    build = measured(run, "int8", 5.0, result)

    assert build.accuracy.tolerance_breach(device_class) == (
        "detection F1 vs FP32 is 0.4 (tolerance: at least 0.99)"
    )
    result["agreement"]["f1"] = 1.0
    assert not measured(run, "fp16", 6.0, result).accuracy.tolerance_breach(device_class)


def test_an_instance_segmenter_is_judged_on_its_masks_too(version, device_class):
    version.task = {"task": "instance_segmentation", "params": {}}
    version.save()
    run = AutoRun.objects.create(model_version=version, device_class=device_class)
    result = evaluate_result("instance_segmentation", "f1", 1.0, "map", 0.5, 0.499)
    result["agreement"]["mask_iou"] = 0.6  # boxes right, masks broken: labels judge boxes only

    build = measured(run, "int8", 5.0, result)

    assert build.accuracy.tolerance_breach(device_class) == (
        "mask IoU of matched instances vs FP32 is 0.6 (tolerance: at least 0.9)"
    )
    device_class.task_tolerances = {"instance_segmentation": {"mask_iou": 0.5}}
    assert not build.accuracy.tolerance_breach(device_class)
