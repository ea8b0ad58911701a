"""The hub checks a stored engine's sha256 when it serves it: changed bytes mark it corrupt."""

import os

import pytest

from deployhub.engines import actions
from deployhub.engines.models import Engine
from deployhub.jobs.models import Job, JobKind
from deployhub.teams.models import Event
from tests.api_calls import call
from tests.compile_jobs import ENGINE_BYTES, OTHER_ENGINE_BYTES, build, compile_
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def built(client, version, device_class, alice, make_device):
    """An engine the device `line-1` built through the protocol, and that device's token."""
    device, token = make_device("line-1")
    build(client, compile_(version, device_class, alice)[1], token)
    return Engine.objects.get(), device, token


def flip_a_byte(engine):
    """Change one byte of the stored file, as a disk fault or a person with shell access would
    (the file's modification time moves on, as it does when a file is written)."""
    path = engine.file.path
    data = bytearray(open(path, "rb").read())
    data[3] ^= 0x01
    before = os.stat(path).st_mtime_ns
    open(path, "wb").write(bytes(data))
    os.utime(path, ns=(before + 10**9, before + 10**9))


def download(client, token, engine):
    return call(client, token, f"engines/{engine.pk}/download", method="get")


def test_a_flipped_byte_marks_the_engine_corrupt_instead_of_serving_it(client, alice, built):
    engine, device, token = built
    flip_a_byte(engine)

    refused = download(client, token, engine)

    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error.startswith(f"Engine #{engine.pk} is corrupt: Its stored file hashes to ")
    assert f"not its sha256 {engine.sha256[:16]}" in error
    assert error.endswith(
        f"(found when it was served to {device}): the hub does not serve it. Rebuild it."
    )
    engine.refresh_from_db()
    assert engine.status == "corrupt"
    event = Event.objects.get(verb="engine.corrupt")
    assert (event.target_id, event.data["before"], event.data["after"]) == (
        engine.pk,
        "valid",
        "corrupt",
    )
    assert download(client, token, engine).status_code == 409  # and stays refused
    assert Event.objects.filter(verb="engine.corrupt").count() == 1
    client.login(username="alice", password=PASSWORD)
    page = client.get(engine.get_absolute_url()).content.decode()
    assert '<span class="badge purple">Corrupt</span>' in page
    assert "the hub does not serve it. Rebuild it." in page
    assert f'action="/engines/{engine.pk}/rebuild"' in page


def test_a_byte_flipped_after_a_download_is_caught_at_the_next(client, built):
    engine, _, token = built
    served = download(client, token, engine)
    assert b"".join(served.streaming_content) == ENGINE_BYTES
    flip_a_byte(engine)

    assert download(client, token, engine).status_code == 409
    assert Engine.objects.get().status == "corrupt"


def test_an_unchanged_file_is_hashed_once_however_often_it_is_served(client, built, monkeypatch):
    engine, _, token = built
    hashed = []
    real = actions._sha256_of
    monkeypatch.setattr(actions, "_sha256_of", lambda name: hashed.append(name) or real(name))

    answers = [download(client, token, engine).status_code for _ in range(3)]

    assert answers == [200, 200, 200] and hashed == [engine.file.name]


def test_a_missing_file_marks_the_engine_corrupt(client, built):
    engine, _, token = built
    os.remove(engine.file.path)

    refused = download(client, token, engine)

    assert refused.status_code == 409
    assert "Its stored file is missing" in refused.json()["error"]
    assert Engine.objects.get().status == "corrupt"


def test_rebuilding_a_corrupt_engine_stores_a_new_one_beside_it(client, alice, built):
    engine, _, token = built
    flip_a_byte(engine)
    download(client, token, engine)
    client.login(username="alice", password=PASSWORD)

    client.post(f"/engines/{engine.pk}/rebuild")
    job = Job.objects.filter(kind=JobKind.COMPILE).latest("id")
    assert build(client, job, token, data=OTHER_ENGINE_BYTES).status_code == 200

    rebuilt = Engine.objects.get(job=job)
    assert rebuilt != engine and rebuilt.status == "valid"
    assert rebuilt.compat_key == engine.compat_key
    assert Engine.objects.get(pk=engine.pk).status == "corrupt"
    served = download(client, token, rebuilt)
    assert b"".join(served.streaming_content) == OTHER_ENGINE_BYTES
