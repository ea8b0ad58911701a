"""Devices follow production: the engine a device may run, and fetch-production on the device."""

import json
import subprocess
import sys

import pytest

from deployhub.devices.models import DeviceClass
from deployhub.engines import signing
from deployhub.engines.actions import rebuild
from deployhub.engines.models import Engine, EngineStatus
from deployhub.registry.models import Model
from deployhub.releases import actions
from deployhub.teams.models import Team
from tests.api_calls import call
from tests.compile_jobs import ENGINE_BYTES, FINGERPRINT, OTHER_ENGINE_BYTES, build, compile_
from tests.conftest import ROOT
from tests.gate_evidence import benchmarked, evaluated, passed_parity

OLDER_RUNTIME = {**FINGERPRINT, "onnxruntime": {"version": "1.31.0", "providers": ["CPU"]}}
db = pytest.mark.django_db
live = pytest.mark.django_db(transaction=True)


def built_engine(client, version, device_class, alice, token, fingerprint=FINGERPRINT, data=None):
    """Compile the version through the real API, as the device with this fingerprint builds it."""
    _, job = compile_(version, device_class, alice)
    build(client, job, token, data=data or ENGINE_BYTES, fingerprint=fingerprint)
    return Engine.objects.get(job=job)


def in_production(engine, author, reviewer):
    """Open the engine's gates and take it through review to production."""
    engine.device_class.frame_budget_ms = 20.0
    engine.device_class.save()
    passed_parity(engine)
    evaluated(engine, agreement=0.999)
    benchmarked(engine, p99=15.0)
    release = actions.submit(actions.propose(engine, author, "the fastest"), author)
    actions.review(release, reviewer, "approve", "numbers look right")
    return actions.promote(release, reviewer)


@pytest.fixture
def production(client, version, device_class, make_device, alice, bob):
    """A production release whose engine the device `device` (current toolchain) can run."""
    device, token = make_device("box")
    engine = built_engine(client, version, device_class, alice, token)
    device.fingerprint = FINGERPRINT
    device.save()
    release = in_production(engine, alice, bob)
    return release, device, token


def older_device(make_device):
    device, token = make_device("old-box")
    device.fingerprint = OLDER_RUNTIME
    device.save()
    return device, token


def fetch(client, device, token, model=None):
    query = f"?model={model}" if model is not None else ""
    path = f"device-classes/{device.device_class.slug}/production{query}"
    return call(client, token, path, method="get")


@db
def test_it_answers_the_production_engine_the_device_can_run(client, production):
    release, device, token = production
    engine = release.engine

    response = fetch(client, device, token, model=release.model_id)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["release"]["id"] == release.pk
    assert body["model"] == {"id": release.model_id, "name": "digits-cnn"}
    assert body["version"]["number"] == engine.model_version.number
    assert body["device_class"] == device.device_class.slug
    assert body["engine"] == {
        "id": engine.pk,
        "url": f"/api/v1/engines/{engine.pk}/download",
        "sha256": engine.sha256,
        "signature": engine.signature,
        "size": len(ENGINE_BYTES),
        "backend": "onnxruntime",
        "build_config": engine.build_config,
        "compat_key": engine.compat_key,
    }
    assert signing.verify(engine.sha256, body["engine"]["signature"])
    download = call(client, token, body["engine"]["url"].removeprefix("/api/v1/"), method="get")
    assert download.status_code == 200 and b"".join(download.streaming_content) == ENGINE_BYTES


@db
def test_without_a_model_it_lists_every_models_production_engine(client, production):
    release, device, token = production

    response = fetch(client, device, token)

    assert response.status_code == 200, response.content
    (entry,) = response.json()["releases"]
    assert entry["runnable"] is True
    assert entry["release"]["id"] == release.pk and entry["engine"]["id"] == release.engine_id


@db
def test_it_refuses_a_device_on_another_toolchain_with_the_fields_that_differ(
    client, production, make_device
):
    release, _, _ = production
    device, token = older_device(make_device)

    response = fetch(client, device, token, model=release.model_id)

    assert response.status_code == 409
    body = response.json()
    assert body["differences"] == {"onnxruntime": ["1.32.0", "1.31.0"]}
    assert "onnxruntime 1.32.0 ≠ 1.31.0" in body["error"] and "No rebuild" in body["error"]
    assert body["rebuild_queued"] is False and "engine" not in body
    assert body["release"]["id"] == release.pk


@db
def test_it_says_when_a_rebuild_for_the_device_is_queued(client, production, make_device, alice):
    release, _, _ = production
    device, token = older_device(make_device)
    _, job = rebuild(release.engine, alice)

    body = fetch(client, device, token, model=release.model_id).json()

    assert body["rebuild_queued"] is True and body["rebuild_job"] == job.pk
    assert "A rebuild is queued." in body["error"]


@db
def test_it_serves_the_same_build_rebuilt_for_the_devices_toolchain(
    client, production, make_device, alice
):
    release, _, _ = production
    device, token = older_device(make_device)
    _, job = rebuild(release.engine, alice)
    build(client, job, token, data=OTHER_ENGINE_BYTES, fingerprint=OLDER_RUNTIME)
    rebuilt = Engine.objects.get(job=job)

    body = fetch(client, device, token, model=release.model_id).json()

    assert rebuilt != release.engine
    assert body["engine"]["id"] == rebuilt.pk and body["release"]["engine_id"] == release.engine_id


@db
def test_it_refuses_a_revoked_production_engine(client, production):
    release, device, token = production
    Engine.objects.filter(pk=release.engine_id).update(status=EngineStatus.REVOKED)

    response = fetch(client, device, token, model=release.model_id)

    assert response.status_code == 409 and "was revoked" in response.json()["error"]


@db
def test_it_refuses_a_production_engine_whose_stored_file_changed(client, production):
    release, device, token = production
    engine = release.engine
    open(engine.file.path, "ab").write(b"\0")  # the file grew: its sha256 no longer holds
    refused = call(client, token, f"engines/{engine.pk}/download", method="get")
    assert refused.status_code == 409

    response = fetch(client, device, token, model=release.model_id)

    assert response.status_code == 409 and "engine" not in response.json()
    assert response.json()["error"].startswith(
        f"The production engine #{engine.pk} is corrupt: Its stored file hashes to "
    )


@db
def test_it_answers_404_when_there_is_no_production_release(client, version, make_device):
    device, token = make_device()

    one = fetch(client, device, token, model=version.model.pk)
    every = fetch(client, device, token)

    assert one.status_code == 404 and "has no production release" in one.json()["error"]
    assert every.status_code == 404 and "No model has a production release" in every.json()["error"]


@db
def test_it_answers_404_for_a_model_of_another_team(client, production, charlie):
    _, device, token = production
    theirs = Model.objects.create(team=Team.objects.get(slug="acme"), name="theirs")

    assert fetch(client, device, token, model=theirs.pk).status_code == 404


@db
def test_it_answers_404_for_another_class_as_for_one_that_does_not_exist(
    client, production, demo_team
):
    release, device, token = production
    other = DeviceClass.objects.create(team=demo_team, slug="jetson-orin", name="Jetson")

    path = "device-classes/{}/production?model=" + str(release.model_id)
    theirs = call(client, token, path.format(other.slug), method="get")
    nowhere = call(client, token, path.format("no-such-class"), method="get")

    assert theirs.status_code == nowhere.status_code == 404
    assert theirs.json()["error"].replace(other.slug, "X") == nowhere.json()["error"].replace(
        "no-such-class", "X"
    )


@db
def test_it_refuses_a_call_without_a_device_token(client, production):
    release, device, _ = production

    assert fetch(client, device, None, model=release.model_id).status_code == 401


@db
def test_it_refuses_a_model_that_is_not_an_id(client, production):
    _, device, token = production

    assert fetch(client, device, token, model="digits").status_code == 400


def fetch_production(live_server, token, out, *args):
    """Run the real `deployhub-worker fetch-production` against the live hub."""
    command = [sys.executable, "-m", "workers", "fetch-production", "--out", str(out), *args]
    return subprocess.run(
        command + ["--hub", live_server.url, "--token", token],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def nothing_written(tmp_path, out):
    """True when the fetch left neither the out folder nor its scratch folder behind."""
    return not out.exists() and not list(tmp_path.glob(f".{out.name}-*"))


@live
def test_the_worker_fetches_verifies_and_writes_the_production_engine(
    live_server, tmp_path, production
):
    release, _, token = production
    engine, out = release.engine, tmp_path / "engines"

    done = fetch_production(live_server, token, out, "--model", str(release.model_id))

    assert done.returncode == 0, done.stderr
    assert (out / f"engine-{engine.pk}").read_bytes() == ENGINE_BYTES
    manifest = json.loads((out / f"model-{release.model_id}.json").read_text())
    assert manifest["release"] == release.pk and manifest["engine"] == engine.pk
    assert manifest["file"] == f"engine-{engine.pk}" and manifest["backend"] == "onnxruntime"
    assert manifest["build_config"] == engine.build_config
    assert manifest["sha256"] == engine.sha256 and manifest["signature"] == engine.signature
    assert manifest["model"] == {"id": release.model_id, "name": "digits-cnn"}
    assert manifest["version"]["number"] == engine.model_version.number
    assert manifest["hub"] == live_server.url and manifest["fetched_at"]
    assert not list(tmp_path.glob(".engines-*"))

    again = fetch_production(live_server, token, out)  # every model: the same one here
    assert again.returncode == 0, again.stderr
    assert sorted(path.name for path in out.iterdir()) == [
        f"engine-{engine.pk}",
        f"model-{release.model_id}.json",
    ]


@live
@pytest.mark.parametrize("tamper", ["file", "signature"])
def test_the_worker_writes_nothing_from_a_tampered_download(
    live_server, tmp_path, production, tamper
):
    release, _, token = production
    engine, out = release.engine, tmp_path / "engines"
    if tamper == "file":
        original = open(engine.file.path, "rb").read()
        open(engine.file.path, "wb").write(bytes([original[0] ^ 1]) + original[1:])
    else:
        Engine.objects.filter(pk=engine.pk).update(signature=signing.sign("f" * 64))

    done = fetch_production(live_server, token, out, "--model", str(release.model_id))

    assert done.returncode == 1
    # A changed file is caught by the hub, which refuses it (the engine is corrupt now);
    # a forged signature by the device.
    reason = "is corrupt: Its stored file hashes to" if tamper == "file" else "signature does not"
    assert reason in done.stderr
    assert nothing_written(tmp_path, out)
    assert Engine.objects.get(pk=engine.pk).status == ("corrupt" if tamper == "file" else "valid")


@live
def test_the_worker_writes_nothing_when_it_may_not_run_production(
    live_server, tmp_path, production, make_device, version
):
    release, _, _ = production
    _, token = older_device(make_device)
    out = tmp_path / "engines"

    refused = fetch_production(live_server, token, out, "--model", str(release.model_id))
    listed = fetch_production(live_server, token, out)
    other = Model.objects.create(team=version.team, name="not-released")
    missing = fetch_production(live_server, token, out, "--model", str(other.pk))

    for done in (refused, listed):
        assert done.returncode == 1, done.stderr
        assert "onnxruntime 1.32.0 ≠ 1.31.0" in done.stderr
    assert missing.returncode == 1 and "has no production release" in missing.stderr
    assert nothing_written(tmp_path, out)


@live
def test_a_device_that_never_ran_a_worker_reports_its_fingerprint_first(
    live_server, tmp_path, production, make_device
):
    release = production[0]
    device, token = make_device(cls=release.device_class)

    done = fetch_production(live_server, token, tmp_path / "engines")

    device.refresh_from_db()
    assert device.fingerprint["cpu"]  # the hub now matches engines on what it reported
    assert "has not reported a fingerprint" not in done.stderr
