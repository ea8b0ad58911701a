"""A .pt2 uploaded on a page is queued for export on the class the form chose, and says so; a class
that is not the team's is refused, never replaced by another."""

import html

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.devices.models import DeviceClass
from deployhub.jobs.models import Job, JobKind
from deployhub.registry.models import Model
from tests.api_calls import token_for
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


def test_an_export_or_conversion_on_a_class_that_is_not_the_teams_is_refused(
    client, alice, charlie, demo_team, device_class, version, pt2
):
    theirs = DeviceClass.objects.create(team=charlie.memberships.get().team, slug="x", name="X")
    model = Model.objects.create(team=demo_team, name="tiny", created_by=alice)
    client.login(username="alice", password=PASSWORD)
    client.post(f"/models/{model.pk}/", {"notes": "", "file": pt2(), "export_on": device_class.pk})
    pt2_version, before = model.versions.get(), Job.objects.count()

    for asked in ("999", str(theirs.pk), "x", "9" * 5000):
        exported = client.post(
            f"/versions/{pt2_version.pk}/export", {"device_class": asked}, follow=True
        )
        converted = client.post(
            f"/versions/{version.pk}/convert", {"device_class": asked}, follow=True
        )
        said = f"Demo has no device class {asked[:40]!r}."
        assert f"Not exported: {said}" in html.unescape(exported.content.decode())
        assert f"Not converted: {said}" in html.unescape(converted.content.decode())

    assert Job.objects.count() == before


def test_an_upload_asking_to_export_on_an_unknown_class_is_refused_before_storing_it(
    client, alice, demo_team, device_class, pt2
):
    model = Model.objects.create(team=demo_team, name="tiny", created_by=alice)
    headers = token_for(alice)

    new_version = client.post(
        f"/api/v1/models/{model.pk}/versions", {"file": pt2(), "export_on": "nope"}, **headers
    )
    new_model = client.post(
        "/api/v1/models", {"name": "other", "file": pt2(), "export_on": "nope"}, **headers
    )

    for answer in (new_version, new_model):
        assert answer.status_code == 400
        assert answer.json()["error"] == "Demo has no device class 'nope' to export on."
    assert not model.versions.exists() and not Model.objects.filter(name="other").exists()
    assert not Job.objects.exists()
