"""DeployHub: the hub (Django project and apps)."""

from deployhub.celery import app as celery_app

__all__ = ["celery_app"]
