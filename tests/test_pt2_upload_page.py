"""A .pt2 uploaded on a page is queued for export on the class the form chose, and says so."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.devices.models import DeviceClass
from deployhub.jobs.models import Job, JobKind
from deployhub.registry.models import Model
from tests.conftest import PASSWORD
from tests.registry_corpus import write_good_pt2


@pytest.fixture
def pt2(tmp_path):
    path = write_good_pt2(tmp_path)
    return lambda: SimpleUploadedFile("tiny.pt2", path.read_bytes())


def test_a_new_model_from_a_pt2_queues_its_export_on_the_chosen_class(
    client, alice, demo_team, device_class, pt2
):
    other = DeviceClass.objects.create(team=demo_team, slug="other", name="Other")
    client.login(username="alice", password=PASSWORD)

    response = client.post(
        "/models/", {"name": "tiny", "notes": "", "file": pt2(), "export_on": other.pk}, follow=True
    )

    version = Model.objects.get(name="tiny").versions.get()
    export = Job.objects.get(model_version=version, kind=JobKind.EXPORT)
    assert export.device_class == other and export.params["input_shapes"] == {
        "image": [1, 3, 16, 16]
    }
    assert f"Export to ONNX queued on {other} as job #{export.pk}." in response.content.decode()


def test_a_pt2_version_without_a_class_to_export_on_says_what_to_do(client, alice, demo_team, pt2):
    demo_team.device_classes.all().delete()
    model = Model.objects.create(team=demo_team, name="tiny", created_by=alice)
    client.login(username="alice", password=PASSWORD)

    response = client.post(f"/models/{model.pk}/", {"notes": "", "file": pt2()}, follow=True)

    assert model.versions.get().format == "pt2"
    assert not Job.objects.filter(kind=JobKind.EXPORT).exists()
    assert "No device class to export on: register one, then export." in (response.content.decode())
