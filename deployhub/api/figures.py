"""The trade-off explorer's data in API v1: each class's engines with their figures and frontier."""

from django.http import JsonResponse
from django.views.decorators.http import require_http_methods
from ninja import Router

from deployhub.api.auth import for_pipelines, token_required
from deployhub.figures.tradeoffs import Filters, explore
from deployhub.registry.access import get_model_for_user

# Its django-ninja operations (api/openapi.py mounts it at /api/v1/).
router = Router(tags=["results"])


def _point(facet, point):
    return {
        "engine": point.engine_id,
        "version": point.version,
        "backend": point.backend,
        "precision": point.precision,
        "latency_ms": point.latency_ms,
        "accuracy": facet.accuracy(point),
        "memory_mb": point.memory_mb,
        "stable": point.stable,
        "pareto": point.pareto,
        "production": point.production,
    }


def _facet(facet):
    return {
        "device_class": facet.device_class.slug,
        "latency": "ms per image" if facet.device_class.is_batch else "p99 ms",
        "task": facet.task,
        "accuracy": facet.accuracy_kind,
        "accuracy_metric": facet.title,
        "budget_ms": facet.budget_ms,
        "tolerance_band": facet.band,
        "points": [_point(facet, point) for point in facet.points],
    }


@require_http_methods(["GET"])
@token_required
@for_pipelines
def model_tradeoffs(request, pk):
    """GET /api/v1/models/<id>/tradeoffs?class=&backend=&precision=&vmin=&vmax="""
    model = get_model_for_user(request, pk)
    try:
        filters = Filters.from_query(request.GET)
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    explorer = explore(model, filters)
    return JsonResponse({"facets": [_facet(f) for f in explorer.facets], "notes": explorer.notes})
