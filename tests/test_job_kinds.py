"""Apps declare their job kinds (deployhub/jobs/kinds.py); jobs and the device API read them."""

import ast
from pathlib import Path

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from deployhub.jobs import kinds
from deployhub.jobs.actions import complete_job, submit_job
from deployhub.jobs.models import JobKind, JobState
from tests.api_calls import call

ROOT = Path(__file__).resolve().parents[1]
TOY = "toy"
HIGHER_APPS = ("benchmarks", "engines", "parity", "api", "demo")


@pytest.fixture
def toy_kind(monkeypatch):
    """Subscribe a kind no app owns, for this test only."""
    stored, finished = [], []
    monkeypatch.setattr(kinds, "_registry", kinds._Registry(dict(kinds._registry.kinds)))
    name = default_storage.save("toy/notes.txt", ContentFile(b"toy input"))

    def notes(job, device=None):
        return {"notes": kinds.FileInput(name, "0" * 64, 9, "notes.txt")}

    kinds.subscribe(TOY, record=lambda job, result: stored.append(result), inputs=(notes,))
    kinds.on_finished(finished.append)
    yield stored, finished
    default_storage.delete(name)


def test_the_device_api_serves_the_inputs_a_kind_declares(
    client, toy_kind, alice, demo_team, device_class, make_device
):
    job = submit_job(team=demo_team, kind=TOY, device_class=device_class, user=alice)
    _, token = make_device()

    claimed = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1}).json()
    download = client.get(claimed["inputs"]["notes"]["url"], HTTP_AUTHORIZATION=f"Bearer {token}")
    missing = call(client, token, f"jobs/{job.pk}/inputs/model", method="get")

    assert list(claimed["inputs"]) == ["notes"]
    assert claimed["inputs"]["notes"]["filename"] == "notes.txt"
    assert b"".join(download.streaming_content) == b"toy input"
    assert missing.status_code == 404


def test_a_finished_job_goes_to_its_kinds_recorder_and_then_to_every_subscriber(
    client,
    toy_kind,
    alice,
    demo_team,
    device_class,
    make_device,
    django_capture_on_commit_callbacks,
):
    stored, finished = toy_kind
    job = submit_job(team=demo_team, kind=TOY, device_class=device_class, user=alice)
    device, token = make_device()
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})

    with django_capture_on_commit_callbacks(execute=True):
        done = complete_job(job.pk, device, 1, JobState.SUCCEEDED, result={"answer": 42})

    assert done.state == JobState.SUCCEEDED
    assert stored == [{"answer": 42}]
    assert [job.pk for job in finished] == [done.pk]


def test_a_kind_is_subscribed_once():
    with pytest.raises(ValueError, match="already subscribed"):
        kinds.subscribe(JobKind.COMPILE)


def test_every_kind_is_subscribed_by_the_app_that_owns_it():
    assert set(kinds._registry.kinds) == {value for value, _, _ in JobKind.CHOICES}


def test_jobs_imports_none_of_the_apps_that_consume_its_kinds():
    imported = set()
    for path in (ROOT / "deployhub" / "jobs").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    upward = {m for m in imported if m.split(".")[:2] in [["deployhub", a] for a in HIGHER_APPS]}
    assert upward == set()
