"""/metrics: the fleet's figures for Prometheus, read from the database, for scrapers only."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from deployhub.jobs.actions import submit_job
from deployhub.jobs.models import JobKind
from tests.api_calls import call

pytestmark = pytest.mark.django_db

OUTSIDER = "203.0.113.5"  # an address outside the default networks (the hub's own host)


@pytest.fixture(autouse=True)
def metrics_token(settings):
    settings.DEPLOYHUB_METRICS_TOKEN = "scrape-me-please"
    return settings.DEPLOYHUB_METRICS_TOKEN


def scrape(client, **headers):
    """Scrape /metrics as Prometheus would; return {(name, sorted labels): value}."""
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    figures = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            figures[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return figures


def figure(figures, name, **labels):
    """One sample's value, 0 when the scrape has none with these labels."""
    return figures.get((name, tuple(sorted(labels.items()))), 0)


def noop(device_class, alice):
    return submit_job(
        team=device_class.team, kind=JobKind.NOOP, device_class=device_class, user=alice
    )


def test_the_hubs_own_host_may_scrape(client):
    response = client.get("/metrics")  # the test client calls from 127.0.0.1

    assert response.status_code == 200
    assert b"# TYPE deployhub_queued_jobs gauge" in response.content


def test_a_scraper_elsewhere_may_with_the_token(client, metrics_token):
    headers = {"REMOTE_ADDR": OUTSIDER, "HTTP_AUTHORIZATION": f"Bearer {metrics_token}"}

    assert client.get("/metrics", **headers).status_code == 200


def test_anyone_else_is_refused_with_a_json_error(client):
    for headers in (
        {"REMOTE_ADDR": OUTSIDER},
        {"REMOTE_ADDR": OUTSIDER, "HTTP_AUTHORIZATION": "Bearer scrape-me-not"},
        {"REMOTE_ADDR": OUTSIDER, "HTTP_AUTHORIZATION": "scrape-me-please"},
        # Without DEPLOYHUB_PROXY_COUNT, X-Forwarded-For is whatever the caller wrote.
        {"REMOTE_ADDR": OUTSIDER, "HTTP_X_FORWARDED_FOR": "127.0.0.1"},
    ):
        response = client.get("/metrics", **headers)

        assert response.status_code == 403, headers
        assert "DEPLOYHUB_METRICS_TOKEN" in response.json()["error"]
        assert b"deployhub_" not in response.content


def test_no_token_is_set_so_none_is_accepted(client, settings):
    settings.DEPLOYHUB_METRICS_TOKEN = ""
    headers = {"REMOTE_ADDR": OUTSIDER, "HTTP_AUTHORIZATION": "Bearer "}

    assert client.get("/metrics", **headers).status_code == 403


def test_behind_a_proxy_the_address_it_saw_is_checked(client, settings):
    settings.DEPLOYHUB_PROXY_COUNT = 1
    settings.DEPLOYHUB_METRICS_NETWORKS = ["10.20.0.0/16"]
    proxy = {"REMOTE_ADDR": "192.0.2.1"}

    allowed = client.get("/metrics", HTTP_X_FORWARDED_FOR="10.20.3.4", **proxy)
    refused = client.get("/metrics", HTTP_X_FORWARDED_FOR="10.21.3.4", **proxy)

    assert (allowed.status_code, refused.status_code) == (200, 403)


def test_the_figures_follow_a_job_from_queued_to_done(client, alice, device_class, make_device):
    slug = device_class.slug
    job = noop(device_class, alice)
    queued = scrape(client)
    assert figure(queued, "deployhub_queued_jobs", device_class=slug) == 1
    assert figure(queued, "deployhub_oldest_queued_job_age_seconds", device_class=slug) >= 0
    assert figure(queued, "deployhub_jobs", state="queued", kind="noop", device_class=slug) == 1
    assert figure(queued, "deployhub_devices_online", device_class=slug, delivery="broker") == 0

    _, token = make_device()
    assert call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1}).status_code == 200
    running = scrape(client)
    assert figure(running, "deployhub_queued_jobs", device_class=slug) == 0
    assert figure(running, "deployhub_jobs", state="running", kind="noop", device_class=slug) == 1
    assert figure(running, "deployhub_devices_online", device_class=slug, delivery="broker") == 1
    assert (
        figure(running, "deployhub_devices_registered", device_class=slug, delivery="broker") == 1
    )

    body = {"attempt": 1, "state": "succeeded", "result": {}}
    assert call(client, token, f"jobs/{job.pk}/complete", body).status_code == 200
    done = scrape(client)
    assert figure(done, "deployhub_jobs", state="succeeded", kind="noop", device_class=slug) == 1
    assert figure(done, "deployhub_job_duration_seconds_count", kind="noop", backend="none") == 1
    assert (
        figure(
            done, "deployhub_job_duration_seconds_bucket", kind="noop", backend="none", le="+Inf"
        )
        == 1
    )


def test_a_compile_is_timed_under_its_backend(client, alice, device_class, make_device, version):
    job = submit_job(
        team=device_class.team,
        kind=JobKind.COMPILE,
        device_class=device_class,
        user=alice,
        model_version=version,
        params={"backend": "onnxruntime", "build_config": {}},
    )
    _, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    body = {"attempt": 1, "state": "failed", "error": "boom", "failure_category": "out_of_memory"}
    call(client, token, f"jobs/{job.pk}/complete", body)

    figures = scrape(client)

    labels = {"kind": "compile", "backend": "onnxruntime"}
    assert figure(figures, "deployhub_job_duration_seconds_count", **labels) == 1
    failures = "deployhub_job_failures"
    assert figure(figures, failures, kind="compile", category="out_of_memory") == 1


def test_refused_claims_are_counted_by_reason(client, alice, device_class, make_device):
    job = noop(device_class, alice)
    _, first = make_device()
    _, second = make_device()
    drained, drained_token = make_device()
    drained.draining = True
    drained.save()
    before = scrape(client)

    assert call(client, first, f"jobs/{job.pk}/claim", {"attempt": 2}).status_code == 409
    assert call(client, first, f"jobs/{job.pk}/claim", {"attempt": 1}).status_code == 200
    assert call(client, second, f"jobs/{job.pk}/claim", {"attempt": 1}).status_code == 409
    assert call(client, drained_token, f"jobs/{job.pk}/claim", {"attempt": 1}).status_code == 409

    after = scrape(client)
    name = "deployhub_claims_refused_total"
    for reason in ("stale_attempt", "not_queued", "draining"):
        assert figure(after, name, reason=reason) == figure(before, name, reason=reason) + 1


def test_a_claim_by_a_device_of_another_class_is_counted(
    client, alice, demo_team, device_class, make_device
):
    other = type(device_class).objects.create(team=demo_team, slug=f"{device_class.slug}-x")
    job = noop(other, alice)
    _, token = make_device()

    assert call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1}).status_code == 403

    assert figure(scrape(client), "deployhub_claims_refused_total", reason="wrong_class") == 1


def test_a_scrape_costs_the_same_queries_whatever_the_fleet(
    client, alice, demo_team, device_class, make_device
):
    def queries():
        with CaptureQueriesContext(connection) as captured:
            scrape(client)
        return len(captured)

    noop(device_class, alice)
    make_device()
    few = queries()
    for n in range(5):
        other = type(device_class).objects.create(team=demo_team, slug=f"{device_class.slug}-{n}")
        make_device(cls=other)
        noop(other, alice)

    assert queries() == few <= 12
