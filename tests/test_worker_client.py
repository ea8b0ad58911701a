"""The worker's HTTP client against a tiny hub stand-in speaking docs/protocol.md."""

import hashlib
import io
import json
import socket
import ssl
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from workers.client import (
    Conflict,
    HubClient,
    HubError,
    HubUnreachable,
    InputMismatch,
    Unauthorized,
)
from workers.kept import KeptConnections

TOKEN = "device-token-123"
MODEL_BYTES = b"not really onnx, but bytes all the same"
MODEL_SHA256 = hashlib.sha256(MODEL_BYTES).hexdigest()
LINGER_NOT = struct.pack("ii", 1, 0)  # close with a reset


class FakeHubForClientTest:
    """Answer each (method, path) with scripted responses, recording every request."""

    def __init__(self, tls=None, keep_alive=False):
        """tls: (certificate, key) paths to answer over HTTPS with; keep_alive: HTTP/1.1
        (connections stay open until the client closes them, or close_next_connection)."""
        self.script = {}
        self.requests = []
        self.connections = 0
        self.close_next_connection = False
        protocol = "HTTP/1.1" if keep_alive else "HTTP/1.0"
        handler = type("Handler", (_ScriptedHandler,), {"hub": self, "protocol_version": protocol})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        scheme = "http"
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_port}"
        serve = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)
        serve.start()

    def answer(self, method, path, *responses):
        """Queue responses (status, body[, headers]) for a path; the last one repeats."""
        self.script[(method, "/api/v1/" + path)] = list(responses)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class _ScriptedHandler(BaseHTTPRequestHandler):
    hub = None

    def handle(self):
        self.hub.connections += 1
        super().handle()

    def do_GET(self):
        self._answer()

    def do_POST(self):
        self._answer()

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.hub.requests.append((self.command, self.path, dict(self.headers), body))
        responses = self.hub.script.get((self.command, self.path), [(404, {"error": "no route"})])
        status, payload, *headers = responses.pop(0) if len(responses) > 1 else responses[0]
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        headers = {"Content-Length": str(len(data)), **(headers[0] if headers else {})}
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        if headers["Content-Length"] != str(len(data)):  # an answer cut short: hang up
            if headers.get("X-Then") == "reset":  # with a reset, before any orderly close
                self.wfile.flush()
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_NOT)
                self.wfile.close()
                self.rfile.close()
                self.connection.close()
                self.wfile = io.BytesIO()  # for the handler's last flush
            self.close_connection = True
        if self.hub.close_next_connection:  # as a hub's idle timeout does, without a word
            self.hub.close_next_connection = False
            self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def hub():
    hub = FakeHubForClientTest()
    yield hub
    hub.close()


@pytest.fixture
def client(hub):
    return HubClient(hub.url, TOKEN, timeout=5, backoff=0.01)


def test_it_sends_the_device_token_as_a_bearer_header(hub, client):
    hub.answer("GET", "device", (200, {"name": "local-cpu-1", "queue": "dc.local-cpu"}))

    device = client.whoami()

    assert device["queue"] == "dc.local-cpu"
    method, path, headers, _ = hub.requests[0]
    assert (method, path) == ("GET", "/api/v1/device")
    assert headers["Authorization"] == f"Bearer {TOKEN}"


def test_its_json_calls_keep_one_connection_and_open_another_once_the_hub_closed_it(monkeypatch):
    hub = FakeHubForClientTest(keep_alive=True)
    try:
        hub.answer("GET", "device", (200, {"name": "local-cpu-1"}))
        hub.answer("POST", "jobs/7/claim", (200, {"id": 7, "attempt": 1}))
        client = HubClient(hub.url, TOKEN, timeout=5, retries=0)  # no second try to lean on
        _no_requests(client, monkeypatch)
        for _ in range(3):
            assert client.whoami() == {"name": "local-cpu-1"}
        assert hub.connections == 1
        hub.close_next_connection = True
        client.whoami()
        time.sleep(0.1)  # the hub has closed it by now

        assert client.claim(7, 1) == {"id": 7, "attempt": 1}  # on a new connection, sent once
        assert hub.connections == 2 and len(hub.requests) == 5
        assert hub.requests[-1][3] == b'{"attempt": 1}'
        assert hub.requests[-1][2]["Content-Type"] == "application/json"
    finally:
        hub.close()


def test_each_thread_calls_over_a_connection_of_its_own(monkeypatch):
    hub = FakeHubForClientTest(keep_alive=True)
    try:
        hub.answer("POST", "jobs/7/heartbeat", (200, {"cancel_requested": False}))
        client = HubClient(hub.url, TOKEN, timeout=5)
        _no_requests(client, monkeypatch)
        answers = []

        def beat():
            answers.extend(client.job_heartbeat(7, 1, progress=0.5) for _ in range(25))

        threads = [threading.Thread(target=beat) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)

        assert answers == [{"cancel_requested": False}] * 50
        assert hub.connections == 2
    finally:
        hub.close()


def _no_requests(client, monkeypatch):
    """Fail any call that goes through requests: these must take the kept connection."""

    def refuse(*args, **kwargs):
        raise AssertionError("a JSON call went through requests")

    monkeypatch.setattr(client.session, "request", refuse)


def test_it_follows_a_redirect_of_a_json_call_as_requests_did(hub, client):
    moved = {"Location": f"{hub.url}/api/v1/device-moved"}
    hub.answer("GET", "device", (308, b"", moved))  # an http:// hub URL behind HTTPS, say
    hub.answer("GET", "device-moved", (200, {"name": "local-cpu-1"}))
    hub.answer("POST", "device/heartbeat", (308, b"", {"Location": f"{hub.url}/api/v1/beat"}))
    hub.answer("POST", "beat", (200, {"state": "online"}))

    assert client.whoami() == {"name": "local-cpu-1"}
    assert client.heartbeat() == {"state": "online"}
    assert hub.requests[-1][:2] == ("POST", "/api/v1/beat") and hub.requests[-1][3] == b"{}"


def test_it_calls_an_ipv6_hub_without_a_port_on_the_schemes_port():
    for url, port in (("http://[::1]", 80), ("https://[fe80::abcd]", 443)):
        connection = KeptConnections(url, 5, {})._connection()
        assert (connection.host, connection.port) == (url.split("[")[1].rstrip("]"), port)


@pytest.mark.parametrize("then", ["close", "reset"])
def test_a_call_whose_answer_is_cut_short_is_not_sent_again(hub, client, then):
    cut = {"Content-Length": "100", "X-Then": then}
    hub.answer("POST", "jobs/7/claim", (200, b'{"id": 7, "kind": "bench', cut))

    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        client.claim(7, 1)

    assert len(hub.requests) == 1  # the hub claimed it: a second claim would be refused


def test_a_redirect_that_would_turn_a_call_into_a_get_names_where_the_hub_went(hub, client):
    moved = {"Location": "https://hub.example/api/v1/device/heartbeat"}
    hub.answer("POST", "device/heartbeat", (301, b"", moved))  # the hub's own SSL redirect
    hub.answer("GET", "device", (302, b"", {"Location": f"{hub.url}/api/v1/device-moved"}))
    hub.answer("GET", "device-moved", (200, {"name": "local-cpu-1"}))

    with pytest.raises(HubError, match="moved to https://hub.example/.*DEPLOYHUB_HUB_URL"):
        client.heartbeat()
    assert len(hub.requests) == 1  # not sent again as a GET
    assert client.whoami() == {"name": "local-cpu-1"}  # a GET follows it, as it did


def test_it_refuses_to_send_a_number_json_has_no_word_for(hub, client):
    with pytest.raises(requests.exceptions.InvalidJSONError):
        client.complete(7, 1, "succeeded", result={"mean_ms": float("nan")})
    assert hub.requests == []


def test_a_ca_bundle_that_is_not_there_is_named_when_the_client_starts(monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/no/such/bundle.pem")
    with pytest.raises(OSError, match="/no/such/bundle.pem"):
        HubClient("https://hub.example", TOKEN)


def test_a_netrc_login_for_the_hubs_host_does_not_replace_the_device_token(
    hub, tmp_path, monkeypatch
):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password their-password\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    hub.answer("GET", "device", (200, {"name": "local-cpu-1"}))

    HubClient(hub.url, TOKEN, timeout=5).whoami()

    assert hub.requests[0][2]["Authorization"] == f"Bearer {TOKEN}"


def _without_proxies(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def test_it_reaches_the_hub_through_the_proxy_its_environment_names(hub, monkeypatch):
    _without_proxies(monkeypatch)
    monkeypatch.setenv("HTTP_PROXY", hub.url)  # the stand-in is the proxy here
    client = HubClient("http://hub.example:8000", TOKEN, timeout=5, retries=0)

    with pytest.raises(HubError):  # the proxy has no route for it: 404
        client.whoami()

    assert hub.requests[0][1] == "http://hub.example:8000/api/v1/device"  # a proxy's request


def test_it_goes_straight_to_a_hub_its_environment_exempts_from_the_proxy(hub, monkeypatch):
    _without_proxies(monkeypatch)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    hub.answer("GET", "device", (200, {"name": "local-cpu-1"}))

    assert HubClient(hub.url, TOKEN, timeout=5).whoami() == {"name": "local-cpu-1"}


def test_it_trusts_the_ca_bundle_its_environment_names(tmp_path, monkeypatch):
    certificate = _self_signed(tmp_path)
    hub = FakeHubForClientTest(tls=certificate)
    try:
        hub.answer("GET", "device", (200, {"name": "local-cpu-1"}))
        with pytest.raises(HubUnreachable, match="certificate"):  # not trusted by default
            HubClient(hub.url, TOKEN, timeout=5, retries=0).whoami()
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate[0]))
        trusting = HubClient(hub.url, TOKEN, timeout=5)
        _no_requests(trusting, monkeypatch)  # over the kept connection, verified
        assert [trusting.whoami() for _ in range(2)] == [{"name": "local-cpu-1"}] * 2
    finally:
        hub.close()


def _self_signed(folder):
    """Write a certificate for 127.0.0.1 and its key; return their paths."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hub.test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "hub.pem", folder / "hub.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_it_posts_json_bodies_without_the_fields_left_out(hub, client):
    hub.answer("POST", "jobs/12/heartbeat", (200, {"cancel_requested": False}))
    hub.answer("POST", "jobs/12/complete", (200, {}))

    client.job_heartbeat(12, 2, progress=0.5, message="measuring")
    client.complete(12, 2, "succeeded", result={})

    bodies = [json.loads(body) for *_, body in hub.requests]
    assert bodies == [
        {"attempt": 2, "progress": 0.5, "message": "measuring"},
        {"attempt": 2, "state": "succeeded", "result": {}},
    ]


def test_it_raises_conflict_with_the_hubs_reason_on_409(hub, client):
    hub.answer("POST", "jobs/12/claim", (409, {"error": "attempt 1 is stale (current: 2)"}))

    with pytest.raises(Conflict) as refused:
        client.claim(12, 1)

    assert refused.value.status == 409
    assert refused.value.message == "attempt 1 is stale (current: 2)"
    assert "attempt 1 is stale (current: 2)" in str(refused.value)
    assert "POST jobs/12/claim" in str(refused.value)
    assert len(hub.requests) == 1


def test_it_raises_unauthorized_on_401_without_retrying(hub, client):
    hub.answer("GET", "device", (401, {"error": "unknown device token"}))

    with pytest.raises(Unauthorized, match="unknown device token"):
        client.whoami()

    assert len(hub.requests) == 1


def test_it_reads_a_non_json_error_body(hub, client):
    hub.answer("POST", "device/heartbeat", (500, b"Internal Server Error"))

    with pytest.raises(HubError) as failed:
        client.heartbeat({"schema": 1})

    assert failed.value.status == 500
    assert "Internal Server Error" in str(failed.value)


def test_it_retries_once_after_a_503_then_succeeds(hub, client):
    hub.answer(
        "POST", "device/heartbeat", (503, {"error": "restarting"}), (200, {"state": "online"})
    )

    answer = client.heartbeat({"schema": 1})

    assert answer == {"state": "online"}
    assert len(hub.requests) == 2


def test_a_throttled_worker_waits_as_long_as_the_hub_asks_then_goes_on(hub, client):
    throttled = (429, {"error": "Too many made-up tokens from this address."}, {"Retry-After": "1"})
    hub.answer("POST", "device/heartbeat", throttled, (200, {"state": "online"}))

    started = time.monotonic()
    answer = client.heartbeat({"schema": 1})

    assert answer == {"state": "online"} and len(hub.requests) == 2
    assert time.monotonic() - started >= 1  # not the client's own 0.01 s backoff


def test_a_restarting_hub_is_given_the_time_it_asks_for(hub, client):
    restarting = (503, {"error": "The database is not answering."}, {"Retry-After": "1"})
    hub.answer("GET", "device", restarting, (200, {"name": "edge-1"}))

    started = time.monotonic()
    assert client.whoami() == {"name": "edge-1"}
    assert time.monotonic() - started >= 1


def test_a_worker_throttled_for_longer_says_so(hub):
    throttled = (
        429,
        {"error": "Too many made-up tokens: try again in 600 s."},
        {"Retry-After": "600"},
    )
    hub.answer("GET", "device", throttled)
    client = HubClient(hub.url, TOKEN, timeout=0.2, retries=2, backoff=0.01)

    with pytest.raises(HubError, match="try again in 600 s") as refused:
        client.whoami()

    assert refused.value.status == 429 and len(hub.requests) == 3  # each wait capped at 0.2 s


def test_it_gives_up_after_a_bounded_number_of_503s(hub, client):
    hub.answer("GET", "device", (503, {"error": "still restarting"}))

    with pytest.raises(HubError, match="still restarting"):
        client.whoami()

    assert len(hub.requests) == client.retries + 1


def test_it_says_which_hub_it_cannot_reach(hub):
    hub.close()
    client = HubClient(hub.url, TOKEN, timeout=2, retries=1, backoff=0.01)

    with pytest.raises(HubUnreachable, match=f"cannot reach the hub at {hub.url}"):
        client.whoami()


def test_it_downloads_an_input_and_checks_it(hub, client, tmp_path):
    hub.answer("GET", "jobs/12/inputs/model", (200, MODEL_BYTES))
    dest = tmp_path / "model.onnx"

    path = client.download_input(12, "model", dest, MODEL_SHA256, len(MODEL_BYTES))

    assert path == dest
    assert dest.read_bytes() == MODEL_BYTES


def test_it_rejects_an_input_with_the_wrong_sha256_and_leaves_no_file(hub, client, tmp_path):
    hub.answer("GET", "jobs/12/inputs/model", (200, MODEL_BYTES))
    dest = tmp_path / "model.onnx"

    with pytest.raises(InputMismatch, match="sha256"):
        client.download_input(12, "model", dest, "0" * 64, len(MODEL_BYTES))

    assert not dest.exists()


def test_it_rejects_an_input_of_the_wrong_size_and_leaves_no_file(hub, client, tmp_path):
    hub.answer("GET", "jobs/12/inputs/model", (200, MODEL_BYTES))
    dest = tmp_path / "model.onnx"

    with pytest.raises(InputMismatch, match="larger than the announced 10 bytes"):
        client.download_input(12, "model", dest, MODEL_SHA256, 10)

    assert not dest.exists()


def test_it_uploads_an_artifact_as_multipart(hub, client, tmp_path):
    hub.answer("POST", "jobs/12/artifacts", (200, {"id": 1, "name": "engine", "size": 5}))
    artifact = tmp_path / "model.plan"
    artifact.write_bytes(b"plan!")

    record = client.upload_artifact(12, 3, "engine", artifact)

    assert record["name"] == "engine"
    _, _, headers, body = hub.requests[0]
    assert headers["Content-Type"].startswith("multipart/form-data")
    assert b'name="attempt"\r\n\r\n3' in body
    assert b'name="name"\r\n\r\nengine' in body
    assert b'filename="model.plan"' in body and b"plan!" in body


def test_it_sends_the_whole_file_again_when_an_upload_is_retried(hub, client, tmp_path):
    hub.answer("POST", "jobs/12/artifacts", (502, b"Bad Gateway"), (200, {"id": 1}))
    artifact = tmp_path / "model.plan"
    artifact.write_bytes(b"plan!")

    client.upload_artifact(12, 3, "engine", artifact)

    assert [b"plan!" in body for *_, body in hub.requests] == [True, True]


def test_it_refuses_to_start_the_worker_without_hub_or_token(monkeypatch, capsys):
    from workers.cli import main

    monkeypatch.delenv("DEPLOYHUB_HUB_URL", raising=False)
    monkeypatch.delenv("DEPLOYHUB_DEVICE_TOKEN", raising=False)

    assert main(["run", "--hub", "http://127.0.0.1:9"]) == 2
    assert "--token are required" in capsys.readouterr().err


def test_a_worker_whose_ca_bundle_is_not_there_says_so_and_stops(monkeypatch, capsys):
    from workers.cli import main

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/no/such/bundle.pem")

    assert main(["run", "--hub", "https://hub.example", "--token", "dht_x"]) == 2
    assert "/no/such/bundle.pem" in capsys.readouterr().err


def test_it_stops_the_worker_when_the_hub_refuses_its_token(hub, capsys):
    from workers.cli import main

    hub.answer("GET", "device", (401, {"error": "unknown device token"}))

    assert main(["run", "--hub", hub.url, "--token", "stolen"]) == 2
    assert "the hub refused this token: unknown device token" in capsys.readouterr().err
