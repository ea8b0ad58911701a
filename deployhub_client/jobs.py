"""A hub's jobs: submit one, read, list, follow, cancel, and read its log (hub.jobs)."""

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deployhub_client import operations as ops
from deployhub_client.hub import path_of
from deployhub_client.operations import calls

if TYPE_CHECKING:
    from deployhub_client.hub import Hub

FINAL_STATES = ("succeeded", "failed", "cancelled")


class Jobs:
    """hub.jobs: the jobs of the caller's teams."""

    def __init__(self, hub: "Hub") -> None:
        self.hub = hub

    @calls(ops.JOB_SUBMIT)
    def submit(self, kind: str, **fields: Any) -> dict:
        """Queue a job: kind is compile, benchmark, batch-sweep, evaluate, parity or export,
        fields its body's (model_version=, engine=, device_class=, params=... as docs/api.md
        lists them for `POST jobs`). Answers {"job": {...} or None, "reused": bool,
        "engine": id or None, "parity_run": id or None}: a compile the engine store already
        holds answers its engine and queues nothing."""
        given = {name: value for name, value in fields.items() if value is not None}
        return self.hub.call(ops.JOB_SUBMIT, json={"kind": kind, **given})

    @calls(ops.JOB_DETAIL)
    def get(self, job: int) -> dict:
        """A job: its state, progress, error, log tail and what it ran on."""
        return self.hub.call(ops.JOB_DETAIL, job)

    @calls(ops.JOB_LIST)
    def list(
        self,
        state: str | None = None,
        kind: str | None = None,
        device_class: str | None = None,
        model_version: int | None = None,
    ) -> list[dict]:
        """The jobs of the caller's teams, newest first, filtered by state, kind, device
        class (a slug) and model version (an id)."""
        filters = {"state": state, "kind": kind, "device_class": device_class}
        return self.hub.listed(ops.JOB_LIST, model_version=model_version, **filters)

    @calls(ops.JOB_CANCEL)
    def cancel(self, job: int) -> dict:
        """Cancel a queued job, or ask the device running it to stop; answer the job
        (HubError 409 when it has finished already)."""
        return self.hub.call(ops.JOB_CANCEL, job)

    @calls(ops.JOB_LOG)
    def log(self, job: int) -> str:
        """A job's whole log."""
        return self.hub.send(ops.JOB_LOG.method, path_of(ops.JOB_LOG, job)).text

    @calls(ops.JOB_DETAIL)
    def watch(
        self,
        job: int,
        on_progress: Callable[[dict], None] | None = None,
        poll_seconds: float = 2.0,
    ) -> dict:
        """Poll a job until it is succeeded, failed or cancelled; answer it."""
        while True:
            seen = self.get(job)
            if on_progress:
                on_progress(seen)
            if seen["state"] in FINAL_STATES:
                return seen
            time.sleep(poll_seconds)
