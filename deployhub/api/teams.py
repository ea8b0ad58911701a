"""API v1: The audit trail, webhooks and team settings."""

from ninja import Router

# Its django-ninja operations (api/openapi.py mounts it at /api/v1/).
router = Router(tags=["teams"])
