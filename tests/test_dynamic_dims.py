"""Dynamic axes written as -1 (paddle2onnx and other exporters): read as dynamic everywhere.

The hub names such an axis dim_<index>; workers reading the ONNX file itself
take it as an unnamed dynamic axis, as ONNX Runtime reports it. A model whose
input is [-1, 3, -1, -1] goes through upload, the contract, preflight, and a
real build and benchmark on ONNX Runtime.
"""

import onnx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.engines.actions import request_compile
from deployhub.engines.preflight import preflight
from deployhub.jobs.actions import submit_job
from deployhub.jobs.models import JobKind
from deployhub.registry.models import Model
from deployhub.registry.uploads import ContractRefused, create_version
from tests.conftest import job_finished
from tests.foreign_models import negative_dims_model
from workers.measure import feeds

CONTRACT = {
    "inputs": {
        "x": {
            "shape": ["batch", 3, "dim_2", "dim_3"],
            "batch": {"sizes": [1, 2]},
            "dynamic": {
                "2": {"min": 8, "opt": 16, "max": 32},
                "3": {"min": 8, "opt": 24, "max": 32},
            },
        }
    }
}


def upload(team, user, contract=None):
    model = Model.objects.create(team=team, name="paddle-model", created_by=user)
    data = negative_dims_model().SerializeToString()
    return create_version(model, SimpleUploadedFile("paddle.onnx", data), user, contract=contract)


def test_workers_read_negative_dims_in_the_file_as_dynamic(tmp_path):
    path = tmp_path / "paddle.onnx"
    onnx.save(negative_dims_model(), str(path))

    model_io = feeds.model_io_from_onnx(path)

    assert model_io["inputs"][0]["shape"] == [None, 3, None, None]
    assert model_io["outputs"][0]["shape"] == [None, 4]
    [spec] = feeds.input_specs(model_io)
    assert spec.batched and spec.shape == (3, None, None)
    with pytest.raises(feeds.JobError, match="'x' has a dynamic dimension at position 2"):
        feeds.synthetic_feeds(model_io)
    assert feeds.synthetic_feeds(model_io, batch=2, unsized=5)["x"].shape == (2, 3, 5, 5)


@pytest.mark.django_db
def test_an_upload_without_a_contract_is_told_the_contract_to_fill_in(demo_team, alice):
    with pytest.raises(ContractRefused) as refused:
        upload(demo_team, alice)

    message = str(refused.value)
    assert "declares a negative dimension" not in message
    assert '"shape": ["batch", 3, "dim_2", "dim_3"]' in message
    assert '"dynamic": {"2": {"min": null' in message


@pytest.mark.django_db
def test_its_version_keeps_the_named_axes_and_the_contract(demo_team, alice):
    version = upload(demo_team, alice, CONTRACT)

    assert version.inputs[0]["shape"] == ["dim_0", 3, "dim_2", "dim_3"]
    assert version.outputs[0]["shape"] == ["dim_0", 4]
    assert version.contract["inputs"]["x"]["dynamic"]["3"]["opt"] == 24


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_builds_and_benchmarks_it_on_onnx_runtime(
    demo_team, alice, device_class, make_device, start_worker
):
    device, token = make_device()
    worker = start_worker(device, token)
    version = upload(demo_team, alice, CONTRACT)
    device.refresh_from_db()

    [verdict] = preflight(version, device_class, ["onnxruntime"])
    assert verdict.fails == [], verdict.fails
    _, job = request_compile(version, device_class, "onnxruntime", {}, alice)
    built = job_finished(job, worker)
    assert built.state == "succeeded", built.log + built.error
    benchmark = submit_job(
        team=demo_team,
        kind=JobKind.BENCHMARK,
        device_class=device_class,
        user=alice,
        model_version=version,
        engine=built.engine,
        params={"batch_size": 2, "warmup_iterations": 2, "iterations": 20},
    )

    measured = job_finished(benchmark, worker)

    assert measured.state == "succeeded", measured.log + measured.error
    run = BenchmarkRun.objects.get(job=measured)
    assert run.batch_size == 2 and run.latency_p50_ms > 0
