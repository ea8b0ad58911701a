"""Device classes: serving pattern and budgets, their validation, and the budget calculator."""

import pytest

from deployhub.devices.models import DeviceClass, ServingPattern
from deployhub.teams.models import Event
from tests.benchmark_results import record_run, result
from tests.conftest import PASSWORD

NEW_CLASS = {
    "slug": "edge-batch",
    "name": "Edge batch",
    "serving_pattern": "batch",
    "frame_budget_ms": 33.3,
    "throughput_target_ips": 500,
    "batch_latency_ceiling_ms": 200,
    "accuracy_tolerance": 1.0,
}


def test_it_creates_a_batch_class_with_its_target_and_ceiling(client, alice):
    client.login(username="alice", password=PASSWORD)
    response = client.post("/devices/", NEW_CLASS)
    device_class = DeviceClass.objects.get(slug="edge-batch")
    assert response.status_code == 302
    assert device_class.serving_pattern == ServingPattern.BATCH
    assert (
        device_class.throughput_target_ips == 500 and device_class.batch_latency_ceiling_ms == 200
    )
    assert device_class.gate_rule == "At least 500 images/s, each batch within 200 ms at p99."


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"throughput_target_ips": ""}, "A batch class is judged on throughput"),
        ({"frame_budget_ms": 0}, "The frame budget must be greater than 0."),
        ({"frame_budget_ms": -5}, "The frame budget must be greater than 0."),
        ({"throughput_target_ips": -1}, "The throughput target must be greater than 0."),
        ({"batch_latency_ceiling_ms": 0}, "The batch latency ceiling must be greater than 0."),
        ({"memory_limit_mb": 0}, "The memory limit must be greater than 0."),
        ({"accuracy_tolerance": -1}, "The accuracy tolerance cannot be negative."),
        ({"serving_pattern": "stream"}, "Select a valid choice."),
    ],
)
def test_it_refuses_bad_budgets_and_creates_nothing(client, alice, changes, message):
    client.login(username="alice", password=PASSWORD)
    response = client.post("/devices/", {**NEW_CLASS, **changes})
    assert response.status_code == 400 and message in response.content.decode()
    assert not DeviceClass.objects.exists()


def test_it_edits_the_serving_pattern_and_budgets(client, alice, device_class):
    client.login(username="alice", password=PASSWORD)
    response = client.post(
        f"/devices/classes/{device_class.pk}/edit",
        {**NEW_CLASS, "name": "Now batch", "slug": "ignored"},
    )
    assert response.status_code == 302
    device_class.refresh_from_db()
    assert device_class.serving_pattern == "batch" and device_class.throughput_target_ips == 500
    assert device_class.slug.startswith("cpu-"), "the slug names a queue: it never changes"
    assert Event.objects.filter(verb="device_class.changed").exists()


def test_a_bad_edit_changes_nothing_and_says_why(client, alice, device_class):
    client.login(username="alice", password=PASSWORD)
    before = DeviceClass.objects.values().get(pk=device_class.pk)
    response = client.post(
        f"/devices/classes/{device_class.pk}/edit",
        {**NEW_CLASS, "throughput_target_ips": "", "frame_budget_ms": 10},
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "A batch class is judged on throughput" in page
    assert "p99 per frame within 33.3 ms" in page, "the page shows the stored class"
    assert DeviceClass.objects.values().get(pk=device_class.pk) == before


def test_only_an_admin_edits_a_class(client, bob, device_class):
    client.login(username="bob", password=PASSWORD)
    response = client.post(f"/devices/classes/{device_class.pk}/edit", NEW_CLASS)
    assert response.status_code == 403
    assert DeviceClass.objects.get(pk=device_class.pk).serving_pattern == "realtime"


def test_another_team_cannot_see_or_edit_a_class(client, charlie, device_class):
    client.login(username="charlie", password=PASSWORD)
    assert client.get(f"/devices/classes/{device_class.pk}/?fps=30").status_code == 404
    response = client.post(f"/devices/classes/{device_class.pk}/edit", NEW_CLASS)
    assert response.status_code == 404
    assert DeviceClass.objects.get(pk=device_class.pk).serving_pattern == "realtime"


def test_the_calculator_turns_fps_into_a_budget_and_lists_what_meets_it(
    client, alice, version, device_class
):
    fast = record_run(version, device_class, result())  # p99 15 ms
    slow = record_run(
        version, device_class, result(latency_ms={**result()["latency_ms"], "p99": 20.0})
    )
    record_run(version, device_class, result(scenario="offline"))  # measures no per-frame latency
    client.login(username="alice", password=PASSWORD)
    response = client.get(f"/devices/classes/{device_class.pk}/?fps=60")
    page = response.content.decode()
    assert response.status_code == 200
    assert 'id="budget-ms">16.67 ms</strong>' in page
    assert f"#run-{fast.pk}" in page and f"#run-{slow.pk}" not in page
    assert page.count('<td class="p99">') == 1

    page = client.get(f"/devices/classes/{device_class.pk}/?fps=50").content.decode()
    assert 'id="budget-ms">20.00 ms</strong>' in page and f"#run-{slow.pk}" in page


def test_the_calculator_takes_a_server_runs_p99(client, alice, version, device_class):
    from tests.benchmark_results import SERVER_BLOCK

    run = record_run(version, device_class, result(scenario="server", server=SERVER_BLOCK))
    client.login(username="alice", password=PASSWORD)
    page = client.get(f"/devices/classes/{device_class.pk}/?fps=55").content.decode()
    assert f"#run-{run.pk}" not in page  # its server p99 is 21 ms > 18.18 ms
    page = client.get(f"/devices/classes/{device_class.pk}/?fps=45").content.decode()
    assert f"#run-{run.pk}" in page


@pytest.mark.parametrize("fps", ["0", "-3", "fast", "1e9"])
def test_the_calculator_refuses_a_bad_fps(client, alice, device_class, fps):
    client.login(username="alice", password=PASSWORD)
    response = client.get(f"/devices/classes/{device_class.pk}/?fps={fps}")
    assert response.status_code == 400 and 'class="errorlist' in response.content.decode()
    assert 'id="budget-runs"' not in response.content.decode()


def test_the_page_without_fps_shows_the_empty_calculator(client, alice, device_class):
    client.login(username="alice", password=PASSWORD)
    response = client.get(f"/devices/classes/{device_class.pk}/")
    assert response.status_code == 200 and 'id="budget-calculator"' in response.content.decode()
