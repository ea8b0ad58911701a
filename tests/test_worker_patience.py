"""A worker waits for a hub whose database restarts instead of throwing a finished job away.

The hub answers 503 while its database is down (deployhub/outage.py), and 429 to a
throttled address. The client retries a few seconds; past that the runner keeps trying
its downloads, uploads and the completion for HUB_PATIENCE_SECONDS, heartbeating the
job meanwhile so its lease does not run out. The fault soak (scripts/soak.py) showed the
cost of giving up: a result thrown away and the job run again, or a job failed
because its input download met the restart.
"""

import pytest

from workers import kinds, runner
from workers.client import Conflict, HubError, HubUnreachable

UNAVAILABLE = HubError(503, "The database is unavailable; nothing was changed.")
THROTTLED = HubError(429, "Too many failed token authentications from this address.")


class RestartingHub:
    """A hub client whose completion meets `refusals` errors before it is accepted."""

    def __init__(self, *refusals):
        self.refusals = list(refusals)
        self.completions = []

    def claim(self, job_id, attempt):
        return {"kind": kinds.NOOP, "attempt": attempt, "lease_seconds": 30, "inputs": {}}

    def job_heartbeat(self, job_id, attempt, **fields):
        return {"cancel_requested": False}

    def complete(self, job_id, attempt, state, **fields):
        self.completions.append(state)
        if self.refusals:
            raise self.refusals.pop(0)
        return {"id": job_id, "state": state}


class ThrottlingHub(RestartingHub):
    """A hub that throttles the completion (429) until the job's lease has been extended
    twice since: a completion retried without heartbeats would outlive its lease."""

    def __init__(self):
        super().__init__()
        self.beats = []  # each heartbeat's fields, and whether a completion was refused yet
        self.refused = False

    def claim(self, job_id, attempt):
        return {**super().claim(job_id, attempt), "lease_seconds": 0.3}

    def job_heartbeat(self, job_id, attempt, **fields):
        self.beats.append((fields, self.refused))
        return {"cancel_requested": False}

    def complete(self, job_id, attempt, state, **fields):
        self.completions.append((state, fields["log"]))
        if sum(refused for _, refused in self.beats) < 2:
            self.refused = True
            raise THROTTLED
        return {"id": job_id, "state": state}


@pytest.fixture(autouse=True)
def no_pause(monkeypatch):
    monkeypatch.setattr(runner, "HUB_RETRY_PAUSE_SECONDS", 0)


def test_it_delivers_a_result_once_the_hub_answers_again(tmp_path):
    hub = RestartingHub(UNAVAILABLE, HubUnreachable("connection refused"), UNAVAILABLE)

    state = runner.run_job(hub, 12, 1, workdir_root=tmp_path)

    assert state == "succeeded"
    assert hub.completions == ["succeeded"] * 4


def test_it_keeps_the_lease_while_a_throttled_completion_is_retried(tmp_path, monkeypatch):
    # The heartbeats once stopped with the work, so a completion the hub throttled for
    # longer than a lease found the job re-queued, and it ran a second time.
    monkeypatch.setattr(runner, "HUB_PATIENCE_SECONDS", 10)
    monkeypatch.setattr(runner, "HUB_RETRY_PAUSE_SECONDS", 0.02)
    hub = ThrottlingHub()

    state = runner.run_job(hub, 12, 1, workdir_root=tmp_path)

    assert state == "succeeded"
    assert len(hub.completions) > 1 and {s for s, _ in hub.completions} == {"succeeded"}
    while_completing = [fields for fields, refused in hub.beats if refused]
    assert len(while_completing) >= 2
    # Those beats only extend the lease: the completion carries the log, each line once.
    assert not any(fields.get("log") for fields in while_completing)
    sent = "".join(fields.get("log") or "" for fields, _ in hub.beats) + hub.completions[-1][1]
    lines = [line.split(" ", 1)[1] for line in sent.splitlines()]
    assert "claimed job 12 attempt 1" in lines and len(lines) == len(set(lines))


def test_it_drops_a_completion_the_hub_refuses_without_retrying(tmp_path):
    hub = RestartingHub(Conflict(409, "Attempt 1 is stale: the job is on attempt 2."))

    assert runner.run_job(hub, 12, 1, workdir_root=tmp_path) == "dropped"
    assert hub.completions == ["succeeded"]


def test_it_retries_only_what_says_the_hub_is_unavailable():
    calls = []

    def refused():
        calls.append(1)
        raise HubError(400, "state must be one of: succeeded, failed, cancelled.")

    with pytest.raises(HubError):
        runner.patiently(refused)
    assert len(calls) == 1


def test_it_gives_up_when_the_hub_stays_down_past_its_patience(monkeypatch):
    monkeypatch.setattr(runner, "HUB_PATIENCE_SECONDS", 0)
    calls = []

    def down():
        calls.append(1)
        raise UNAVAILABLE

    with pytest.raises(HubError):
        runner.patiently(down)
    assert len(calls) == 1
