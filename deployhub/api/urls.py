from django.urls import path

from deployhub.api import (
    catalog,
    enrolment,
    figures,
    fleet,
    parity,
    production,
    protocol,
    releases,
    results,
)

# The device protocol (docs/protocol.md): matched first, every job's dispatch waits on a claim.
device_urlpatterns = [
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

# Calls for people written by hand, not yet django-ninja operations (api/openapi.py): matched
# after those, so an operation there at the same path is the one that answers.
urlpatterns = [
    path("engines/<int:pk>", fleet.engine_detail, name="api_engine"),
    path("engines/<int:pk>/rebuild", fleet.engine_rebuild, name="api_engine_rebuild"),
    path("devices/<int:pk>", fleet.device_detail, name="api_device"),
    path("devices/<int:pk>/drain", fleet.device_drain, name="api_device_drain"),
    path("devices/<int:pk>/revoke", fleet.device_revoke, name="api_device_revoke"),
    path(
        "device-classes/<slug:slug>/enrolment-tokens",
        enrolment.class_enrolment_tokens,
        name="api_class_enrolment_tokens",
    ),
    path(
        "enrolment-tokens/<int:pk>/revoke",
        enrolment.enrolment_token_revoke,
        name="api_enrolment_token_revoke",
    ),
    path("versions/<int:pk>/engines", fleet.version_engines, name="api_version_engines"),
    path("models", catalog.models, name="api_models"),
    path("models/<int:pk>", catalog.model_detail, name="api_model"),
    path("models/<int:pk>/versions", catalog.model_versions, name="api_model_versions"),
    path("versions/<int:pk>", catalog.version_detail, name="api_version"),
    path("versions/<int:pk>/datasets", catalog.version_datasets, name="api_version_datasets"),
    path("versions/<int:pk>/golden", catalog.version_golden, name="api_version_golden"),
    path("versions/<int:pk>/convert", catalog.version_convert, name="api_version_convert"),
    path("versions/<int:pk>/task", catalog.version_task, name="api_version_task"),
    path("versions/<int:pk>/benchmarks", results.version_benchmarks, name="api_version_benchmarks"),
    path("engines/<int:pk>/benchmarks", results.engine_benchmarks, name="api_engine_benchmarks"),
    path("models/<int:pk>/results", results.model_results_json, name="api_model_results"),
    path(
        "models/<int:pk>/results/<str:kind>.csv",
        results.model_results_csv,
        name="api_model_results_csv",
    ),
    path("models/<int:pk>/report", results.model_report, name="api_model_report"),
    path("models/<int:pk>/tradeoffs", figures.model_tradeoffs, name="api_model_tradeoffs"),
    path("versions/<int:pk>/parity", parity.version_parity, name="api_version_parity"),
    path(
        "device-classes/<slug:slug>/production",
        production.device_class_production,
        name="api_device_class_production",
    ),
    path("engines/<int:pk>/releases", releases.engine_releases, name="api_engine_releases"),
    path("releases/<int:pk>", releases.release_detail, name="api_release"),
    path("releases/<int:pk>/submit", releases.release_submit, name="api_release_submit"),
    path("releases/<int:pk>/reviews", releases.release_reviews, name="api_release_reviews"),
    path("releases/<int:pk>/override", releases.release_override, name="api_release_override"),
    path("releases/<int:pk>/promote", releases.release_promote, name="api_release_promote"),
    path("releases/<int:pk>/rollback", releases.release_rollback, name="api_release_rollback"),
    path("releases/<int:pk>/evidence", releases.release_evidence, name="api_release_evidence"),
    path("models/<int:pk>/releases", releases.model_releases, name="api_model_releases"),
]
