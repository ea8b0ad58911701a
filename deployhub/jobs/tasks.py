"""Hub-side periodic tasks (run by the hub worker with beat)."""

from celery import shared_task

from deployhub.jobs.actions import reap_expired_jobs


@shared_task(name="deployhub.jobs.reap", ignore_result=True)
def reap():
    """Re-queue or fail jobs whose lease expired; move auto runs on whatever happened."""
    from deployhub.engines.auto import advance_running

    reaped = len(reap_expired_jobs())
    advance_running()
    return reaped
