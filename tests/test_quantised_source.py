"""A model its authors quantised already (Q/DQ pairs): it runs as INT8 as it is.

Preflight says so for every INT8 build that would quantise it again, auto mode
skips those builds with that reason, a hand-asked INT8 compile is refused, and
a worker asked anyway fails with the cause instead of the quantiser's KeyError.
Its FP32 builds still build and run, on a real worker.
"""

import copy

import onnx
import pytest
from django.core.files import File

from deployhub.engines import auto
from deployhub.engines.actions import BuildRefused, request_compile
from deployhub.engines.preflight import preflight
from deployhub.jobs.actions import submit_job
from deployhub.jobs.models import JobKind
from deployhub.registry.models import Model
from deployhub.registry.uploads import create_dataset, create_version
from tests.compile_jobs import FINGERPRINT
from tests.conftest import job_finished
from tests.foreign_models import calibration_npz, write_qdq_model
from workers.backends.onnxruntime import OnnxRuntimeBackend
from workers.errors import JobError

ALREADY = (
    "already quantised by its authors (14 QuantizeLinear/DequantizeLinear nodes): it runs as "
    "INT8 as it is; an INT8 build would quantise it twice"
)
WITH_OPENVINO = {**copy.deepcopy(FINGERPRINT), "openvino": {"version": "2026.4.1"}}


@pytest.fixture
def qdq_file(tmp_path):
    return write_qdq_model(tmp_path)


def upload(team, user, path):
    model = Model.objects.create(team=team, name="quantised", created_by=user)
    with open(path, "rb") as handle:
        version = create_version(model, File(handle, name="qdq.onnx"), user)
    with open(calibration_npz(path.with_name("calibration.npz")), "rb") as handle:
        create_dataset(
            version, File(handle, name="calibration.npz"), user, kind="calibration", name="cal"
        )
    return version


@pytest.fixture
def quantised(demo_team, alice, qdq_file, make_device):
    device, _ = make_device()
    device.fingerprint = WITH_OPENVINO
    device.save()
    return upload(demo_team, alice, qdq_file)


def test_the_file_is_what_its_authors_quantised(qdq_file):
    ops = [node.op_type for node in onnx.load(str(qdq_file)).graph.node]
    assert ops.count("QuantizeLinear") + ops.count("DequantizeLinear") == 14


def test_a_worker_refuses_to_quantise_it_again_and_says_why(qdq_file, tmp_path):
    calibration = calibration_npz(tmp_path / "calibration.npz")

    with pytest.raises(JobError) as refused:
        OnnxRuntimeBackend().compile(
            qdq_file, {"precision": "int8"}, tmp_path, calibration=calibration
        )

    assert str(refused.value) == (
        f"int8: the model is {ALREADY}: build it with precision fp32, which runs its "
        "quantised operators as they are"
    )


@pytest.mark.django_db
def test_preflight_says_every_int8_build_would_quantise_it_twice(quantised, device_class):
    backends = ["onnxruntime", "openvino", "tensorrt"]
    int8 = {v.backend: v for v in preflight(quantised, device_class, backends, "int8")}
    fp32 = {v.backend: v for v in preflight(quantised, device_class, backends[:2], "fp32")}

    assert int8["onnxruntime"].fails == [ALREADY]
    assert ALREADY in int8["openvino"].fails and ALREADY in int8["tensorrt"].fails
    assert fp32["onnxruntime"].fails == [] and fp32["openvino"].fails == []


@pytest.mark.django_db
def test_a_hand_asked_int8_compile_is_refused_and_fp32_is_queued(quantised, device_class, alice):
    with pytest.raises(BuildRefused) as refused:
        request_compile(quantised, device_class, "onnxruntime", {"precision": "int8"}, alice)
    _, job = request_compile(quantised, device_class, "onnxruntime", {}, alice)

    assert str(refused.value) == f"{quantised} is {ALREADY}."
    assert job.params["build_config"]["precision"] == "fp32"


@pytest.mark.django_db
def test_auto_mode_skips_its_int8_builds_with_the_reason(quantised, device_class, alice):
    run = auto.start(quantised, device_class, alice)

    builds = {(b.backend, b.precision): b for b in run.builds.all()}
    assert builds[("onnxruntime", "int8")].skipped == ALREADY
    assert builds[("openvino", "int8")].skipped == ALREADY
    assert not builds[("onnxruntime", "int8")].error
    assert builds[("onnxruntime", "fp32")].compile_job is not None
    assert builds[("openvino", "fp32")].compile_job is not None


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_builds_it_as_fp32_and_names_the_cause_of_an_int8_build(
    demo_team, alice, device_class, make_device, start_worker, qdq_file
):
    device, token = make_device()
    worker = start_worker(device, token)
    version = upload(demo_team, alice, qdq_file)
    device.refresh_from_db()
    [verdict] = preflight(version, device_class, ["onnxruntime"], "fp32")
    assert verdict.fails == []

    _, job = request_compile(version, device_class, "onnxruntime", {}, alice)
    built = job_finished(job, worker)
    asked_anyway = submit_job(  # as an older hub would have asked
        team=demo_team,
        kind=JobKind.COMPILE,
        device_class=device_class,
        user=alice,
        model_version=version,
        params={
            "backend": "onnxruntime",
            "build_config": {"precision": "int8"},
            "calibration_dataset": version.model.datasets.get().pk,
        },
    )
    refused = job_finished(asked_anyway, worker)

    assert built.state == "succeeded", built.log + built.error
    operators = built.engine.graph_report["after"]["operators"]  # it runs in INT8 as it is
    assert any(op.endswith("QLinearConv") for op in operators), operators
    assert refused.state == "failed"
    assert refused.failure_category != "internal"
    assert f"the model is {ALREADY}" in refused.error
