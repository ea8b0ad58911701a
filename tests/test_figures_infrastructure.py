"""plotly.js from the installed package, cached; the one visual language of every figure."""

from plotly.offline import get_plotlyjs

from deployhub.core.figure_style import PRECISION_COLOURS, SYMBOLS, marker_symbol, precision_colour
from workers.backends.known import BACKENDS


def test_it_serves_plotly_js_from_the_installed_package_with_long_caching(client):
    response = client.get("/figures/plotly.min.js?v=1")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/javascript")
    assert response.content == get_plotlyjs().encode()
    assert "max-age=31536000" in response["Cache-Control"]
    assert response["ETag"]


def test_it_answers_304_when_the_browser_has_this_plotly_already(client):
    etag = client.get("/figures/plotly.min.js").headers["ETag"]

    response = client.get("/figures/plotly.min.js", HTTP_IF_NONE_MATCH=etag)

    assert response.status_code == 304
    assert response.content == b""


def test_it_gives_each_known_backend_its_own_symbol_in_registry_order():
    symbols = [marker_symbol(name) for name in BACKENDS]

    assert symbols == list(SYMBOLS[: len(BACKENDS)])
    assert len(set(symbols)) == len(BACKENDS)


def test_it_draws_an_unstable_measurement_hollow():
    name = next(iter(BACKENDS))

    assert marker_symbol(name, stable=False) == f"{marker_symbol(name)}-open"
    assert marker_symbol(name, stable=None) == marker_symbol(name)


def test_it_keeps_one_colour_per_precision():
    assert precision_colour("int8") == PRECISION_COLOURS["int8"]
    assert precision_colour("fp32") != precision_colour("int8")
    assert precision_colour("something-new") == precision_colour("another-new")
