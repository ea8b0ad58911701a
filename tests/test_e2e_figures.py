"""The figures in Chromium against a live hub: the explorer, its filters and clicks, fleet, trend.

Results are seeded in the database (tests/figure_results.py): no worker is needed.
Screenshots of each view are kept in test-artifacts/.
"""

import re

import pytest

from deployhub.releases.models import Release, ReleaseState
from tests.browser import sign_in
from tests.conftest import ARTIFACTS
from tests.figure_results import seed_classes, seed_engines, seed_runs

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def drawn(page, selector):
    page.wait_for_selector(f'{selector}[data-drawn="true"]', timeout=20000)
    return page.evaluate(
        f"""() => document.querySelector('{selector}').data.map(
            t => [t.meta && t.meta.role, (t.x || []).length, t.xaxis || 'x'])"""
    )


def click_first_point(page):
    point = page.locator("#tradeoff-figure .scatterlayer .trace .points path").first
    box = point.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.click(x, y)


def click_cell(page, selector, column, row):
    """Click the centre of a heatmap's cell (category indexes on its x and y axes)."""
    page.locator(selector).scroll_into_view_if_needed()
    x, y = page.evaluate(
        f"""() => {{
            const el = document.querySelector('{selector}'), layout = el._fullLayout;
            const box = el.getBoundingClientRect();
            return [box.left + layout._size.l + layout.xaxis.l2p({column}),
                    box.top + layout._size.t + layout.yaxis.l2p({row})];
        }}"""
    )
    page.mouse.move(x, y)
    page.mouse.click(x, y)


@pytest.fixture
def seeded(version, demo_team):
    classes = seed_classes(demo_team)
    engines = seed_engines([version], classes, precisions=("fp32", "int8"))
    seed_runs(engines, benchmarks=len(engines) * 3, accuracies=len(engines))
    Release.objects.create(
        engine=engines[0],
        model=version.model,
        device_class=engines[0].device_class,
        state=ReleaseState.PRODUCTION,
    )
    return version.model, classes, engines


def test_the_explorer_draws_filters_and_opens_an_engine(live_server, browser, alice, seeded):
    model, classes, engines = seeded
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    sign_in(page, live_server, "alice")

    page.goto(f"{live_server.url}/models/{model.pk}/tradeoffs/")
    traces = drawn(page, "#tradeoff-figure")

    engine_points = sum(n for role, n, _ in traces if role == "engines")
    assert engine_points == len(engines)
    assert {role for role, _, _ in traces} == {"engines", "pareto", "production"}
    assert len({axis for _, _, axis in traces}) == len(classes)  # one facet per class
    assert sum(n for role, n, _ in traces if role == "production") == 1
    page.screenshot(path=str(ARTIFACTS / "tradeoff-explorer.png"), full_page=True)

    page.select_option("#tradeoff-filters select[name=class]", classes[0].slug)
    page.wait_for_function("document.location.search.includes('class=')")
    traces = drawn(page, "#tradeoff-figure")
    assert len({axis for _, _, axis in traces}) == 1
    assert sum(n for role, n, _ in traces if role == "engines") == len(engines) // 3
    assert f"class={classes[0].slug}" in page.url

    click_first_point(page)
    page.wait_for_url(re.compile(r"/engines/\d+/$"), timeout=10000)
    assert errors == []


def test_the_model_page_fleet_and_trend_draw_without_errors(live_server, browser, alice, seeded):
    model, classes, _ = seeded
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    sign_in(page, live_server, "alice")

    page.goto(f"{live_server.url}{model.get_absolute_url()}")
    assert drawn(page, "#tradeoff-figure")
    assert page.locator("#best-engine-table tbody tr").count() == 1
    page.screenshot(path=str(ARTIFACTS / "model-home.png"), full_page=True)

    page.goto(f"{live_server.url}/models/{model.pk}/fleet/")
    (role, cells, _), *_ = drawn(page, "#fleet-figure")
    assert role == "fleet" and cells == len(classes)
    page.screenshot(path=str(ARTIFACTS / "fleet-view.png"), full_page=True)

    page.goto(f"{live_server.url}/models/{model.pk}/trend/?metric=speed")
    assert any(role == "trend" for role, _, _ in drawn(page, "#trend-figure"))
    page.screenshot(path=str(ARTIFACTS / "version-trend.png"), full_page=True)
    assert errors == []


def test_a_click_on_a_fleet_cell_opens_its_engine(live_server, browser, alice, seeded):
    model, classes, _ = seeded
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    sign_in(page, live_server, "alice")
    page.goto(f"{live_server.url}/models/{model.pk}/fleet/")
    drawn(page, "#fleet-figure")
    link = page.evaluate("document.querySelector('#fleet-figure').data[0].customdata[0][1]")
    assert re.fullmatch(r"/engines/\d+/", link)

    click_cell(page, "#fleet-figure", column=1, row=0)

    page.wait_for_url(f"{live_server.url}{link}", timeout=10000)
    assert errors == []
