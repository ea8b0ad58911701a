"""GET /healthz: database, broker and online workers."""

from deployhub.devices.models import Device


def test_it_is_healthy_with_database_and_broker(client, make_device):
    device, _ = make_device()
    device.record_heartbeat()
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["database"] == "ok" and body["broker"] == "ok"
    assert body["workers_online"] == Device.objects.online().count() == 1


def test_it_counts_only_workers_that_heartbeat(client, make_device):
    make_device()  # registered, never started
    assert client.get("/healthz").json()["workers_online"] == 0


def test_it_answers_503_when_the_broker_is_unreachable(client, settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["broker"] != "ok"
