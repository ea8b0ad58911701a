"""Running one job attempt against a stand-in hub (the real hub is tested end to end elsewhere)."""

import email
import email.policy
import hashlib
import io
import json
import re
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from onnx import TensorProto, helper

from tests.feeds_models import (
    batch_entry,
    dynamic_height_width,
    fixed_batch_of_two,
    two_in_two_out,
)
from workers import kinds
from workers.backends import known
from workers.backends.base import compat_key, digest
from workers.backends.onnxruntime import OnnxRuntimeBackend
from workers.client import HubClient
from workers.jobs import benchmark as benchmark_job
from workers.measure.feeds import model_io_from_onnx
from workers.runner import run_job
from workers.selftest import write_tiny_model

FINGERPRINT = {"schema": 1, "hostname": "runner-test"}
# What a worker reports with an override (it is not this machine): compile keys must use it.
REPORTED_FINGERPRINT = {
    "schema": 2,
    "hostname": "rehearsal",
    "cpu": {"model": "Xeon", "count": 4, "flags": ["sse4_2", "avx", "avx2"], "isa_level": "avx2"},
    "onnxruntime": {"version": "1.31.0", "providers": ["CPUExecutionProvider"]},
}
ENGINE_ID = 7
STAMPED_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \S")


class FakeHubForRunnerTest:
    """Play the hub's job endpoints for one job, recording what the runner sends."""

    def __init__(self, job, files=None):
        self.job = job
        self.files = files or {}
        self.claim_answer = None  # (status, error) to refuse the claim
        self.heartbeat_answer = None  # (status, error) to refuse heartbeats
        self.complete_answer = None  # (status, error) to refuse the completion
        self.cancel_requested = False
        self.calls = []
        self.artifacts = []  # multipart fields of each upload, the file as bytes
        self.engines = {}  # engine id: its bytes, or (status, payload) to refuse it
        handler = type("Handler", (_JobHandler,), {"hub": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        serve = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)
        serve.start()

    def bodies(self, call):
        """Return the JSON bodies the runner sent to one endpoint (claim, heartbeat, ...)."""
        return [body for name, body in self.calls if name == call]

    def handle(self, method, path, body):
        """Return (status, payload) for a request, as the hub would."""
        if path.startswith("/api/v1/engines/"):
            return self.serve_engine(method, path)
        prefix = f"/api/v1/jobs/{self.job['id']}/"
        call = path.removeprefix(prefix)
        self.calls.append((call.split("/")[0], body))
        if method == "GET" and call.startswith("inputs/"):
            return 200, self.files[call.removeprefix("inputs/")]
        if call == "claim":
            if body["attempt"] != self.job["attempt"]:
                return 409, {"error": "stale attempt"}
            return self.claim_answer or (200, self.job)
        if call == "heartbeat":
            answer = {"lease_expires_at": "2026-11-29T19:45:00Z"}
            return self.heartbeat_answer or (
                200,
                answer | {"cancel_requested": self.cancel_requested},
            )
        if call == "complete":
            return self.complete_answer or (200, {})
        if call == "artifacts":
            self.artifacts.append(body)
            sha256 = hashlib.sha256(body["file"]).hexdigest()
            stored = {"id": len(self.artifacts), "name": body["name"], "sha256": sha256}
            return 200, stored | {"size": len(body["file"])}
        return 404, {"error": f"no route for {method} {path}"}

    def serve_engine(self, method, path):
        """Answer GET engines/<id>/download with the engine, or the refusal set for it."""
        self.calls.append(("engine_download", None))
        match = re.fullmatch(r"/api/v1/engines/(\d+)/download", path)
        answer = self.engines.get(int(match.group(1))) if match and method == "GET" else None
        if answer is None:
            return 404, {"error": f"no route for {method} {path}"}
        return answer if isinstance(answer, tuple) else (200, answer)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class _JobHandler(BaseHTTPRequestHandler):
    hub = None

    def do_GET(self):
        self._answer(None)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length)
        content_type = self.headers.get("Content-Type", "")
        if content_type.startswith("multipart/form-data"):
            self._answer(_multipart_fields(content_type, data))
        else:
            self._answer(json.loads(data or b"{}"))

    def _answer(self, body):
        status, payload = self.hub.handle(self.command, self.path, body)
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def _multipart_fields(content_type, data):
    """Return a multipart body's fields as {name: text}, files as {name: bytes}."""
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    message = email.message_from_bytes(head + data, policy=email.policy.HTTP)
    fields = {}
    for part in message.iter_parts():
        value = part.get_payload(decode=True)
        name = part.get_param("name", header="content-disposition")
        fields[name] = value if part.get_filename() else value.decode()
    return fields


def sent_job_log(hub, completion):
    """Return the job log as the hub got it: heartbeats send lines so far, completion the rest."""
    return "".join(beat.get("log") or "" for beat in hub.bodies("heartbeat")) + completion["log"]


def make_job(kind=kinds.NOOP, attempt=2, lease_seconds=30, params=None, inputs=None):
    return {
        "id": 12,
        "kind": kind,
        "attempt": attempt,
        "params": params or {},
        "lease_seconds": lease_seconds,
        "lease_expires_at": "2026-11-29T19:45:00Z",
        "inputs": inputs or {},
    }


def model_input(data, sha256=None, filename="model.onnx"):
    return {
        "url": "/api/v1/jobs/12/inputs/model",
        "sha256": sha256 or hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "filename": filename,
    }


@pytest.fixture
def tiny_model(tmp_path):
    return write_tiny_model(tmp_path / "tiny.onnx").read_bytes()


@pytest.fixture
def small_pt2(tmp_path):
    """A Linear + ReLU torch.export program, as the bytes of its .pt2."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    path = tmp_path / "small.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(1, 4),)), path)
    return path.read_bytes()


@pytest.fixture
def start_hub():
    hubs = []

    def start(job, files=None):
        hubs.append(FakeHubForRunnerTest(job, files))
        return hubs[-1]

    yield start
    for hub in hubs:
        hub.close()


def run(hub, attempt=2, fingerprint=FINGERPRINT, **kwargs):
    client = HubClient(hub.url, "token", timeout=5, backoff=0.01)
    return run_job(client, hub.job["id"], attempt, fingerprint=fingerprint, **kwargs)


class HubSigningKey:
    """An Ed25519 key pair playing the hub's engine signing key."""

    def __init__(self):
        self.private = Ed25519PrivateKey.generate()
        raw = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public_hex = raw.hex()

    def sign(self, sha256_hex):
        return self.private.sign(sha256_hex.encode()).hex()


@pytest.fixture
def hub_key():
    return HubSigningKey()


@pytest.fixture
def tiny_engine(tiny_model, tmp_path):
    """The tiny model compiled by the onnxruntime backend (level all, CPU), as bytes."""
    source = tmp_path / "engine-source.onnx"
    source.write_bytes(tiny_model)
    build = tmp_path / "engine-build"
    build.mkdir()
    built = OnnxRuntimeBackend().compile(source, {"optimization_level": "all"}, build)
    return built.artifact.read_bytes()


def engine_input(
    data, key, backend="onnxruntime", build_config=None, signature=None, engine_id=ENGINE_ID
):
    sha256 = hashlib.sha256(data).hexdigest()
    return {
        "url": f"/api/v1/engines/{engine_id}/download",
        "id": engine_id,
        "sha256": sha256,
        "size": len(data),
        "signature": signature or key.sign(sha256),
        "backend": backend,
        "build_config": build_config or {"optimization_level": "all"},
        "compat_key": "onnxruntime:" + "0" * 64,
        "filename": f"engine-{engine_id}",
    }


@pytest.fixture
def benchmark_calls(monkeypatch):
    """Record every benchmark the runner starts (the model path it would load)."""
    calls = []
    real = benchmark_job.benchmark_onnxruntime

    def recording(model_path, *args, **kwargs):
        calls.append(model_path)
        return real(model_path, *args, **kwargs)

    monkeypatch.setattr(benchmark_job, "benchmark_onnxruntime", recording)
    return calls


def engine_benchmark(engine_bytes, key, **input_fields):
    inputs = {"engine": engine_input(engine_bytes, key, **input_fields)}
    return make_job(
        kinds.BENCHMARK, params={"warmup_iterations": 2, "iterations": 20}, inputs=inputs
    )


def test_it_claims_and_completes_a_noop_job(start_hub):
    hub = start_hub(make_job(kinds.NOOP, attempt=2))

    state = run(hub, attempt=2)

    assert state == "succeeded"
    assert hub.bodies("claim") == [{"attempt": 2}]
    [completion] = hub.bodies("complete")
    assert completion["attempt"] == 2
    assert completion["state"] == "succeeded"
    assert completion["result"] == {}
    lines = completion["log"].splitlines()
    assert lines and all(STAMPED_LINE.match(line) for line in lines)
    assert "claimed job 12 attempt 2" in completion["log"]


def test_it_drops_a_message_the_hub_refuses_to_claim(start_hub):
    hub = start_hub(make_job(kinds.NOOP, attempt=3))

    state = run(hub, attempt=2)

    assert state == "dropped"
    assert [name for name, _ in hub.calls] == ["claim"]


def test_it_fails_a_job_of_a_kind_it_cannot_run(start_hub):
    hub = start_hub(make_job("teleport", inputs={"model": model_input(b"x")}), {"model": b"x"})

    state = run(hub)

    assert state == "failed"
    [completion] = hub.bodies("complete")
    assert completion["error"] == "this worker cannot run jobs of kind 'teleport'"
    assert "result" not in completion
    assert hub.bodies("inputs") == []


def test_it_benchmarks_a_downloaded_model_with_heartbeats(start_hub, tiny_model, tmp_path):
    job = make_job(
        kinds.BENCHMARK,
        lease_seconds=0.12,
        params={"iterations": 60_000, "batch_size": 2},
        inputs={"model": model_input(tiny_model)},
    )
    hub = start_hub(job, {"model": tiny_model})
    workdir = tmp_path / "work"

    state = run(hub, workdir_root=workdir)

    assert state == "succeeded"
    assert len(hub.bodies("inputs")) == 1
    heartbeats = hub.bodies("heartbeat")
    assert heartbeats and all(beat["attempt"] == 2 for beat in heartbeats)
    assert any(0 < beat["progress"] < 1 and beat["message"] for beat in heartbeats)
    [completion] = hub.bodies("complete")
    result = completion["result"]
    assert result["batch_size"] == 2 and result["iterations"] == 60_000
    assert result["latency_ms"]["p50"] > 0
    assert result["fingerprint"] == FINGERPRINT
    sent_log = sent_job_log(hub, completion)
    assert "input model verified" in sent_log and "benchmark done" in sent_log
    assert sent_log.count("measuring\n") == 1
    assert list(workdir.iterdir()) == []


def test_it_reports_progress_within_a_second_even_with_a_long_lease(start_hub, tiny_model):
    job = make_job(
        kinds.BENCHMARK,
        lease_seconds=300,  # a heartbeat every 100 s: progress must not wait for it
        params={"iterations": 10_000_000},
        inputs={"model": model_input(tiny_model)},
    )
    hub = start_hub(job, {"model": tiny_model})
    worker = threading.Thread(target=run, args=(hub,), daemon=True)
    worker.start()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not any(
        0 < beat.get("progress", 0) < 1 for beat in hub.bodies("heartbeat")
    ):
        time.sleep(0.05)
    hub.cancel_requested = True
    worker.join(timeout=10)

    assert any(0 < beat["progress"] < 1 for beat in hub.bodies("heartbeat"))
    assert hub.bodies("complete")[0]["state"] == "cancelled"


def test_it_fails_a_job_whose_input_does_not_match_its_sha256(start_hub, tiny_model, tmp_path):
    job = make_job(kinds.BENCHMARK, inputs={"model": model_input(tiny_model, sha256="0" * 64)})
    hub = start_hub(job, {"model": tiny_model})
    workdir = tmp_path / "work"

    state = run(hub, workdir_root=workdir)

    assert state == "failed"
    [completion] = hub.bodies("complete")
    assert "sha256" in completion["error"] and "announced" in completion["error"]
    assert "Traceback" in completion["log"]
    assert list(workdir.iterdir()) == []


def test_it_fails_with_one_line_and_the_traceback_when_the_model_is_broken(start_hub):
    junk = b"this is not an onnx model"
    hub = start_hub(make_job(kinds.BENCHMARK, inputs={"model": model_input(junk)}), {"model": junk})

    state = run(hub)

    assert state == "failed"
    [completion] = hub.bodies("complete")
    assert "\n" not in completion["error"] and completion["error"]
    assert "Traceback (most recent call last)" in completion["log"]


def test_it_cancels_when_the_hub_asks_in_a_heartbeat(start_hub, tiny_model):
    job = make_job(
        kinds.BENCHMARK,
        lease_seconds=0.3,
        params={"iterations": 10_000_000},
        inputs={"model": model_input(tiny_model)},
    )
    hub = start_hub(job, {"model": tiny_model})
    hub.cancel_requested = True
    started = time.monotonic()

    state = run(hub)

    assert state == "cancelled"
    assert time.monotonic() - started < 5
    [completion] = hub.bodies("complete")
    assert completion["state"] == "cancelled"
    assert "result" not in completion


def test_it_stops_quietly_when_a_heartbeat_says_the_job_moved_on(start_hub, tiny_model):
    job = make_job(
        kinds.BENCHMARK,
        lease_seconds=0.3,
        params={"iterations": 10_000_000},
        inputs={"model": model_input(tiny_model)},
    )
    hub = start_hub(job, {"model": tiny_model})
    hub.heartbeat_answer = (409, {"error": "attempt 2 is stale"})

    state = run(hub)

    assert state == "dropped"
    assert hub.bodies("complete") == []


def test_it_stops_when_a_heartbeat_says_the_device_was_revoked(start_hub, tiny_model):
    job = make_job(
        kinds.BENCHMARK,
        lease_seconds=0.3,
        params={"iterations": 10_000_000},
        inputs={"model": model_input(tiny_model)},
    )
    hub = start_hub(job, {"model": tiny_model})
    hub.heartbeat_answer = (401, {"error": "This device was revoked at 2026-12-05 08:00 UTC."})
    started = time.monotonic()

    state = run(hub)

    assert state == "dropped"  # its job went back on the queue: nothing is reported
    assert hub.bodies("complete") == []
    assert time.monotonic() - started < 60  # stopped: not the ten million iterations


def test_it_returns_dropped_when_the_hub_refuses_the_completion(start_hub):
    hub = start_hub(make_job(kinds.NOOP))
    hub.complete_answer = (409, {"error": "attempt 2 is stale"})

    assert run(hub) == "dropped"
    assert len(hub.bodies("complete")) == 1


def test_it_refuses_an_input_name_that_would_leave_the_job_folder(start_hub, tmp_path):
    job = make_job(kinds.BENCHMARK, inputs={"../escape": model_input(b"x")})
    hub = start_hub(job, {"../escape": b"x"})

    state = run(hub, workdir_root=tmp_path / "work")

    assert state == "failed"
    assert "'../escape'" in hub.bodies("complete")[0]["error"]
    assert hub.bodies("inputs") == []
    assert not (tmp_path / "escape").exists()


def test_it_exports_a_pt2_to_onnx_and_uploads_it(start_hub, small_pt2, tmp_path):
    job = make_job(
        kinds.EXPORT,
        params={"input_shapes": {"input": [1, 4]}, "opset": 17},
        inputs={"model": model_input(small_pt2, filename="small.pt2")},
    )
    hub = start_hub(job, {"model": small_pt2})
    workdir = tmp_path / "work"

    state = run(hub, workdir_root=workdir)

    assert state == "succeeded"
    [upload] = hub.artifacts
    assert upload["attempt"] == "2" and upload["name"] == "onnx"
    [graph_input] = onnx.load_model_from_string(upload["file"]).graph.input
    assert graph_input.name == "input"
    [completion] = hub.bodies("complete")
    result = completion["result"]
    assert result["artifact"] == "onnx"
    assert result["artifact_sha256"] == hashlib.sha256(upload["file"]).hexdigest()
    assert result["onnx_bytes"] == len(upload["file"])
    assert 0 <= result["max_abs_diff"] < 1e-4
    assert result["input_shapes"] == {"input": [1, 4]} and result["opset"] == 17
    assert "artifact onnx uploaded" in completion["log"]
    assert list(workdir.iterdir()) == []


def test_it_fails_an_export_of_a_file_that_is_not_a_pt2_without_uploading(start_hub):
    junk = b"this is not a torch.export program"
    job = make_job(
        kinds.EXPORT,
        params={"input_shapes": {"input": [1, 4]}},
        inputs={"model": model_input(junk, filename="model.pt2")},
    )
    hub = start_hub(job, {"model": junk})

    state = run(hub)

    assert state == "failed"
    [completion] = hub.bodies("complete")
    assert completion["error"].startswith("model.pt2 is not a PyTorch export program")
    assert hub.artifacts == []


def test_it_compiles_a_model_with_onnxruntime_and_uploads_the_engine(
    start_hub, tiny_model, tmp_path
):
    build_config = {"optimization_level": "all", "provider": "CPUExecutionProvider"}
    job = make_job(
        kinds.COMPILE,
        params={"backend": "onnxruntime", "build_config": build_config},
        inputs={"model": model_input(tiny_model)},
    )
    hub = start_hub(job, {"model": tiny_model})
    workdir = tmp_path / "work"

    state = run(hub, fingerprint=REPORTED_FINGERPRINT, workdir_root=workdir)

    assert state == "succeeded"
    [upload] = hub.artifacts
    assert upload["attempt"] == "2" and upload["name"] == "engine"
    assert onnxruntime.InferenceSession(upload["file"]).get_inputs()[0].name == "x"
    [completion] = hub.bodies("complete")
    result = completion["result"]
    fields = OnnxRuntimeBackend.compat_fields(REPORTED_FINGERPRINT, build_config)
    assert fields["onnxruntime"] == "1.31.0" and fields["cpu_isa"] == "avx2"
    assert result["compat_fields"] == fields
    assert result["compat_key"] == compat_key("onnxruntime", fields)
    canonical = {**build_config, "precision": "fp32"}  # as the backend builds it: defaults filled
    assert result["config_digest"] == digest(canonical)
    assert result["fingerprint"] == REPORTED_FINGERPRINT
    assert result["backend"] == "onnxruntime" and result["build_config"] == canonical
    assert result["tool_versions"] == {"onnxruntime": onnxruntime.__version__}
    assert result["build_seconds"] > 0 and "graph optimisation level all" in result["build_log"]
    assert result["artifact"] == "engine"
    assert result["artifact_sha256"] == hashlib.sha256(upload["file"]).hexdigest()
    assert result["timing_cache_sha256"] is None
    assert "artifact engine uploaded" in completion["log"]
    assert list(workdir.iterdir()) == []


def test_it_zips_an_engine_whose_model_has_external_data(start_hub, tmp_path):
    model = onnx.load(str(write_tiny_model(tmp_path / "big.onnx", features=64)))
    onnx.save(model, str(tmp_path / "big.onnx"), save_as_external_data=True, location="w.bin")
    upload_zip = io.BytesIO()
    with zipfile.ZipFile(upload_zip, "w") as archive:
        archive.write(tmp_path / "big.onnx", "big.onnx")
        archive.write(tmp_path / "w.bin", "w.bin")
    data = upload_zip.getvalue()
    job = make_job(
        kinds.COMPILE,
        params={"backend": "onnxruntime"},
        inputs={"model": model_input(data, filename="big.zip")},
    )
    hub = start_hub(job, {"model": data})

    state = run(hub)

    assert state == "succeeded", hub.bodies("complete")[0].get("error")
    [upload] = hub.artifacts
    with zipfile.ZipFile(io.BytesIO(upload["file"])) as engine:
        assert sorted(engine.namelist()) == ["engine.onnx", "engine.onnx.data"]
    assert hub.bodies("complete")[0]["result"]["artifact_sha256"] == (
        hashlib.sha256(upload["file"]).hexdigest()
    )


@pytest.mark.skipif(known.get("tensorrt").available(), reason="TensorRT is installed here")
def test_it_fails_a_compile_for_a_missing_runtime_at_once(start_hub, tiny_model):
    job = make_job(
        kinds.COMPILE,
        params={"backend": "tensorrt", "build_config": {"precision": "fp16"}},
        inputs={"model": model_input(tiny_model)},
    )
    hub = start_hub(job, {"model": tiny_model})

    state = run(hub)

    assert state == "failed"
    [completion] = hub.bodies("complete")
    assert "install deployhub[tensorrt]" in completion["error"]
    assert hub.bodies("inputs") == [] and hub.artifacts == []


def test_it_fails_a_compile_with_a_config_the_backend_cannot_build(start_hub, tiny_model):
    job = make_job(
        kinds.COMPILE,
        params={"backend": "onnxruntime", "build_config": {"optimization_level": "max"}},
        inputs={"model": model_input(tiny_model)},
    )
    hub = start_hub(job, {"model": tiny_model})

    assert run(hub) == "failed"
    assert "optimization_level 'max'" in hub.bodies("complete")[0]["error"]
    assert hub.bodies("inputs") == []


DEMO_ASSETS = Path(__file__).resolve().parent.parent / "deployhub" / "demo" / "assets"


def file_input(name, data, filename):
    return {
        "url": f"/api/v1/jobs/12/inputs/{name}",
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "filename": filename,
    }


def unsupported_operator_model(path):
    """Write an ONNX model ONNX Runtime has no kernel for: Abs on bfloat16, node 'the_abs'."""
    graph = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["y"], name="the_abs")],
        "unsupported",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [1, 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path.read_bytes()


def test_it_compiles_int8_with_the_calibration_input_and_reports_the_graph(start_hub):
    model = (DEMO_ASSETS / "digits_cnn_v2.onnx").read_bytes()
    calibration = (DEMO_ASSETS / "calibration.npz").read_bytes()
    build_config = {"precision": "int8", "calibration_samples": 20}
    job = make_job(
        kinds.COMPILE,
        params={"backend": "onnxruntime", "build_config": build_config},
        inputs={
            "model": model_input(model),
            "calibration": file_input("calibration", calibration, "calibration.npz"),
        },
    )
    hub = start_hub(job, {"model": model, "calibration": calibration})

    state = run(hub, fingerprint=REPORTED_FINGERPRINT)

    assert state == "succeeded", hub.bodies("complete")[0].get("error")
    assert len(hub.bodies("inputs")) == 2
    [upload] = hub.artifacts
    ops = {node.op_type for node in onnx.load_model_from_string(upload["file"]).graph.node}
    assert "QLinearConv" in ops
    [completion] = hub.bodies("complete")
    result = completion["result"]
    assert result["compat_fields"]["cpu_vnni"] is False  # the reported CPU is AVX2 only
    assert result["graph_report"]["before"]["operators"]["BatchNormalization"] == 3
    assert "calibration: 20 samples of image" in result["build_log"]
    sent_log = sent_job_log(hub, completion)
    assert "the build gets the calibration input" in sent_log and "first load" in sent_log


def test_it_fails_a_compile_with_the_category_and_node_first(start_hub, tmp_path):
    model = unsupported_operator_model(tmp_path / "abs.onnx")
    job = make_job(
        kinds.COMPILE,
        params={"backend": "onnxruntime", "build_config": {}},
        inputs={"model": model_input(model)},
    )
    hub = start_hub(job, {"model": model})

    state = run(hub)

    assert state == "failed"
    [completion] = hub.bodies("complete")
    assert completion["error"].startswith("unsupported_operator: ")
    assert completion["failure_category"] == "unsupported_operator"
    assert "node with name 'the_abs'" in completion["error"] and "\n" not in completion["error"]
    assert "--- log of the child process ---" in completion["log"]
    assert "Traceback (most recent call last)" in completion["log"]
    assert hub.artifacts == []


def test_it_refuses_a_compile_time_limit_that_is_not_a_positive_number(start_hub, tiny_model):
    job = make_job(
        kinds.COMPILE,
        params={"backend": "onnxruntime", "timeout_seconds": 0},
        inputs={"model": model_input(tiny_model)},
    )
    hub = start_hub(job, {"model": tiny_model})

    assert run(hub) == "failed"
    assert "timeout_seconds" in hub.bodies("complete")[0]["error"]
    assert hub.bodies("inputs") == []


def test_it_benchmarks_an_engine_after_checking_its_signature(
    start_hub, tiny_engine, hub_key, benchmark_calls
):
    hub = start_hub(engine_benchmark(tiny_engine, hub_key))
    hub.engines[ENGINE_ID] = tiny_engine

    state = run(hub, signing_public_key=hub_key.public_hex)

    assert state == "succeeded", hub.bodies("complete")[0].get("error")
    assert len(hub.bodies("engine_download")) == 1 and hub.bodies("inputs") == []
    [completion] = hub.bodies("complete")
    result = completion["result"]
    assert result["iterations"] == 20 and result["latency_ms"]["p50"] > 0
    assert result["provider"] == "CPUExecutionProvider"
    assert "engine 7 signature verified" in sent_job_log(hub, completion)
    assert len(benchmark_calls) == 1


def test_it_benchmarks_a_zipped_engine_with_external_data(start_hub, hub_key, tmp_path):
    source = write_tiny_model(tmp_path / "big.onnx", features=64)
    onnx.save(onnx.load(str(source)), str(source), save_as_external_data=True, location="w.bin")
    build = tmp_path / "build"
    build.mkdir()
    engine = OnnxRuntimeBackend().compile(source, {}, build).artifact.read_bytes()
    hub = start_hub(engine_benchmark(engine, hub_key))
    hub.engines[ENGINE_ID] = engine

    state = run(hub, signing_public_key=hub_key.public_hex)

    assert state == "succeeded", hub.bodies("complete")[0].get("error")
    assert zipfile.is_zipfile(io.BytesIO(engine))


def test_it_refuses_an_engine_with_a_flipped_byte_without_loading_it(
    start_hub, tiny_engine, hub_key, benchmark_calls, tmp_path
):
    hub = start_hub(engine_benchmark(tiny_engine, hub_key))
    flipped = bytearray(tiny_engine)
    flipped[len(flipped) // 2] ^= 0x01
    hub.engines[ENGINE_ID] = bytes(flipped)
    workdir = tmp_path / "work"

    state = run(hub, signing_public_key=hub_key.public_hex, workdir_root=workdir)

    assert state == "failed"
    assert "sha256 does not match" in hub.bodies("complete")[0]["error"]
    assert benchmark_calls == []
    assert list(workdir.iterdir()) == []


def test_it_refuses_an_engine_the_hub_did_not_sign(
    start_hub, tiny_engine, hub_key, benchmark_calls
):
    forged = HubSigningKey().sign(hashlib.sha256(tiny_engine).hexdigest())
    hub = start_hub(engine_benchmark(tiny_engine, hub_key, signature=forged))
    hub.engines[ENGINE_ID] = tiny_engine

    state = run(hub, signing_public_key=hub_key.public_hex)

    assert state == "failed"
    assert hub.bodies("complete")[0]["error"] == (
        "the engine's signature does not verify: refusing to load it"
    )
    assert benchmark_calls == []


def test_it_fails_with_the_hubs_reason_when_the_engine_does_not_fit_this_device(
    start_hub, tiny_engine, hub_key, benchmark_calls
):
    reason = "This engine was built for another toolchain: onnxruntime 1.32.0 ≠ 1.31.0"
    hub = start_hub(engine_benchmark(tiny_engine, hub_key))
    hub.engines[ENGINE_ID] = (409, {"error": reason, "differences": {"onnxruntime": ["a", "b"]}})

    state = run(hub, signing_public_key=hub_key.public_hex)

    assert state == "failed"
    assert hub.bodies("complete")[0]["error"] == reason
    assert benchmark_calls == []


def test_it_will_not_load_an_engine_without_the_hubs_public_key(start_hub, tiny_engine, hub_key):
    hub = start_hub(engine_benchmark(tiny_engine, hub_key))
    hub.engines[ENGINE_ID] = tiny_engine

    state = run(hub, signing_public_key=None)

    assert state == "failed"
    assert "signing_public_key" in hub.bodies("complete")[0]["error"]
    assert hub.bodies("engine_download") == []


@pytest.mark.skipif(known.get("tensorrt").available(), reason="TensorRT is installed here")
def test_it_fails_a_benchmark_of_an_engine_whose_runtime_it_lacks(start_hub, hub_key):
    hub = start_hub(engine_benchmark(b"plan", hub_key, backend="tensorrt", build_config={}))
    hub.engines[ENGINE_ID] = b"plan"

    state = run(hub, signing_public_key=hub_key.public_hex)

    assert state == "failed"
    assert "install deployhub[tensorrt]" in hub.bodies("complete")[0]["error"]
    assert hub.bodies("engine_download") == []


def test_it_refuses_to_benchmark_an_engine_on_another_provider(start_hub, tiny_engine, hub_key):
    job = engine_benchmark(tiny_engine, hub_key)
    job["params"]["provider"] = "CUDAExecutionProvider"
    hub = start_hub(job)
    hub.engines[ENGINE_ID] = tiny_engine

    assert run(hub, signing_public_key=hub_key.public_hex) == "failed"
    assert "built for CPUExecutionProvider" in hub.bodies("complete")[0]["error"]


def test_it_times_two_engines_of_different_backends_side_by_side(
    start_hub, tiny_model, tiny_engine, hub_key, tmp_path
):
    from workers.backends.openvino import OpenVinoBackend

    source = tmp_path / "ov-source.onnx"
    source.write_bytes(tiny_model)
    build = tmp_path / "ov-build"
    build.mkdir()
    openvino_config = {"device": "CPU", "precision": "f32"}
    openvino_engine = OpenVinoBackend().compile(source, openvino_config, build).artifact
    openvino_bytes = openvino_engine.read_bytes()
    inputs = {
        "engine-7": engine_input(tiny_engine, hub_key),
        "engine-8": engine_input(openvino_bytes, hub_key, "openvino", openvino_config, engine_id=8),
        "model": model_input(tiny_model),
    }
    params = {"engines": [7, 8], "rounds": 2, "duration_s": 0.2, "warmup_s": 0}
    hub = start_hub(make_job(kinds.COMPARE, params=params, inputs=inputs), {"model": tiny_model})
    hub.engines.update({7: tiny_engine, 8: openvino_bytes})

    state = run(hub, signing_public_key=hub_key.public_hex)

    [completion] = hub.bodies("complete")
    assert state == "succeeded", completion.get("error")
    result = completion["result"]
    assert {figures["engine"] for figures in result["engines"]} == {"7", "8"}
    assert result["fastest"] in ("7", "8") and result["fingerprint"] == FINGERPRINT
    # A heartbeat sends the lines logged so far, the completion the rest.
    sent_log = sent_job_log(hub, completion)
    assert "engine 7 signature verified" in sent_log
    assert "engine 8 signature verified" in sent_log
    assert "fastest: engine" in sent_log


def test_it_refuses_a_compare_job_when_one_engine_was_tampered_with(
    start_hub, tiny_engine, hub_key
):
    tampered = bytes([tiny_engine[0] ^ 1]) + tiny_engine[1:]
    other = engine_input(tiny_engine, hub_key, engine_id=8)
    other["sha256"] = hashlib.sha256(tampered).hexdigest()  # honest size and sha256, no signature
    inputs = {"engine-7": engine_input(tiny_engine, hub_key), "engine-8": other}
    params = {"engines": [7, 8]}
    hub = start_hub(make_job(kinds.COMPARE, params=params, inputs=inputs))
    hub.engines.update({7: tiny_engine, 8: tampered})

    state = run(hub, signing_public_key=hub_key.public_hex)

    assert state == "failed"
    assert "signature" in hub.bodies("complete")[0]["error"]


def test_it_benchmarks_at_the_shapes_of_the_model_io_the_claim_carries(start_hub, tmp_path):
    model = dynamic_height_width(tmp_path / "hw.onnx")
    hw = {"2": {"min": 8, "opt": 16, "max": 32}, "3": {"min": 8, "opt": 12, "max": 32}}
    contract = {"inputs": {"x": batch_entry(["batch", 3, "H", "W"], {"sizes": [2, 4]}, hw)}}
    inputs = {"model": model_input(model.read_bytes())}
    job = make_job(kinds.BENCHMARK, params={"iterations": 20}, inputs=inputs)
    job["model_io"] = {**model_io_from_onnx(model), "contract": contract}
    hub = start_hub(job, {"model": model.read_bytes()})

    state = run(hub)

    [completion] = hub.bodies("complete")
    assert state == "succeeded", completion.get("error")
    assert completion["result"]["batch_size"] == 2 and completion["result"]["iterations"] == 20


def test_it_calibrates_an_int8_build_on_every_input_the_claim_names(start_hub, tmp_path):
    model = two_in_two_out(tmp_path / "two.onnx").read_bytes()
    buffer = io.BytesIO()
    np.savez(buffer, a=np.ones((6, 8), np.float32), b=np.zeros((6, 8), np.float32))
    build_config = {"precision": "int8", "calibration_samples": 4}
    job = make_job(
        kinds.COMPILE,
        params={"backend": "onnxruntime", "build_config": build_config},
        inputs={
            "model": model_input(model),
            "calibration": file_input("calibration", buffer.getvalue(), "calibration.npz"),
        },
    )
    job["model_io"] = model_io_from_onnx(tmp_path / "two.onnx")
    hub = start_hub(job, {"model": model, "calibration": buffer.getvalue()})

    state = run(hub)

    [completion] = hub.bodies("complete")
    assert state == "succeeded", completion.get("error")
    assert "calibration: 4 samples of a, b" in completion["result"]["build_log"]


def test_it_keeps_every_line_of_an_onnx_runtime_error_in_the_job_error(start_hub, tmp_path):
    model = fixed_batch_of_two(tmp_path / "b2.onnx")
    inputs = {"model": model_input(model.read_bytes())}
    job = make_job(kinds.BENCHMARK, params={"iterations": 5}, inputs=inputs)
    # A signature that disagrees with the file (batch symbolic, the file fixes 2).
    job["model_io"] = {"inputs": [{"name": "x", "dtype": "float", "shape": ["N", 8]}]}
    hub = start_hub(job, {"model": model.read_bytes()})

    state = run(hub)

    [completion] = hub.bodies("complete")
    assert state == "failed"
    assert "for the following indices" in completion["error"]
    assert "Got: 1 Expected: 2" in completion["error"] and "\n" not in completion["error"]
