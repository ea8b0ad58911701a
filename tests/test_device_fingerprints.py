"""A device's fingerprint as the hub keeps it: every field it reads of the type it reads."""

import pytest

from deployhub.devices.models import Device, FingerprintChange
from tests.api_calls import call
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

GOOD = {
    "schema": 2,
    "os": {"system": "Linux", "release": "6.8", "machine": "x86_64"},
    "cpu": {"model": "Test CPU", "count": 4, "flags": ["avx2"], "isa_level": "avx2"},
    "gpus": [{"index": 0, "name": "NVIDIA L4", "compute_capability": "8.9"}],
    "nvidia_driver": "550.54.15",
    "cuda": {"driver_api": "12.4", "runtime": None},
    "onnxruntime": {"version": "1.20.0", "providers": ["CPUExecutionProvider"]},
    "capabilities": {"onnxruntime": {"int8": {"ok": True}}},
}
WRONG = ["Linux", 3, ["a"], True]


def heartbeat(client, token, fingerprint):
    return call(client, token, "device/heartbeat", {"fingerprint": fingerprint})


@pytest.mark.parametrize("field", ["os", "cpu", "cuda", "gpus", "onnxruntime", "capabilities"])
@pytest.mark.parametrize("wrong", WRONG)
def test_it_refuses_a_fingerprint_field_of_another_type_and_keeps_none_of_it(
    client, make_device, field, wrong
):
    device, token = make_device()
    assert heartbeat(client, token, GOOD).status_code == 200

    response = heartbeat(client, token, {**GOOD, field: wrong})

    assert response.status_code == 400
    assert response.json()["error"].startswith(f"fingerprint.{field}")
    device.refresh_from_db()
    assert device.fingerprint == GOOD and not device.fingerprint_changes.exists()


@pytest.mark.parametrize(
    "inside, named",
    [
        ({"cpu": {"flags": "avx2"}}, "fingerprint.cpu.flags"),
        ({"gpus": [{"compute_capability": 8.9}]}, "fingerprint.gpus[0].compute_capability"),
        ({"cuda": {"driver_api": ["12"]}}, "fingerprint.cuda.driver_api"),
        ({"onnxruntime": {"version": 1.2}}, "fingerprint.onnxruntime.version"),
        ({"tensorrt": "10.3"}, "fingerprint.tensorrt"),
        ({"capabilities": {"onnxruntime": {"int8": {"ok": "yes"}}}}, "capabilities.onnxruntime"),
    ],
)
def test_it_names_the_field_inside_the_fingerprint_it_cannot_read(
    client, make_device, inside, named
):
    device, token = make_device()

    response = heartbeat(client, token, {**GOOD, **inside})

    assert response.status_code == 400 and named in response.json()["error"]
    device.refresh_from_db()
    assert device.fingerprint == {} and not device.is_online


def test_a_first_malformed_fingerprint_does_not_stop_the_correct_ones_after_it(client, make_device):
    device, token = make_device()

    assert heartbeat(client, token, {**GOOD, "os": "Linux"}).status_code == 400
    response = heartbeat(client, token, GOOD)

    assert response.status_code == 200 and response.json()["state"] == "online"
    device.refresh_from_db()
    assert device.fingerprint == GOOD


def test_a_malformed_fingerprint_stored_before_is_replaced_by_the_next_correct_one(
    client, make_device
):
    # Stored by a hub that did not check shapes yet: every later heartbeat answered 500.
    device, token = make_device()
    Device.objects.filter(pk=device.pk).update(fingerprint={**GOOD, "os": "Linux", "cpu": 3})

    response = heartbeat(client, token, GOOD)

    assert response.status_code == 200 and response.json()["state"] == "online"
    device.refresh_from_db()
    assert device.fingerprint == GOOD
    [change] = FingerprintChange.objects.filter(device=device)
    assert any(line.startswith("OS Linux →") for line in change.summary)


def test_the_class_page_and_preflight_read_past_a_malformed_stored_fingerprint(
    client, alice, make_device, device_class, version
):
    device, _ = make_device()
    Device.objects.filter(pk=device.pk).update(fingerprint={"cpu": "x", "gpus": 3, "cuda": []})
    client.login(username="alice", password=PASSWORD)

    assert client.get(f"/devices/classes/{device_class.pk}/").status_code == 200
    page = client.get(f"/devices/{device.pk}/")
    assert page.status_code == 200
    assert "fingerprint.cpu must be an object (or null), not text" in page.content.decode()
    assert client.get(f"/versions/{version.pk}/").status_code == 200
