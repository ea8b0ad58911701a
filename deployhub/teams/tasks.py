"""Hub-side tasks of the teams app: webhook deliveries (run by the hub worker)."""

from celery import shared_task

from deployhub.teams.webhooks import attempt_delivery, sweep_deliveries


@shared_task(name="deployhub.teams.deliver_webhook", ignore_result=True)
def deliver_webhook(delivery_id):
    """Send one webhook delivery attempt; a failure queues the next (teams/webhooks.py)."""
    attempt_delivery(delivery_id)


@shared_task(name="deployhub.teams.sweep_webhooks", ignore_result=True)
def sweep_webhooks():
    """Resend lost webhook attempts and retry those whose sender died (teams/webhooks.py)."""
    sweep_deliveries()
