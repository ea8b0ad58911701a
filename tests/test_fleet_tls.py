"""A device reaches the hub as it does in a real network: through a TLS-terminating proxy
whose certificate a private CA signed, and through a company's HTTP proxy (CONNECT).

The hub is set up as docs/protocol.md ("Behind a proxy, with a private CA") says: the
proxy in front terminates TLS and the hub trusts its X-Forwarded-Proto (DEPLOYHUB_TLS,
DEPLOYHUB_PROXY_COUNT=1), so plain HTTP is redirected while the proxy's calls are HTTPS.
The worker is given the CA bundle (REQUESTS_CA_BUNDLE) and the proxy (HTTPS_PROXY).
"""

import pytest
import requests
from django.core.handlers.wsgi import WSGIHandler
from django.test.utils import override_settings

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.devices.models import Device
from deployhub.jobs.models import Job, JobState
from tests.conftest import WorkerProcess, job_finished, queued_benchmark, worker_ready
from tests.tls_proxies import ConnectProxy, TlsProxy, private_ca
from workers.client import HubClient, HubUntrusted

pytestmark = pytest.mark.django_db(transaction=True)

# What a production hub makes of DEPLOYHUB_TLS=true and DEPLOYHUB_PROXY_COUNT=1
# (deployhub/settings.py).
BEHIND_A_TLS_PROXY = {
    "SECURE_SSL_REDIRECT": True,
    "SECURE_HSTS_SECONDS": 3600,
    "SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https"),
    "DEPLOYHUB_PROXY_COUNT": 1,
}
# The system's bundle only: a worker that was not given the private CA.
NO_PRIVATE_CA = {"REQUESTS_CA_BUNDLE": "", "CURL_CA_BUNDLE": ""}


@pytest.fixture
def ca(tmp_path):
    return private_ca(tmp_path)


@pytest.fixture
def tls_proxy(live_server, ca):
    """The live hub set up to sit behind a TLS proxy, and that proxy in front of it."""
    with override_settings(**BEHIND_A_TLS_PROXY):
        _rebuild_middleware(live_server)
        proxy = TlsProxy(live_server.thread.port, ca)
        try:
            yield proxy
        finally:
            proxy.close()
    _rebuild_middleware(live_server)


def _rebuild_middleware(live_server):
    """The live hub built its middleware when it started, and Django's SecurityMiddleware
    reads SECURE_SSL_REDIRECT and SECURE_HSTS_SECONDS then: build it again, so it reads
    them as a hub started with them does."""
    handler = live_server.thread.httpd.get_app()
    while hasattr(handler, "application"):  # static and media files wrap the hub
        handler = handler.application
    assert isinstance(handler, WSGIHandler)
    handler.load_middleware()


@pytest.fixture
def https_worker(tmp_path):
    """Start a real HTTPS-mode worker against a hub address of the test's choosing."""
    started = []

    def start(device, token, hub, env):
        log = tmp_path / f"worker-{device.name}.log"
        worker = WorkerProcess(hub, token, log, env=env, mode="https")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def test_the_hub_redirects_plain_http_and_takes_the_proxy_s_calls_as_https(
    live_server, tls_proxy, ca, make_device
):
    device, token = make_device()
    auth = {"Authorization": f"Bearer {token}"}

    plain = requests.get(f"{live_server.url}/api/v1/device", headers=auth, allow_redirects=False)
    proxied = requests.get(f"{tls_proxy.url}/api/v1/device", headers=auth, verify=str(ca.ca_pem))

    assert plain.status_code == 301 and plain.headers["Location"].startswith("https://")
    assert proxied.status_code == 200, proxied.text
    assert proxied.json()["id"] == device.pk
    assert "max-age=3600" in proxied.headers["Strict-Transport-Security"]


@pytest.mark.e2e
def test_a_worker_given_the_private_ca_runs_a_job_through_the_tls_proxy(
    tls_proxy, ca, https_worker, make_device, version, device_class, alice
):
    device, token = make_device()
    env = {"REQUESTS_CA_BUNDLE": str(ca.ca_pem), "CURL_CA_BUNDLE": ""}
    worker = worker_ready(https_worker(device, token, tls_proxy.url, env), device)
    assert f"asking {tls_proxy.url} for work over HTTPS" in worker.output()

    job = job_finished(queued_benchmark(version, device_class, alice), worker)

    assert job.state == JobState.SUCCEEDED, job.error + worker.output()
    assert BenchmarkRun.objects.filter(job=job).exists()
    assert tls_proxy.refused == []


@pytest.mark.e2e
def test_a_worker_without_the_ca_says_the_certificate_is_not_trusted_and_runs_nothing(
    tls_proxy, https_worker, make_device, version, device_class, alice
):
    device, token = make_device()
    job = queued_benchmark(version, device_class, alice)
    worker = https_worker(device, token, tls_proxy.url, NO_PRIVATE_CA)

    status = worker.process.wait(timeout=60)  # at once: no wait mends a certificate

    output = worker.output()
    assert status == 1, output
    [said] = [line for line in output.splitlines() if "certificate" in line]
    assert f"the hub at {tls_proxy.url} has a certificate this worker does not trust" in said
    assert "unable to get local issuer certificate" in said
    assert "set REQUESTS_CA_BUNDLE to that CA's certificate" in said
    assert "Traceback" not in output and "waiting for the hub" not in output
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    assert Device.objects.get(pk=device.pk).last_heartbeat_at is None
    assert any("unknown ca" in refusal for refusal in tls_proxy.refused)


@pytest.mark.e2e
def test_a_worker_behind_an_http_proxy_tunnels_to_the_hub_and_runs_a_job(
    tls_proxy, ca, https_worker, make_device, version, device_class, alice
):
    connect = ConnectProxy()
    try:
        device, token = make_device()
        env = {
            "REQUESTS_CA_BUNDLE": str(ca.ca_pem),
            "CURL_CA_BUNDLE": "",
            "HTTPS_PROXY": connect.url,
            "NO_PROXY": "",
        }
        worker = worker_ready(https_worker(device, token, tls_proxy.url, env), device)

        job = job_finished(queued_benchmark(version, device_class, alice), worker)
    finally:
        connect.close()

    assert job.state == JobState.SUCCEEDED, job.error + worker.output()
    assert f"127.0.0.1:{tls_proxy.port}" in connect.seen


def test_the_client_goes_through_https_proxy_unless_no_proxy_names_the_hub(
    tls_proxy, ca, make_device, monkeypatch
):
    device, token = make_device()
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca.ca_pem))
    connect = ConnectProxy()
    try:
        monkeypatch.setenv("HTTPS_PROXY", connect.url)
        monkeypatch.setenv("NO_PROXY", "")
        through = HubClient(tls_proxy.url, token).whoami()
        tunnels = list(connect.seen)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        direct = HubClient(tls_proxy.url, token).whoami()
    finally:
        connect.close()

    assert through["id"] == direct["id"] == device.pk
    assert tunnels == [f"127.0.0.1:{tls_proxy.port}"] and connect.seen == tunnels


def test_a_certificate_the_client_does_not_trust_is_said_at_once_direct_or_tunnelled(
    tls_proxy, make_device, monkeypatch
):
    device, token = make_device()
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    connect = ConnectProxy()
    refusals = []
    try:
        for proxy in ("", connect.url):
            monkeypatch.setenv("HTTPS_PROXY", proxy)
            with pytest.raises(HubUntrusted) as refused:
                HubClient(tls_proxy.url, token, backoff=60).whoami()  # a retry would show
            refusals.append(refused.value.message)
    finally:
        connect.close()

    for message in refusals:
        assert "does not trust (unable to get local issuer certificate" in message
    assert connect.seen == [f"127.0.0.1:{tls_proxy.port}"]
