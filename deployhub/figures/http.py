"""How a figure travels: built server-side with plotly, sent as JSON, drawn by static/js/figures.js.

A figure endpoint answers {"figure": <plotly JSON>, "notes": [sentences], "config": {...}}:
notes say what is missing and what to run to fill it (the empty and partial states).
"""

import functools
import hashlib
import json

import plotly
import plotly.io as pio
from django.http import HttpResponse
from django.views.decorators.http import condition
from plotly.offline import get_plotlyjs

from deployhub.core.figure_style import PLOT_CONFIG


def figure_response(figure, notes=()):
    """Return a JSON response with the figure (a plotly Figure, or its JSON as a dict, which
    plotly checks when tests build it: tests/test_figures_tradeoffs.py) and its notes, in
    plotly's own encoder."""
    body = (
        f'{{"figure": {pio.to_json(figure, validate=False)}, "notes": {json.dumps(list(notes))}, '
        f'"config": {json.dumps(PLOT_CONFIG)}}}'
    )
    response = HttpResponse(body, content_type="application/json")
    response["Cache-Control"] = "private, no-cache"
    return response


@functools.cache
def plotly_bundle():
    """Return (plotly.min.js of the installed plotly package, its ETag)."""
    source = get_plotlyjs().encode()
    return source, f'"{hashlib.sha256(source).hexdigest()[:20]}"'


@condition(etag_func=lambda request: plotly_bundle()[1])
def plotly_js(request):
    """Serve plotly.js from the installed package: no CDN; cached for a year per version.

    Pages ask for it with ?v=<plotly version> ({% plotly_script %}), so an upgrade of
    the package changes the URL; a revalidation answers 304 by ETag.
    """
    response = HttpResponse(plotly_bundle()[0], content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = "public, max-age=31536000, immutable"
    return response


def plotly_version():
    return plotly.__version__
