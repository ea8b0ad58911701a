"""DeployHub: the hub (Django project and apps).

The Celery app (deployhub/celery.py) is imported when first asked for, not here:
the child process that validates an uploaded model imports this package too, and
importing Celery took a third of a second of its start-up. `celery -A deployhub`
finds the app in deployhub.celery.
"""

__all__ = ["celery_app"]


def __getattr__(name):
    if name == "celery_app":
        from deployhub.celery import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
