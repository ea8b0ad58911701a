"""Hub-side periodic tasks (run by the hub worker with beat)."""

from celery import shared_task

from deployhub.devices.silence import report_silent_devices
from deployhub.jobs import kinds
from deployhub.jobs.actions import reap_expired_jobs


@shared_task(name="deployhub.jobs.reap", ignore_result=True)
def reap():
    """Re-queue or fail jobs whose lease expired, report devices fallen silent; then run
    what subscribed to the pass."""
    reaped = len(reap_expired_jobs())
    report_silent_devices()
    for callback in kinds.reap_callbacks():
        callback()
    return reaped
