from django.urls import path

from deployhub.api import views

urlpatterns = [
    path("device", views.whoami, name="api_whoami"),
    path("device/heartbeat", views.device_heartbeat, name="api_device_heartbeat"),
    path("jobs/<int:job_id>/claim", views.claim, name="api_claim"),
    path("jobs/<int:job_id>/heartbeat", views.job_heartbeat, name="api_job_heartbeat"),
    path("jobs/<int:job_id>/complete", views.complete, name="api_complete"),
    path("jobs/<int:job_id>/artifacts", views.upload_artifact, name="api_upload_artifact"),
    path("jobs/<int:job_id>/inputs/<str:name>", views.job_input, name="api_job_input"),
]
