"""The device worker's Celery app: one thin task that runs a hub job."""

import time
from dataclasses import dataclass

from workers.isolation import keep_django_out

keep_django_out()  # before Celery: kombu imports Django wherever it is installed

from celery import Celery  # noqa: E402
from celery.exceptions import Reject  # noqa: E402

from workers import runner  # noqa: E402
from workers.broker import celery_config  # noqa: E402
from workers.client import HubUnreachable  # noqa: E402

# A draining worker hands a message back after this pause, so it does not spin on it.
DRAIN_PAUSE_SECONDS = 2

# No fixups: Celery's Django fixup imports Django whenever DJANGO_SETTINGS_MODULE is set.
app = Celery("deployhub-worker", fixups=[])


@dataclass
class WorkerContext:
    """What the task needs; the command line fills it in before the worker starts."""

    client: object = None
    fingerprint: dict | None = None  # the one last reported to the hub
    workdir: str | None = None
    signing_public_key: str | None = None  # the hub's, to verify engines before loading them
    draining: bool = False  # the hub said: take no new jobs
    delivery: str = "broker"  # how work reaches this worker: "broker" or "https"
    asking: bool = False  # HTTPS mode: an ask for work is open (the hub counts it a heartbeat)


CONTEXT = WorkerContext()


def configure(broker_url):
    """Point the app at a broker, with the settings every DeployHub process shares."""
    app.conf.update(celery_config(broker_url))


# A hub down for longer than the client retries: run the message again (every 3 min, 10 times).
@app.task(name="deployhub.run_job", autoretry_for=(HubUnreachable,), max_retries=10)
def run_job(job_id, attempt):
    """Run one attempt of a hub job on this device."""
    if CONTEXT.client is None:
        raise RuntimeError("the worker has no hub client: start it with `deployhub-worker run`")
    if CONTEXT.draining:  # leave the job to another device of the class
        time.sleep(DRAIN_PAUSE_SECONDS)
        raise Reject("this device is draining", requeue=True)
    return runner.run_job(
        CONTEXT.client,
        job_id,
        attempt,
        CONTEXT.workdir,
        CONTEXT.fingerprint,
        CONTEXT.signing_public_key,
    )
