"""API v1: Jobs for people and pipelines: submit, list, cancel, read the log."""

from ninja import Router

# Its django-ninja operations (api/openapi.py mounts it at /api/v1/).
router = Router(tags=["jobs"])
