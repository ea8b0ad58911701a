"""The trade-off explorer's data in API v1: each class's engines with their figures and frontier,
filtered as every result call is (api/results.py's ResultFilters)."""

from ninja import Query, Router

from deployhub.api.results import ResultFilters
from deployhub.api.v1 import PIPELINES, Schema, answers
from deployhub.figures.tradeoffs import Filters, explore
from deployhub.registry.access import get_model_for_user

router = Router(tags=["results"])


class TradeoffPointOut(Schema):
    engine: int
    version: int
    backend: str
    precision: str
    latency_ms: float | None
    accuracy: float | None
    memory_mb: float | None
    stable: bool | None
    pareto: bool
    production: bool


class TradeoffFacetOut(Schema):
    device_class: str
    latency: str
    task: str
    accuracy: str
    accuracy_metric: str
    budget_ms: float | None
    tolerance_band: list[float | None] | None
    points: list[TradeoffPointOut]


class TradeoffsOut(Schema):
    facets: list[TradeoffFacetOut]
    notes: list[str]


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


@router.get(
    "models/{int:pk}/tradeoffs",
    response=answers(TradeoffsOut),
    auth=PIPELINES,
    url_name="api_model_tradeoffs",
)
def model_tradeoffs(request, pk: int, filters: Query[ResultFilters]):
    """The trade-off explorer's data: per device class, each engine's latency, accuracy and
    memory, the Pareto frontier, the budget and the tolerance band; with notes on what is
    missing."""
    model = get_model_for_user(request, pk)
    chosen = Filters(
        classes=filters.device_class,
        backends=filters.backend,
        precisions=filters.precision,
        vmin=filters.vmin,
        vmax=filters.vmax,
    )
    explorer = explore(model, chosen)
    return {"facets": [_facet(f) for f in explorer.facets], "notes": explorer.notes}
