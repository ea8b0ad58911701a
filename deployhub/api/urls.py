"""The device protocol's calls (docs/protocol.md), written by hand: the worker's, with its exact
behaviour. Every other call of API v1 is a django-ninja operation (api/openapi.py)."""

from django.urls import path

from deployhub.api import enrolment, protocol

# The device protocol (docs/protocol.md): matched first, every job's dispatch waits on a claim.
urlpatterns = [
    path("device", protocol.whoami, name="api_whoami"),
    path("device/heartbeat", protocol.device_heartbeat, name="api_device_heartbeat"),
    path("device/work", protocol.device_work, name="api_device_work"),
    path("jobs/<int:job_id>/claim", protocol.claim, name="api_claim"),
    path("jobs/<int:job_id>/heartbeat", protocol.job_heartbeat, name="api_job_heartbeat"),
    path("jobs/<int:job_id>/complete", protocol.complete, name="api_complete"),
    path("jobs/<int:job_id>/artifacts", protocol.upload_artifact, name="api_upload_artifact"),
    path("jobs/<int:job_id>/inputs/<str:name>", protocol.job_input, name="api_job_input"),
    path("engines/<int:engine_id>/download", protocol.engine_download, name="api_engine_download"),
    path("enrol", enrolment.enrol_device, name="api_enrol"),
]
