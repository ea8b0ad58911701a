"""The hub's Celery app: it enqueues job ids and runs the reaper with beat."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "deployhub.settings")


def _settings_config():
    from django.conf import settings

    return {
        **settings.CELERY,
        "task_default_queue": settings.CELERY_HUB_QUEUE,
        "beat_schedule": {
            "reap-expired-leases": {
                "task": "deployhub.jobs.reap",
                "schedule": float(settings.DEPLOYHUB_REAPER_INTERVAL),
                "options": {"queue": settings.CELERY_HUB_QUEUE, "expires": 30},
            },
            "sweep-webhook-deliveries": {
                "task": "deployhub.teams.sweep_webhooks",
                "schedule": 60.0,
                "options": {"queue": settings.CELERY_HUB_QUEUE, "expires": 50},
            },
        },
        "beat_schedule_filename": str(settings.VAR_DIR / "celerybeat-schedule"),
        "imports": ["deployhub.jobs.tasks", "deployhub.teams.tasks"],
    }


app = Celery("deployhub")
app.add_defaults(_settings_config)
