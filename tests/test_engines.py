"""The engine store through the device protocol: build once, serve where it runs, go stale."""

import copy
import hashlib
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.benchmarks.pages import PAGE_RUNS
from deployhub.devices.models import FingerprintChange
from deployhub.engines import signing
from deployhub.engines.actions import request_compile, stored_file_intact
from deployhub.engines.models import Engine, TimingCache
from deployhub.jobs.models import Job, JobKind
from tests.api_calls import call, token_for
from tests.benchmark_results import OLD_RESULT, details_of, record_run
from tests.compile_jobs import CONFIG, ENGINE_BYTES, FINGERPRINT, build, compile_
from tests.conftest import PASSWORD
from workers.backends.base import digest


def other_ort(fingerprint=FINGERPRINT, version="1.31.0"):
    changed = copy.deepcopy(fingerprint)
    changed["onnxruntime"]["version"] = version
    return changed


@pytest.fixture
def device_a(make_device, client):
    device, token = make_device("a")
    call(client, token, "device/heartbeat", {"fingerprint": FINGERPRINT})
    return device, token


def test_a_compile_stores_a_signed_engine_and_a_repeat_reuses_it(
    client, version, device_class, alice, device_a
):
    _, token = device_a
    engine, job = compile_(version, device_class, alice)
    assert engine is None and job.kind == JobKind.COMPILE
    assert build(client, job, token).status_code == 200
    engine = Engine.objects.get()
    assert engine.sha256 == hashlib.sha256(ENGINE_BYTES).hexdigest()
    assert engine.compat_fields["onnxruntime"] == "1.32.0"
    assert signing.verify(engine.sha256, engine.signature)
    assert stored_file_intact(engine)
    again, no_job = compile_(version, device_class, alice)
    assert again == engine and no_job is None
    assert Job.objects.filter(kind=JobKind.COMPILE).count() == 1


def test_the_ui_says_a_compile_was_answered_from_the_store(
    client, version, device_class, alice, device_a
):
    _, token = device_a
    build(client, compile_(version, device_class, alice)[1], token)
    client.login(username="alice", password=PASSWORD)
    response = client.post(
        f"/versions/{version.pk}/compile",
        {
            "device_class": device_class.pk,
            "backend": "onnxruntime",
            "build_config": json.dumps(CONFIG),
        },
        follow=True,
    )
    assert "Reused" in response.content.decode()
    assert Job.objects.filter(kind=JobKind.COMPILE).count() == 1


def test_only_a_device_with_the_same_toolchain_downloads_the_engine(
    client, version, device_class, alice, device_a, make_device
):
    _, token_a = device_a
    build(client, compile_(version, device_class, alice)[1], token_a)
    engine = Engine.objects.get()
    _, token_b = make_device("b")
    call(client, token_b, "device/heartbeat", {"fingerprint": other_ort()})
    ok = call(client, token_a, f"engines/{engine.pk}/download", method="get")
    assert ok.status_code == 200 and b"".join(ok.streaming_content) == ENGINE_BYTES
    refused = call(client, token_b, f"engines/{engine.pk}/download", method="get")
    assert refused.status_code == 409
    assert refused.json()["differences"] == {"onnxruntime": ["1.32.0", "1.31.0"]}
    assert "1.32.0" in refused.json()["error"] and "1.31.0" in refused.json()["error"]


def test_a_fingerprint_change_is_kept_readably_and_marks_engines_stale(
    client, version, device_class, alice, device_a
):
    device, token = device_a
    build(client, compile_(version, device_class, alice)[1], token)
    call(client, token, "device/heartbeat", {"fingerprint": other_ort(version="1.33.0")})
    change = FingerprintChange.objects.get(device=device)
    assert any("1.32.0" in line and "1.33.0" in line for line in change.summary)
    engine = Engine.objects.get()
    assert engine.status == "stale" and "1.33.0" in engine.status_reason
    client.login(username="alice", password=PASSWORD)
    page = client.get(f"/devices/{device.pk}/").content.decode()
    assert "1.33.0" in page and "1.32.0" in page


def test_a_rebuild_after_the_change_produces_a_new_engine(
    client, version, device_class, alice, device_a
):
    device, token = device_a
    build(client, compile_(version, device_class, alice)[1], token)
    call(client, token, "device/heartbeat", {"fingerprint": other_ort(version="1.33.0")})
    client.login(username="alice", password=PASSWORD)
    client.post(f"/engines/{Engine.objects.get().pk}/rebuild")
    job = Job.objects.filter(kind=JobKind.COMPILE).latest("id")
    assert job.state == "queued" and job.params["backend"] == "onnxruntime"


def test_a_class_set_to_auto_rebuild_queues_the_rebuild_itself(
    client, version, device_class, alice, device_a
):
    device_class.auto_rebuild = True
    device_class.save()
    _, token = device_a
    build(client, compile_(version, device_class, alice)[1], token)
    call(client, token, "device/heartbeat", {"fingerprint": other_ort(version="1.33.0")})
    assert Job.objects.filter(kind=JobKind.COMPILE, state="queued").count() == 1


def test_a_timing_cache_goes_to_the_next_build_on_a_matching_device(
    client, version, device_class, alice, device_a
):
    _, token = device_a
    build(client, compile_(version, device_class, alice)[1], token, timing_cache=b"tactics")
    cache = TimingCache.objects.get()
    assert cache.device_class == device_class
    Engine.objects.all().delete()
    _, job = compile_(version, device_class, alice)
    claimed = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1}).json()
    assert claimed["inputs"]["timing_cache"]["sha256"] == cache.sha256
    served = call(client, token, f"jobs/{job.pk}/inputs/timing_cache", method="get")
    assert b"".join(served.streaming_content) == b"tactics"


def test_the_version_page_shows_the_compatibility_matrix(
    client, version, device_class, alice, device_a, make_device
):
    _, token = device_a
    build(client, compile_(version, device_class, alice)[1], token)
    _, token_b = make_device("b")
    call(client, token_b, "device/heartbeat", {"fingerprint": other_ort()})
    client.login(username="alice", password=PASSWORD)
    page = client.get(version.get_absolute_url()).content.decode()
    assert "Compatibility on" in page and ">runs<" in page and "1.31.0" in page


def test_a_flipped_byte_in_the_store_is_detected(client, version, device_class, alice, device_a):
    _, token = device_a
    build(client, compile_(version, device_class, alice)[1], token)
    engine = Engine.objects.get()
    data = bytearray(open(engine.file.path, "rb").read())
    data[3] ^= 0x01
    open(engine.file.path, "wb").write(bytes(data))
    assert not stored_file_intact(engine)


def test_a_build_config_the_backend_cannot_build_is_refused_up_front(
    client, version, device_class, alice
):
    client.login(username="alice", password=PASSWORD)
    response = client.post(
        f"/versions/{version.pk}/compile",
        {
            "device_class": device_class.pk,
            "backend": "onnxruntime",
            "build_config": json.dumps({"optimization_level": "max"}),
        },
        follow=True,
    )
    assert "optimization_level" in response.content.decode()
    assert not Job.objects.filter(kind=JobKind.COMPILE).exists()


def test_the_api_compiles_reuses_and_reports_compatibility(
    client, version, device_class, alice, device_a, make_device
):
    _, token = device_a
    headers = token_for(alice)
    body = json.dumps(
        {"device_class": device_class.slug, "backend": "onnxruntime", "build_config": CONFIG}
    )
    queued = client.post(
        f"/api/v1/versions/{version.pk}/engines", body, content_type="application/json", **headers
    )
    assert queued.status_code == 202 and queued.json()["reused"] is False
    build(client, Job.objects.get(pk=queued.json()["job"]["id"]), token)
    reused = client.post(
        f"/api/v1/versions/{version.pk}/engines", body, content_type="application/json", **headers
    )
    assert reused.status_code == 200 and reused.json()["reused"] is True
    _, token_b = make_device("b")
    call(client, token_b, "device/heartbeat", {"fingerprint": other_ort()})
    engine = client.get(f"/api/v1/engines/{reused.json()['engine']['id']}", **headers).json()
    runs = {d["device"]: d["runs"] for d in engine["devices"]}
    assert runs == {"a": True, "b": False}


def test_an_admin_drains_a_device_through_the_api(client, alice, bob, device_a):
    device, _ = device_a
    url = f"/api/v1/devices/{device.pk}/drain"
    assert (
        client.post(url, "{}", content_type="application/json", **token_for(bob)).status_code == 403
    )
    response = client.post(
        url, json.dumps({"draining": True}), content_type="application/json", **token_for(alice)
    )
    assert response.json()["draining"] is True and response.json()["state"] == "draining"
    detail = client.get(f"/api/v1/devices/{device.pk}", **token_for(alice)).json()
    assert detail["fingerprint"]["onnxruntime"]["version"] == "1.32.0"


def test_an_int8_build_slower_than_fp32_is_flagged_on_the_version_page(
    client, version, device_class, alice, device_a
):
    device, token = device_a
    build(client, compile_(version, device_class, alice)[1], token)
    engine = Engine.objects.get()
    int8 = Engine.objects.create(
        model_version=version,
        device_class=device_class,
        backend="onnxruntime",
        build_config={**CONFIG, "precision": "int8"},
        config_digest="int8",
        compat_key="k",
        file=engine.file.name,
        sha256=engine.sha256,
        size=engine.size,
        signature="",
    )

    def run(engine, p50):
        latency = {**OLD_RESULT["latency_ms"], "p50": p50}
        return record_run(version, device_class, {**OLD_RESULT, "latency_ms": latency}, engine)

    run(engine, 18.0)
    slower = run(int8, 24.0)
    client.login(username="alice", password=PASSWORD)
    page = client.get(version.get_absolute_url()).content.decode()
    assert "p50 24.000 ms vs 18.000 ms for FP32" in page
    assert "INT8 slower than FP32 (p50 24.000 vs 18.000 ms)" in details_of(client, slower)

    # The FP32 run leaves the page's latest runs: the INT8 ones are still judged against it.
    latest = [run(int8, 25.0) for _ in range(PAGE_RUNS)][-1]
    page = client.get(version.get_absolute_url()).content.decode()
    assert f"The latest {PAGE_RUNS} of {PAGE_RUNS + 2} runs" in page
    assert page.count("p50 25.000 ms vs 18.000 ms for FP32") == PAGE_RUNS
    assert "INT8 slower than FP32 (p50 25.000 vs 18.000 ms)" in details_of(client, latest)


# A CPU device with ONNX Runtime and OpenVINO, so auto mode tries both.
CPU_FINGERPRINT = {**FINGERPRINT, "openvino": {"version": "2025.3.0"}}


def compile_in_form(client, version, device_class, backend, build_config):
    client.login(username="alice", password=PASSWORD)
    return client.post(
        f"/versions/{version.pk}/compile",
        {
            "device_class": device_class.pk,
            "backend": backend,
            "build_config": json.dumps(build_config),
        },
        follow=True,
    )


def compile_by_api(client, version, device_class, backend, build_config, headers):
    body = {"device_class": device_class.slug, "backend": backend, "build_config": build_config}
    return client.post(
        f"/api/v1/versions/{version.pk}/engines",
        json.dumps(body),
        content_type="application/json",
        **headers,
    )


def auto_build_of(version, device_class, user, backend):
    """Start auto mode on the version; return its fp32 build of the backend."""
    from deployhub.engines import auto
    from deployhub.registry.uploads import create_dataset
    from tests.conftest import ASSETS

    with open(ASSETS / "validation.npz", "rb") as handle:
        upload = SimpleUploadedFile("validation.npz", handle.read())
    create_dataset(version, upload, user, kind="validation", name="validation")
    run = auto.start(version, device_class, user)
    return run.builds.get(backend=backend, precision="fp32")


@pytest.mark.parametrize(
    "backend, form_config, api_config",
    [
        ("onnxruntime", CONFIG, {"precision": "fp32"}),
        ("openvino", {"device": "CPU", "precision": "f32", "performance_hint": "LATENCY"}, {}),
    ],
)
def test_it_gives_the_form_the_api_and_auto_mode_one_engine_for_one_build(
    client, version, device_class, alice, make_device, backend, form_config, api_config
):
    _, token = make_device("a")
    call(client, token, "device/heartbeat", {"fingerprint": CPU_FINGERPRINT})
    compile_in_form(client, version, device_class, backend, form_config)
    job = Job.objects.get(kind=JobKind.COMPILE)
    build(client, job, token, fingerprint=CPU_FINGERPRINT)
    engine = Engine.objects.get()

    answer = compile_by_api(client, version, device_class, backend, api_config, token_for(alice))
    auto_build = auto_build_of(version, device_class, alice, backend)

    assert answer.status_code == 200 and answer.json()["reused"] is True
    assert answer.json()["engine"]["id"] == engine.pk
    assert auto_build.engine == engine and auto_build.compile_job is None
    assert Job.objects.filter(kind=JobKind.COMPILE, params__backend=backend).count() == 1
    assert Engine.objects.count() == 1


def test_it_stores_an_engine_under_its_build_config_with_every_default_spelt_out(
    client, version, device_class, alice, make_device
):
    _, token = make_device("a")
    call(client, token, "device/heartbeat", {"fingerprint": CPU_FINGERPRINT})
    compile_in_form(client, version, device_class, "openvino", {"precision": "f32"})
    build(client, Job.objects.get(kind=JobKind.COMPILE), token, fingerprint=CPU_FINGERPRINT)

    engine = Engine.objects.get()
    assert engine.build_config == {
        "device": "CPU",
        "precision": "fp32",
        "performance_hint": "LATENCY",
        "export_blob": True,
    }
    assert engine.config_digest == digest(engine.build_config)


@pytest.mark.parametrize(
    "backend, one, other",
    [
        ("onnxruntime", {}, {"optimization_level": "all", "provider": "CPUExecutionProvider"}),
        ("onnxruntime", {"precision": "int8"}, {"precision": "int8", "calibration_samples": 100}),
        ("openvino", {"precision": "f32"}, {"device": "CPU", "performance_hint": "LATENCY"}),
        ("openvino", {"precision": "int8"}, {"precision": "int8", "preset": "performance"}),
        ("tensorrt", {"precision": "fp16"}, {"workspace_mb": 4096, "calibration_samples": 512}),
        ("tensorrt", {"precision": "int8"}, {"precision": "int8", "int8_mode": "calibration"}),
        ("torch-aoti", {"device": "cpu"}, {"precision": "fp32", "max_autotune": False}),
    ],
)
def test_it_spells_one_build_one_way_for_every_backend(backend, one, other):
    from workers.backends.known import BACKENDS

    canonical = BACKENDS[backend].canonical_config(one)

    assert BACKENDS[backend].canonical_config(other) == canonical
    assert BACKENDS[backend].canonical_config(canonical) == canonical
    BACKENDS[backend].check_config(canonical)  # the worker builds it as it stands


def test_it_refuses_a_build_config_that_is_not_an_object_and_queues_nothing(
    client, version, device_class, alice, device_a
):
    answer = compile_by_api(client, version, device_class, "onnxruntime", [1], token_for(alice))

    assert answer.status_code == 400
    assert answer.json()["error"] == "'build_config': Input should be a valid dictionary."
    assert not Job.objects.exists()


def test_it_refuses_a_backend_it_does_not_know_and_queues_nothing(
    client, version, device_class, alice, device_a
):
    answer = compile_by_api(client, version, device_class, "tensorrt-lite", {}, token_for(alice))

    assert answer.status_code == 400 and "There is no backend named" in answer.json()["error"]
    assert "known: onnxruntime" in answer.json()["error"]
    listed = compile_by_api(client, version, device_class, ["onnxruntime"], {}, token_for(alice))
    assert listed.status_code == 400
    assert listed.json()["error"] == "'backend': Input should be a valid string."
    assert not Job.objects.exists()


def test_it_keys_engines_stored_before_on_their_canonical_config(
    version, device_class, alice, device_a
):
    import importlib

    from django.apps import apps

    from deployhub.engines.actions import key_for

    migration = importlib.import_module(
        "deployhub.engines.migrations.0005_canonical_engine_configs"
    )
    key, _ = key_for("openvino", {}, FINGERPRINT)

    def stored(config, status="valid"):
        return Engine.objects.create(
            model_version=version,
            device_class=device_class,
            backend="openvino",
            build_config=config,
            config_digest=digest(config),
            compat_key=key,
            file="engines/test.zip",
            sha256="0" * 64,
            size=1,
            signature="00",
            status=status,
        )

    stale = stored({"precision": "f32", "device": "CPU"}, status="stale")
    first = stored({"device": "CPU", "precision": "f32"} | {"performance_hint": "LATENCY"})
    twin = stored({"precision": "f32"})

    migration.canonicalise(apps, None)

    first.refresh_from_db(), twin.refresh_from_db(), stale.refresh_from_db()
    assert first.build_config["precision"] == "fp32"
    assert first.config_digest == digest(first.build_config)
    assert twin.config_digest == digest({"precision": "f32"})  # kept: first holds the key
    assert stale.build_config == {"precision": "f32", "device": "CPU"}
    assert request_compile(version, device_class, "openvino", {}, alice) == (first, None)
