"""A torch.export program uploaded through the API becomes an ONNX child on a real worker."""

import pytest
import torch
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.jobs.models import Job, JobKind, JobState
from deployhub.registry.models import ModelVersion
from tests.api_calls import token_for
from tests.conftest import PASSWORD, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(8, 10),
        )

    def forward(self, image):
        return self.features(image)


def write_pt2(path):
    torch.manual_seed(0)
    net = TinyNet().eval()
    program = torch.export.export(net, (torch.randn(1, 3, 32, 32),))
    torch.export.save(program, str(path))
    return path


def test_a_pt2_upload_is_exported_to_onnx_by_a_worker(
    client, alice, demo_team, device_class, make_device, start_worker, tmp_path
):
    device, token = make_device()
    worker = start_worker(device, token)
    pt2 = write_pt2(tmp_path / "tiny.pt2")
    response = client.post(
        "/api/v1/models",
        {
            "name": "tiny",
            "export_on": device_class.slug,
            "file": SimpleUploadedFile("tiny.pt2", pt2.read_bytes()),
        },
        **token_for(alice),
    )
    assert response.status_code == 201, response.json()
    source = ModelVersion.objects.get(pk=response.json()["version"]["id"])
    assert source.format == "pt2" and source.inputs[0]["shape"] == [1, 3, 32, 32]
    export = Job.objects.get(model_version=source, kind=JobKind.EXPORT)
    export = wait_until(
        lambda: (j := Job.objects.get(pk=export.pk)).is_final and j,
        120,
        "the export job to finish",
        on_timeout=worker.output,
    )
    assert export.state == JobState.SUCCEEDED, export.log + export.error
    child = ModelVersion.objects.get(parent=source)
    assert child.format == "onnx" and child.number == 2
    assert child.inputs[0]["shape"] == [1, 3, 32, 32]
    assert child.export_report["max_abs_diff"] < 1e-4
    assert child.graph["operators"]["Conv"] == 1
    client.login(username="alice", password=PASSWORD)
    page = client.get(source.get_absolute_url()).content.decode()
    assert f'href="{child.get_absolute_url()}"' in page and "exported to ONNX" in page
    body = client.get(f"/api/v1/versions/{child.pk}", **token_for(alice)).json()
    assert body["parent"] == source.pk and body["export_report"]["opset"] == 17
