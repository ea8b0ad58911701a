"""What each job kind means to the hub, declared by the app that owns the kind.

jobs publishes and never imports its consumers: in its AppConfig.ready() an app
subscribes a kind with what stores its result (`record`), which files its
device receives (`inputs`) and whether a page watching one of its jobs reloads
when it ends (`reloads_page`: the result adds more than a results row), and may
ask to hear of every finished job (`on_finished`) or of every reaper pass
(`on_reap`). The device API serves a job's inputs from these declarations;
`complete_job` stores results through them.
"""

from dataclasses import dataclass, field
from typing import Any

from workers.kinds import ENGINE_INPUT, MODEL_INPUT


@dataclass(frozen=True)
class FileInput:
    """A file in storage that a job's device downloads at /api/v1/jobs/<id>/inputs/<name>."""

    storage_name: str
    sha256: str
    size: int
    filename: str

    @classmethod
    def of(cls, stored, filename):
        """Return the input of a stored object's file (one with .file, .sha256 and .size)."""
        return cls(stored.file.name, stored.sha256, stored.size, filename)


@dataclass(frozen=True)
class EngineInput:
    """An engine a job's device downloads from /api/v1/engines/<id>/download, signature checked."""

    engine: object


@dataclass
class Subscription:
    """One kind's handlers: record(job, result) -> stored object; inputs: (job, device) -> dict."""

    record: object = None
    inputs: tuple = ()
    check: object = None
    reloads_page: bool = False


@dataclass
class _Registry:
    kinds: dict = field(default_factory=dict)
    finished: list = field(default_factory=list)
    reap: list = field(default_factory=list)


_registry = _Registry()


def subscribe(kind, *, record=None, inputs=(), check=None, reloads_page=False):
    """Declare what stores a kind's result and which inputs its device receives (once a kind).

    check(job, result), when given, does a kind's slow checks of a result (it may raise
    ResultRejected) before the job's row is locked: nothing waits on the lock meanwhile.
    reloads_page: a page watching a job of this kind reloads when it ends, to show what
    the result added (an engine, a version, a gate, a flag); otherwise it only refreshes
    its results table.
    """
    if kind in _registry.kinds:
        raise ValueError(f"job kind {kind!r} is already subscribed")
    _registry.kinds[kind] = Subscription(
        record=record, inputs=tuple(inputs), check=check, reloads_page=reloads_page
    )


def reloads_page(kind):
    """True when a page watching a job of this kind reloads as the job ends."""
    subscription = _registry.kinds.get(kind)
    return subscription is not None and subscription.reloads_page


def on_finished(callback):
    """Call callback(job) after the commit that finishes any job."""
    if callback not in _registry.finished:
        _registry.finished.append(callback)


def on_reap(callback):
    """Call callback() after each reaper pass."""
    if callback not in _registry.reap:
        _registry.reap.append(callback)


def check(job, result):
    """Run a succeeded job's result through its kind's slow checks (raise ResultRejected)."""
    subscription = _registry.kinds.get(job.kind)
    if subscription is not None and subscription.check is not None:
        subscription.check(job, result)


def record(job, result):
    """Store a succeeded job's result through its kind's recorder; None when it has none."""
    subscription = _registry.kinds.get(job.kind)
    if subscription is None or subscription.record is None:
        return None
    return subscription.record(job, result)


def inputs_of(job, device=None):
    """Return {name: FileInput or EngineInput} a job's device receives, in declaration order.

    device is None when the caller only lists inputs; providers that depend on the
    device that claimed the job (its caches) then add nothing.
    """
    subscription = _registry.kinds.get(job.kind)
    found: dict[str, Any] = {}
    for provider in subscription.inputs if subscription else ():
        found.update(provider(job, device) or {})
    return found


def finished_callbacks():
    """Return the callbacks to run after a job finishes."""
    return list(_registry.finished)


def reap_callbacks():
    """Return the callbacks to run after each reaper pass."""
    return list(_registry.reap)


def model_input(job, device=None):
    """The job's model version file, as uploaded."""
    version = job.model_version
    if version is None or not version.file:
        return {}
    return {
        MODEL_INPUT: FileInput(
            version.file.name, version.sha256, version.size, version.download_name
        )
    }


def engine_input(job, device=None):
    """The engine the job runs, when it names one."""
    return {ENGINE_INPUT: EngineInput(job.engine)} if job.engine is not None else {}
