"""ONNX files from other tools built on a real worker: an old IR, nothing to quantise."""

import json

import onnx
import pytest
from django.core.files import File
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.engines.models import Engine
from deployhub.jobs.models import Job, JobState
from deployhub.registry.models import ModelVersion
from deployhub.registry.uploads import create_dataset
from tests.api_calls import token_for
from tests.conftest import PASSWORD, wait_until
from tests.foreign_models import calibration_npz, conv_model, nothing_to_quantise_model

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def upload(client, alice, path, name):
    """Upload an ONNX file as a new model through the API; return its first version."""
    answer = client.post(
        "/api/v1/models",
        {"name": name, "file": SimpleUploadedFile(path.name, path.read_bytes())},
        **token_for(alice),
    )
    assert answer.status_code == 201, answer.json()
    return ModelVersion.objects.get(pk=answer.json()["version"]["id"])


def compile_and_wait(client, alice, version, device_class, build_config, worker):
    """Ask the API for an ONNX Runtime build; return its compile job once it ended."""
    answer = client.post(
        f"/api/v1/versions/{version.pk}/engines",
        json.dumps(
            {
                "device_class": device_class.slug,
                "backend": "onnxruntime",
                "build_config": build_config,
            }
        ),
        content_type="application/json",
        **token_for(alice),
    )
    assert answer.status_code == 202, answer.json()
    return wait_until(
        lambda: (job := Job.objects.get(pk=answer.json()["job"]["id"])).is_final and job,
        180,
        "the compile job to finish",
        on_timeout=worker.output,
    )


def test_an_ir_3_upload_builds_at_level_all_and_passes_its_first_load(
    client, alice, device_class, make_device, start_worker, tmp_path
):
    device, token = make_device()
    worker = start_worker(device, token)
    path = tmp_path / "zoo.onnx"
    onnx.save(conv_model(ir_version=3, opset=9, listed="all"), str(path))
    version = upload(client, alice, path, "zoo")
    assert [value["name"] for value in version.inputs] == ["x"]

    job = compile_and_wait(
        client, alice, version, device_class, {"optimization_level": "all"}, worker
    )

    assert job.state == JobState.SUCCEEDED, job.log + job.error
    engine = Engine.objects.get(model_version=version)
    assert "IR 3: 10 initializers listed as graph inputs were made constants" in engine.build_log


def test_an_int8_build_with_nothing_to_quantise_is_flagged_on_its_engine_page(
    client, alice, device_class, make_device, start_worker, tmp_path
):
    device, token = make_device()
    worker = start_worker(device, token)
    path = tmp_path / "abs.onnx"
    onnx.save(nothing_to_quantise_model(), str(path))
    version = upload(client, alice, path, "abs-neg")
    npz = calibration_npz(tmp_path / "calibration.npz", count=16)
    with open(npz, "rb") as handle:
        create_dataset(
            version, File(handle, name="calibration.npz"), alice, kind="calibration", name="cal"
        )

    job = compile_and_wait(client, alice, version, device_class, {"precision": "int8"}, worker)

    assert job.state == JobState.SUCCEEDED, job.log + job.error
    engine = Engine.objects.get(model_version=version)
    assert engine.graph_report["quantized_nodes"] == 0 and engine.quantised_nothing
    assert "nothing quantised: this int8 build runs in float" in engine.build_log
    client.login(username="alice", password=PASSWORD)
    page = client.get(engine.get_absolute_url()).content.decode()
    assert "this int8 build runs in float, as the fp32 build does" in page
