"""Queueing benchmarks from the pages and the API: scenarios, sweeps, refusals."""

import json

import pytest

from deployhub.benchmarks.batches import BatchRefused, sweep_sizes
from deployhub.jobs.models import Job
from deployhub.registry.uploads import derive_version
from tests.api_calls import token_for
from tests.benchmark_results import ranged, record_run, result
from tests.conftest import PASSWORD, stored_engine


def contract(batch):
    return {"inputs": {"image": {"shape": ["batch", 3, 32, 32], "batch": batch, "dynamic": {}}}}


def test_the_sweep_walks_powers_of_two_up_to_the_contracts_largest_batch(version, alice):
    assert sweep_sizes(ranged(version, alice)) == [1, 2, 4, 8, 16, 24]
    child = derive_version(version, alice, contract=contract({"min": 1, "opt": 8, "max": 32}))
    assert sweep_sizes(child) == [1, 2, 4, 8, 16, 32]


def test_the_sweep_of_listed_sizes_keeps_to_the_list(version, alice):
    child = derive_version(version, alice, contract=contract({"sizes": [1, 3, 8, 16]}))
    assert sweep_sizes(child) == [1, 8, 16]


def test_a_fixed_batch_has_nothing_to_sweep(version):
    with pytest.raises(BatchRefused, match="fixed at 1: there is nothing to sweep"):
        sweep_sizes(version)  # the default contract allows batch 1 only


def page_post(client, version, **fields):
    client.login(username="alice", password=PASSWORD)
    return client.post(f"/versions/{version.pk}/benchmark", fields)


def test_the_page_queues_a_single_stream_run_by_duration(client, alice, version, device_class):
    response = page_post(client, version, device_class=device_class.pk)
    job = Job.objects.get()
    assert response.status_code == 302 and response.url.endswith(f"#job-{job.pk}")
    assert job.params == {
        "scenario": "single-stream",
        "batch_size": 1,
        "duration_s": 10.0,
        "warmup_s": 2.0,
    }


def test_an_iteration_count_replaces_the_duration(client, alice, version, device_class):
    page_post(client, version, device_class=device_class.pk, duration_s=10, iterations=500)
    assert Job.objects.get().params == {
        "scenario": "single-stream",
        "batch_size": 1,
        "iterations": 500,
        "warmup_iterations": 10,
    }


def test_a_server_run_carries_the_class_budget(client, alice, version, device_class):
    page_post(client, version, device_class=device_class.pk, scenario="server", target_qps=40)
    params = Job.objects.get().params
    assert params["scenario"] == "server" and params["target_qps"] == 40.0
    assert params["budget_ms"] == 33.3


def test_a_sweep_sends_the_list_from_the_contract(client, alice, version, device_class):
    child = ranged(version, alice)
    page_post(client, child, device_class=device_class.pk, batch_sweep="on", batch_size=8)
    params = Job.objects.get().params
    assert params["batch_sizes"] == [1, 2, 4, 8, 16, 24] and params["batch_size"] == 8


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"scenario": "server", "target_qps": -1}, "greater than or equal to 0.001"),
        ({"target_qps": 40}, "is for the Server scenario only"),
        ({"samples": 100}, "is for the Offline scenario only"),
        ({"scenario": "burst"}, "Select a valid choice"),
        ({"batch_size": 8}, "Batch 8 is outside the input-shape contract"),
        ({"batch_sweep": "on"}, "fixed at 1: there is nothing to sweep"),
        ({"duration_s": 0}, "greater than or equal to 0.5"),
        ({"sweep_duration_s": 2}, "A sweep step duration needs the batch sweep"),
    ],
)
def test_the_page_refuses_bad_params_and_queues_nothing(
    client, alice, version, device_class, fields, message
):
    response = page_post(client, version, device_class=device_class.pk, **fields)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not Job.objects.exists()


def test_a_viewer_cannot_queue_a_benchmark(client, vera, version, device_class):
    client.login(username="vera", password=PASSWORD)
    response = client.post(f"/versions/{version.pk}/benchmark", {"device_class": device_class.pk})
    assert response.status_code == 403 and not Job.objects.exists()


def api_post(client, user, url, body):
    return client.post(url, json.dumps(body), content_type="application/json", **token_for(user))


def test_the_api_queues_a_benchmark_and_answers_its_job(client, alice, version, device_class):
    url = f"/api/v1/versions/{version.pk}/benchmarks"
    response = api_post(
        client,
        alice,
        url,
        {"device_class": device_class.slug, "scenario": "offline", "samples": 64},
    )
    assert response.status_code == 202
    job = Job.objects.get()
    body = response.json()["job"]
    assert body["id"] == job.pk and body["url"].endswith(f"/jobs/{job.pk}/")
    assert job.params["scenario"] == "offline" and job.params["samples"] == 64


@pytest.mark.parametrize(
    "body, message",
    [
        ({"scenario": "server", "target_qps": 0}, "target_qps: Ensure this value is greater"),
        ({"batch_size": 8}, "batch_size: Batch 8 is outside the input-shape contract"),
        ({"iterations": "many"}, "iterations: Enter a whole number."),
        ({"frobnicate": 1}, "Unknown parameter 'frobnicate'"),
        ({"device_class": "nowhere"}, "Choose one of your team's device classes."),
    ],
)
def test_the_api_refuses_bad_params_with_400_and_queues_nothing(
    client, alice, version, device_class, body, message
):
    response = api_post(
        client,
        alice,
        f"/api/v1/versions/{version.pk}/benchmarks",
        {"device_class": device_class.slug, **body},
    )
    assert response.status_code == 400 and message in response.json()["error"]
    assert not Job.objects.exists()


def test_the_api_refuses_a_body_that_is_not_json(client, alice, version):
    response = client.post(
        f"/api/v1/versions/{version.pk}/benchmarks",
        "scenario=server",
        content_type="application/json",
        **token_for(alice),
    )
    assert response.status_code == 400 and not Job.objects.exists()


def test_the_api_lists_a_versions_runs_with_their_gate(client, alice, version, device_class):
    run = record_run(version, device_class, result())
    response = client.get(f"/api/v1/versions/{version.pk}/benchmarks", **token_for(alice))
    assert response.json()["count"] == 1
    [body] = response.json()["items"]
    assert body["id"] == run.pk and body["latency_ms"]["p99"] == 15.0
    assert body["gate"]["verdict"] == "meets" and body["scenario"] == "single-stream"
    assert body["stability"]["stable"] is True and body["host"]["logical_cpus"] == 4


def test_the_api_filters_and_pages_runs_by_their_fields(client, alice, version, device_class):
    int8 = stored_engine(version, device_class, {"precision": "int8"})
    source = record_run(version, device_class, result())
    quantised = record_run(version, device_class, result(), engine=int8)
    url = f"/api/v1/versions/{version.pk}/benchmarks"

    def ids(query):
        body = client.get(f"{url}?{query}", **token_for(alice)).json()
        return [run["id"] for run in body["items"]], body["count"]

    assert ids("") == ([quantised.pk, source.pk], 2)  # newest first
    assert ids("precision=int8") == ([quantised.pk], 1)
    assert ids(f"device_class={device_class.slug}&precision=fp32") == ([source.pk], 1)
    assert ids("device_class=elsewhere") == ([], 0)
    assert ids("backend=tensorrt&backend=onnxruntime&limit=1&offset=1") == ([source.pk], 2)
    response = client.get(f"{url}?vmin=x", **token_for(alice))
    assert response.status_code == 400 and "vmin" in response.json()["error"]


@pytest.fixture
def engine(version, device_class):
    config = {"provider": "CPUExecutionProvider", "precision": "fp32"}
    return stored_engine(version, device_class, config)


def test_the_engine_api_queues_on_the_engines_class(client, alice, engine):
    url = f"/api/v1/engines/{engine.pk}/benchmarks"
    response = api_post(client, alice, url, {"scenario": "server", "target_qps": 10})
    assert response.status_code == 202
    job = Job.objects.get()
    assert job.engine == engine and job.device_class == engine.device_class
    assert job.params["budget_ms"] == 33.3
    assert api_post(client, alice, url, {"device_class": "x"}).status_code == 400


def test_the_engine_page_queues_with_defaults_and_refuses_bad_params(client, alice, engine):
    client.login(username="alice", password=PASSWORD)
    response = client.post(f"/engines/{engine.pk}/benchmark", {"batch_size": 8})
    assert response.status_code == 400 and "outside the input-shape contract" in (
        response.content.decode()
    )
    assert not Job.objects.exists()
    client.post(f"/engines/{engine.pk}/benchmark")
    assert Job.objects.get().params["scenario"] == "single-stream"


def test_a_server_run_without_a_rate_leaves_it_to_the_worker(client, alice, engine):
    client.login(username="alice", password=PASSWORD)
    client.post(f"/engines/{engine.pk}/benchmark", {"scenario": "server"})
    params = Job.objects.get().params
    assert params["scenario"] == "server" and "target_qps" not in params
    assert params["budget_ms"] == engine.device_class.frame_budget_ms


def test_the_engine_page_shows_its_runs(client, alice, engine, version, device_class):
    record_run(version, device_class, result(), engine=engine)
    client.login(username="alice", password=PASSWORD)
    page = client.get(f"/engines/{engine.pk}/").content.decode()
    assert 'id="results-table"' in page and "Meets budget" in page and "SingleStream" in page


def test_another_team_can_neither_queue_nor_list(client, charlie, version, device_class, engine):
    for url in (
        f"/api/v1/versions/{version.pk}/benchmarks",
        f"/api/v1/engines/{engine.pk}/benchmarks",
    ):
        assert client.get(url, **token_for(charlie)).status_code == 404
        assert (
            api_post(client, charlie, url, {"device_class": device_class.slug}).status_code == 404
        )
    client.login(username="charlie", password=PASSWORD)
    assert (
        client.post(
            f"/versions/{version.pk}/benchmark", {"device_class": device_class.pk}
        ).status_code
        == 404
    )
    assert not Job.objects.exists()


def test_a_viewer_gets_403_from_the_api_before_any_check(client, vera, version, device_class):
    url = f"/api/v1/versions/{version.pk}/benchmarks"
    response = api_post(client, vera, url, {"device_class": device_class.slug, "frobnicate": 1})
    assert response.status_code == 403 and not Job.objects.exists()
