"""Routes of the engine, release and device figures (deployhub/figures/engine_views.py)."""

from django.urls import path

from deployhub.figures import engine_views as views

urlpatterns = [
    path("latency/", views.latency_page, name="figure_latency"),
    path("latency.json", views.latency_json, name="figure_latency_json"),
    path("sweep.json", views.sweep_json, name="figure_sweep_json"),
    path(
        "engines/<int:pk>/against-production.json",
        views.engine_comparison_json,
        name="figure_engine_comparison",
    ),
    path(
        "releases/<int:pk>/against-production.json",
        views.release_comparison_json,
        name="figure_release_comparison",
    ),
    path(
        "devices/<int:pk>/fingerprints.json",
        views.device_timeline_json,
        name="figure_device_timeline",
    ),
    path(
        "device-classes/<int:pk>/fingerprints.json",
        views.class_timeline_json,
        name="figure_class_timeline",
    ),
]
