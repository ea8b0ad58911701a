"""API v1: Device classes (created and edited by admins) and their devices."""

from ninja import Router

# Its django-ninja operations (api/openapi.py mounts it at /api/v1/).
router = Router(tags=["devices"])
