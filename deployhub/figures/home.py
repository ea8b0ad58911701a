"""The model's home on its page: the explorer, each version's best engine per class, exports.

Drawn on the model page through registry.pages.model_sections (apps.py).
The best engine per class comes from the explorer's points (a fixed number of
queries); only those engines' release gates are read, at most VERSIONS × classes.
"""

from deployhub.engines.models import Engine
from deployhub.figures.fleet import best_by_version
from deployhub.figures.points import load_points
from deployhub.figures.tradeoffs import Filters
from deployhub.figures.views import filter_choices

# The model page lists the latest versions; older ones are a click away (the explorer's range).
VERSIONS = 10


def _with_engines(table):
    ids = [best.point.engine_id for row in table.values() for best in row.values()]
    engines = Engine.objects.select_related("device_class", "model_version").in_bulk(ids)
    for row in table.values():
        for best in row.values():
            best.engine = engines.get(best.point.engine_id)


def model_part(model, request):
    """The model page's home: explorer filters, versions with their best engines, exports."""
    versions = list(model.versions.order_by("-number")[:VERSIONS])
    engines = Engine.objects.filter(model_version__in=versions)
    table = best_by_version(load_points(model, engines))
    _with_engines(table)
    classes = sorted({dc for row in table.values() for dc in row}, key=lambda c: c.slug)
    try:
        filters = Filters.from_query(request.GET)
    except ValueError:
        filters = Filters()
    return {
        "home_versions": [
            (v, [table.get(v.number, {}).get(dc) for dc in classes]) for v in versions
        ],
        "home_classes": classes,
        "filters": filters,
        "query": request.GET.urlencode(),
        **filter_choices(model),
    }
