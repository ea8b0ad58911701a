from django.urls import path

from deployhub.api import fleet, pipelines, registry, results, views
from deployhub.parity import api as parity

urlpatterns = [
    path("device", views.whoami, name="api_whoami"),
    path("device/heartbeat", views.device_heartbeat, name="api_device_heartbeat"),
    path("jobs/<int:job_id>/claim", views.claim, name="api_claim"),
    path("jobs/<int:job_id>/heartbeat", views.job_heartbeat, name="api_job_heartbeat"),
    path("jobs/<int:job_id>/complete", views.complete, name="api_complete"),
    path("jobs/<int:job_id>/artifacts", views.upload_artifact, name="api_upload_artifact"),
    path("jobs/<int:job_id>/inputs/<str:name>", views.job_input, name="api_job_input"),
    path("engines/<int:engine_id>/download", views.engine_download, name="api_engine_download"),
    path("engines/<int:pk>", fleet.engine_detail, name="api_engine"),
    path("engines/<int:pk>/rebuild", fleet.engine_rebuild, name="api_engine_rebuild"),
    path("devices/<int:pk>", fleet.device_detail, name="api_device"),
    path("devices/<int:pk>/drain", fleet.device_drain, name="api_device_drain"),
    path("versions/<int:pk>/engines", fleet.version_engines, name="api_version_engines"),
    path("models", registry.models, name="api_models"),
    path("models/<int:pk>", registry.model_detail, name="api_model"),
    path("models/<int:pk>/versions", registry.model_versions, name="api_model_versions"),
    path("versions/<int:pk>", registry.version_detail, name="api_version"),
    path("versions/<int:pk>/datasets", registry.version_datasets, name="api_version_datasets"),
    path("versions/<int:pk>/golden", registry.version_golden, name="api_version_golden"),
    path("versions/<int:pk>/convert", registry.version_convert, name="api_version_convert"),
    path("versions/<int:pk>/benchmarks", results.version_benchmarks, name="api_version_benchmarks"),
    path("engines/<int:pk>/benchmarks", results.engine_benchmarks, name="api_engine_benchmarks"),
    path("models/<int:pk>/results", results.model_results_json, name="api_model_results"),
    path(
        "models/<int:pk>/results/<str:kind>.csv",
        results.model_results_csv,
        name="api_model_results_csv",
    ),
    path("models/<int:pk>/report", results.model_report, name="api_model_report"),
    path("versions/<int:pk>/parity", parity.version_parity, name="api_version_parity"),
    path("versions/<int:pk>/auto", pipelines.version_auto, name="api_version_auto"),
    path("auto-runs/<int:pk>", pipelines.auto_run_detail, name="api_auto_run"),
    path("jobs/<int:pk>", pipelines.job_detail, name="api_job"),
    path("device-classes", pipelines.device_classes, name="api_device_classes"),
]
