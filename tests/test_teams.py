"""Nobody sees another team's objects; roles decide who may act."""

from deployhub.jobs.models import Job
from tests.conftest import PASSWORD


def test_it_hides_another_teams_objects(client, charlie, version, device_class, job):
    client.login(username="charlie", password=PASSWORD)
    for url in [
        f"/models/{version.model.pk}/",
        f"/versions/{version.pk}/",
        f"/devices/classes/{device_class.pk}/",
        f"/jobs/{job.pk}/",
        f"/jobs/{job.pk}/status",
        f"/versions/{version.pk}/results",
    ]:
        assert client.get(url).status_code == 404, url
    assert "digits-cnn" not in client.get("/models/").content.decode()
    assert f"#{job.pk}" not in client.get("/jobs/").content.decode()


def test_it_lets_a_team_member_see_the_teams_objects(client, bob, version, job):
    client.login(username="bob", password=PASSWORD)
    assert client.get(f"/versions/{version.pk}/").status_code == 200
    assert client.get(f"/jobs/{job.pk}/").status_code == 200


def test_a_viewer_cannot_start_a_benchmark(client, vera, version, device_class):
    client.login(username="vera", password=PASSWORD)
    response = client.post(
        f"/versions/{version.pk}/benchmark",
        {"device_class": device_class.pk, "batch_size": 1, "warmup_iterations": 1, "iterations": 5},
    )
    assert response.status_code == 403
    assert not Job.objects.exists()


def test_an_engineer_queues_a_benchmark_from_the_version_page(client, bob, version, device_class):
    client.login(username="bob", password=PASSWORD)
    response = client.post(
        f"/versions/{version.pk}/benchmark",
        {
            "device_class": device_class.pk,
            "batch_size": 1,
            "warmup_iterations": 3,
            "iterations": 40,
        },
    )
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"].endswith(f"#job-{job.pk}")
    assert job.params == {
        "scenario": "single-stream",
        "batch_size": 1,
        "warmup_iterations": 3,
        "iterations": 40,
    }
    assert job.state == "queued" and job.created_by == bob


def test_it_refuses_a_benchmark_on_another_teams_device_class(client, alice, charlie, version):
    from deployhub.devices.models import DeviceClass

    acme_class = DeviceClass.objects.create(team=charlie.memberships.get().team, slug="acme-only")
    client.login(username="alice", password=PASSWORD)
    client.post(
        f"/versions/{version.pk}/benchmark",
        {"device_class": acme_class.pk, "batch_size": 1, "warmup_iterations": 1, "iterations": 5},
    )
    assert not Job.objects.exists()


def test_only_an_admin_registers_devices_and_the_token_is_shown_once(
    client, alice, bob, device_class
):
    client.login(username="bob", password=PASSWORD)
    url = f"/devices/classes/{device_class.pk}/"
    assert client.post(url, {"name": "edge-1"}).status_code == 403
    client.login(username="alice", password=PASSWORD)
    page = client.post(url, {"name": "edge-1"}).content.decode()
    device = device_class.devices.get(name="edge-1")
    token = page.split("DEPLOYHUB_DEVICE_TOKEN=")[1].split()[0]
    assert token.startswith("dht_") and device.token_hash != token
    assert token not in client.get(url).content.decode()
    from deployhub.devices.models import Device

    assert Device.objects.by_token(token) == device


def test_it_records_who_cancelled_a_job(client, alice, job):
    client.login(username="alice", password=PASSWORD)
    client.post(f"/jobs/{job.pk}/cancel")
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert job.team.events.filter(verb="job.cancel", actor="alice", target_id=job.pk).exists()
