from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from deployhub import views
from deployhub.api import openapi
from deployhub.api import urls as api_urls
from deployhub.benchmarks import views as benchmark_views
from deployhub.conversions import views as conversion_views
from deployhub.demo import views as demo_views
from deployhub.devices import views as device_views
from deployhub.engines import views as engine_views
from deployhub.figures import http as figure_http
from deployhub.figures import views as figure_views
from deployhub.jobs import metrics as job_metrics
from deployhub.jobs import views as job_views
from deployhub.parity import views as parity_views
from deployhub.registry import views as registry_views
from deployhub.releases import views as release_views
from deployhub.teams import views as team_views

urlpatterns = [
    # First: every device call (a job's claim among them) is matched here, not after the
    # pages' sixty patterns (0.06 to 0.08 ms of a claim, measured side by side).
    path("api/v1/", include(api_urls.urlpatterns)),
    path("api/v1/", include(openapi.api.url_patterns())),
    path("api/docs/", openapi.docs, name="api_docs"),
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", job_metrics.metrics, name="metrics"),
    # The worker wheel devices install (deployhub/core/worker_dist.py): no sign-in.
    path("downloads/", views.worker_downloads, name="worker_downloads"),
    path("downloads/<str:filename>", views.worker_wheel, name="worker_wheel"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("team/", views.switch_team, name="switch_team"),
    path("team/audit/", team_views.audit, name="audit"),
    path("team/audit.csv", team_views.audit_csv, name="audit_csv"),
    path("team/settings/", team_views.team_settings, name="team_settings"),
    path("account/tokens/", team_views.api_tokens, name="api_tokens"),
    path("account/tokens/<int:pk>/revoke", team_views.revoke_token, name="revoke_token"),
    path("models/", registry_views.models_list, name="models"),
    path("models/<int:pk>/", registry_views.model_detail, name="model_detail"),
    path(
        "models/<int:pk>/benchmarks.csv",
        benchmark_views.model_benchmarks_csv,
        name="model_benchmarks_csv",
    ),
    path(
        "models/<int:pk>/accuracy.csv",
        benchmark_views.model_accuracy_csv,
        name="model_accuracy_csv",
    ),
    path(
        "models/<int:pk>/batch-sweep.csv",
        benchmark_views.model_sweep_csv,
        name="model_sweep_csv",
    ),
    path(
        "models/<int:pk>/results.json",
        benchmark_views.model_results_json,
        name="model_results_json",
    ),
    path("models/<int:pk>/report.html", benchmark_views.model_report, name="model_report"),
    path("models/samples/resnet18", demo_views.add_resnet18_sample, name="add_resnet18_sample"),
    path("versions/<int:pk>/", registry_views.version_detail, name="version_detail"),
    path("versions/<int:pk>/download", registry_views.version_download, name="version_download"),
    path("versions/<int:pk>/results", benchmark_views.version_results, name="version_results"),
    path(
        "benchmarks/runs/<int:pk>/details",
        benchmark_views.run_details,
        name="benchmark_run_details",
    ),
    path(
        "versions/<int:pk>/benchmark", benchmark_views.version_benchmark, name="version_benchmark"
    ),
    path("versions/<int:pk>/derive", registry_views.version_derive, name="version_derive"),
    path("versions/<int:pk>/notes", registry_views.version_notes, name="version_notes"),
    path("versions/<int:pk>/task", registry_views.version_task, name="version_task"),
    path("versions/<int:pk>/export", conversion_views.version_export, name="version_export"),
    path("versions/<int:pk>/convert", conversion_views.version_convert, name="version_convert"),
    path("versions/<int:pk>/datasets", registry_views.version_dataset, name="version_dataset"),
    path("versions/<int:pk>/golden", registry_views.version_golden, name="version_golden"),
    path("versions/<int:pk>/parity", parity_views.version_parity, name="version_parity"),
    path("devices/", device_views.device_classes, name="device_classes"),
    path("devices/classes/<int:pk>/", device_views.device_class_detail, name="device_class_detail"),
    path("devices/classes/<int:pk>/edit", device_views.device_class_edit, name="device_class_edit"),
    path("devices/<int:pk>/", device_views.device_detail, name="device_detail"),
    path("devices/<int:pk>/drain", device_views.device_drain, name="device_drain"),
    path("devices/<int:pk>/revoke", device_views.device_revoke, name="device_revoke"),
    path(
        "devices/classes/<int:pk>/enrolment-tokens",
        device_views.enrolment_token_create,
        name="enrolment_token_create",
    ),
    path(
        "devices/enrolment-tokens/<int:pk>/revoke",
        device_views.enrolment_token_revoke,
        name="enrolment_token_revoke",
    ),
    path("versions/<int:pk>/compile", engine_views.version_compile, name="version_compile"),
    path("versions/<int:pk>/auto", engine_views.version_auto, name="version_auto"),
    path("auto/<int:pk>/", engine_views.auto_run_detail, name="auto_run_detail"),
    path("engines/<int:pk>/", engine_views.engine_detail, name="engine_detail"),
    path("engines/<int:pk>/rebuild", engine_views.engine_rebuild, name="engine_rebuild"),
    path("engines/<int:pk>/evaluate", engine_views.engine_evaluate, name="engine_evaluate"),
    path("engines/<int:pk>/benchmark", engine_views.engine_benchmark, name="engine_benchmark"),
    path("engines/<int:pk>/propose", release_views.engine_propose, name="engine_propose"),
    path("releases/<int:pk>/", release_views.release_detail, name="release_detail"),
    path("releases/<int:pk>/submit", release_views.release_submit, name="release_submit"),
    path("releases/<int:pk>/review", release_views.release_review, name="release_review"),
    path("releases/<int:pk>/override", release_views.release_override, name="release_override"),
    path("releases/<int:pk>/promote", release_views.release_promote, name="release_promote"),
    path("releases/<int:pk>/rollback", release_views.release_rollback, name="release_rollback"),
    path("releases/<int:pk>/evidence", release_views.release_evidence, name="release_evidence"),
    path("figures/plotly.min.js", figure_http.plotly_js, name="plotly_js"),
    path("figures/", include("deployhub.figures.engine_urls")),
    path("models/<int:pk>/tradeoffs/", figure_views.tradeoffs, name="model_tradeoffs"),
    path(
        "models/<int:pk>/tradeoffs.json", figure_views.tradeoffs_json, name="model_tradeoffs_json"
    ),
    path("models/<int:pk>/fleet/", figure_views.fleet, name="model_fleet"),
    path("models/<int:pk>/fleet.json", figure_views.fleet_json, name="model_fleet_json"),
    path("models/<int:pk>/trend/", figure_views.trend, name="model_trend"),
    path("models/<int:pk>/trend.json", figure_views.trend_json, name="model_trend_json"),
    path("jobs/", job_views.jobs_list, name="jobs"),
    path("jobs/<int:pk>/", job_views.job_detail, name="job_detail"),
    path("jobs/<int:pk>/status", job_views.job_status, name="job_status"),
    path("jobs/<int:pk>/cancel", job_views.job_cancel, name="job_cancel"),
    path("admin/", admin.site.urls),
]
