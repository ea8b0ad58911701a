"""A worker whose device is drained hands new jobs back instead of running them."""

import pytest
from celery.exceptions import Reject

from workers import app as worker_app
from workers.cli import _follow_drain


@pytest.fixture
def context(monkeypatch):
    monkeypatch.setattr(worker_app, "DRAIN_PAUSE_SECONDS", 0)
    monkeypatch.setattr(worker_app.CONTEXT, "client", object())
    monkeypatch.setattr(worker_app.CONTEXT, "draining", False)
    return worker_app.CONTEXT


def test_a_draining_worker_requeues_the_message_without_claiming(context, monkeypatch):
    claimed = []
    monkeypatch.setattr(worker_app.runner, "run_job", lambda *args: claimed.append(args))
    _follow_drain("draining")
    with pytest.raises(Reject) as refusal:
        worker_app.run_job.run(12, 1)
    assert refusal.value.requeue and claimed == []


def test_it_takes_jobs_again_when_the_drain_ends(context, monkeypatch):
    claimed = []
    monkeypatch.setattr(worker_app.runner, "run_job", lambda *args: claimed.append(args) or "ok")
    _follow_drain("draining")
    _follow_drain("online")
    assert worker_app.run_job.run(12, 1) == "ok" and claimed
