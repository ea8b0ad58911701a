"""An old-IR ONNX file (initializers listed as graph inputs) builds and loads on a real worker."""

import json

import onnx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.engines.models import Engine
from deployhub.jobs.models import Job, JobState
from deployhub.registry.models import ModelVersion
from tests.conftest import wait_until
from tests.foreign_models import conv_model
from tests.test_registry_api import token_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_an_ir_3_upload_builds_at_level_all_and_passes_its_first_load(
    client, alice, device_class, make_device, start_worker, tmp_path
):
    device, token = make_device()
    worker = start_worker(device, token)
    path = tmp_path / "zoo.onnx"
    onnx.save(conv_model(ir_version=3, opset=9, listed="all"), str(path))
    answer = client.post(
        "/api/v1/models",
        {"name": "zoo", "file": SimpleUploadedFile("zoo.onnx", path.read_bytes())},
        **token_for(alice),
    )
    version = ModelVersion.objects.get(pk=answer.json()["version"]["id"])
    assert [value["name"] for value in version.inputs] == ["x"]

    compile_answer = client.post(
        f"/api/v1/versions/{version.pk}/engines",
        json.dumps(
            {
                "device_class": device_class.slug,
                "backend": "onnxruntime",
                "build_config": {"optimization_level": "all"},
            }
        ),
        content_type="application/json",
        **token_for(alice),
    )

    assert compile_answer.status_code == 202, compile_answer.json()
    job = wait_until(
        lambda: (j := Job.objects.get(pk=compile_answer.json()["job"]["id"])).is_final and j,
        120,
        "the compile job to finish",
        on_timeout=worker.output,
    )
    assert job.state == JobState.SUCCEEDED, job.log + job.error
    engine = Engine.objects.get(model_version=version)
    assert "IR 3: 10 initializers listed as graph inputs were made constants" in engine.build_log
