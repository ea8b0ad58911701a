"""Bench row of the dashboard's figures: the explorer and the model page with 10,000 results.

Seeds one model with 5 versions over 3 device classes (180 engines), 10,000 benchmark
runs and 2,000 accuracy runs (tests/figure_results.py), then times the explorer's JSON
and the model page through Django's test client (median of several requests, server
time), and the explorer figure's draw in Chromium (Plotly.newPlot on that JSON).
"""

import shutil
import statistics
import time

from bench.rows import note, row

BENCHMARKS, ACCURACIES, REQUESTS = 10_000, 2_000, 7
SERVER_MS, DRAW_MS = 300, 1000


def seed():
    """Return (the user, the model) with the results seeded."""
    from django.contrib.auth import get_user_model

    from deployhub.registry.models import Model
    from deployhub.teams.models import Membership, Role, Team
    from tests.figure_results import seed_classes, seed_engines, seed_runs

    team = Team.objects.create(name="Figures", slug="figures")
    user = get_user_model().objects.create_user("bench-figures")
    Membership.objects.create(user=user, team=team, role=Role.ADMIN)
    model = Model.objects.create(team=team, name="bench-figures", created_by=user)
    versions = [
        model.versions.create(number=n, file=f"models/bench-{n}.onnx", sha256=f"{n:064d}", size=1)
        for n in range(1, 6)
    ]
    engines = seed_engines(versions, seed_classes(team, prefix="bench"))
    seed_runs(engines, BENCHMARKS, ACCURACIES)
    return user, model


def server_ms(client, url):
    """Return (median ms of REQUESTS requests, after one warm-up; the response's size)."""
    client.get(url)
    times = []
    for _ in range(REQUESTS):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    return statistics.median(times), response.content


def draw_ms(figure_json):
    """Return the median ms of Plotly.newPlot of the figure in headless Chromium."""
    from playwright.sync_api import sync_playwright
    from plotly.offline import get_plotlyjs

    html = f"<html><body><div id=f></div><script>{get_plotlyjs()}</script></body></html>"
    script = """async (body) => { const times = [];
        for (let i = 0; i < 5; i++) { const el = document.getElementById('f'); Plotly.purge(el);
          const t = performance.now();
          await Plotly.newPlot(el, body.figure.data, body.figure.layout);
          times.push(performance.now() - t); }
        times.sort((a, b) => a - b); return times[2]; }"""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"))
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_content(html)
        value = page.evaluate(script, figure_json)
        browser.close()
    return value


def bench_figures():
    """Rows: explorer JSON and model page server time; the explorer's draw in Chromium."""
    import json

    from django.conf import settings
    from django.test import Client

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    user, model = seed()
    client = Client()
    client.force_login(user)
    json_ms, body = server_ms(client, f"/models/{model.pk}/tradeoffs.json")
    page_ms, _ = server_ms(client, f"/models/{model.pk}/")
    rows = [
        row("explorer JSON, 10,000 results: server time (median)", json_ms, "ms", SERVER_MS),
        row("model page, 10,000 results: server time (median)", page_ms, "ms", SERVER_MS),
    ]
    if not shutil.which("chromium"):
        return rows + [note("explorer draw in Chromium", None, "ms", "NOT RUN", "no chromium")]
    # The version page under 20 concurrent users: bench_load_embedded (bench/load.py).
    return rows + [
        row("explorer figure: draw in Chromium (median)", draw_ms(json.loads(body)), "ms", DRAW_MS)
    ]
