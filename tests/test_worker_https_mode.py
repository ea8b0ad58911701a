"""The worker's loop in HTTPS mode against a scripted hub (a test double: the real hub's
side is tests/test_https_mode.py, the two together tests/test_e2e_fleet.py)."""

import random
import threading

import pytest

from workers import https_mode
from workers.app import WorkerContext
from workers.client import HubError, HubUnreachable, Unauthorized


class ScriptedHub:
    """Answers next_job from a script: a dict is an answer, an exception is raised."""

    def __init__(self, script, stop):
        self.script = list(script)
        self.stop = stop
        self.asks = 0

    def next_job(self, wait):
        self.asks += 1
        step = self.script.pop(0)
        if not self.script:
            self.stop.set()
        if isinstance(step, Exception):
            raise step
        return step


def serve(script, monkeypatch):
    stop = threading.Event()
    hub = ScriptedHub(script, stop)
    asker = https_mode.Asker(hub, WorkerContext(), stop)
    waits = []
    monkeypatch.setattr(asker.stop, "wait", lambda seconds: waits.append(seconds))
    asker.serve()
    return hub, waits


def test_the_wait_before_asking_again_doubles_its_ceiling_up_to_a_minute():
    rng = random.Random(1)
    for failures, ceiling in [(1, 2), (2, 4), (3, 8), (6, 60), (20, 60)]:
        delays = [https_mode.reconnect_delay(failures, rng) for _ in range(200)]
        assert 0 <= min(delays) and max(delays) <= ceiling
        assert max(delays) > ceiling / 2  # spread over the window, not bunched at its start


def test_a_hub_away_or_failing_is_asked_again_after_a_jittered_wait(monkeypatch):
    script = [
        HubUnreachable("cannot reach the hub"),
        HubError(503, "restarting"),
        HubError(500, "internal error"),
        {"job": None, "state": "online", "retry_after": 0},
    ]
    hub, waits = serve(script, monkeypatch)
    assert hub.asks == 4 and len(waits) == 3  # a wait after each failure, none after the answer


def test_a_refused_device_stops_asking(monkeypatch):
    with pytest.raises(Unauthorized):
        serve([Unauthorized(401, "This device was revoked"), {"job": None}], monkeypatch)


def test_a_draining_device_waits_as_long_as_the_hub_says(monkeypatch):
    hub, waits = serve(
        [{"job": None, "state": "draining", "retry_after": 10}, {"job": None}], monkeypatch
    )
    assert waits == [10]
