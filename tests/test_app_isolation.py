"""At run time, each hub app works with only the apps below it installed, and loads none above.

The layer contract (pyproject.toml, checked by import-linter in test_layers.py) reads
the import statements; this starts Django in a fresh process with an app and the
apps below it installed, imports every module of the app, and looks at what got
loaded. It catches what a static reading cannot: an import built from a string, an
AppConfig.ready() that reaches up, a model that needs a higher app to load.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.layering import layers

ROOT = Path(__file__).resolve().parents[1]

CHECK = """
import importlib, pkgutil, sys
import django
from django.conf import settings
import deployhub.settings as base

app, below, above = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
values = {name: getattr(base, name) for name in dir(base) if name.isupper()}
ours = below + [app]
values["INSTALLED_APPS"] = [
    name for name in base.INSTALLED_APPS if not name.startswith("deployhub.") or name in ours
]
settings.configure(**values)
django.setup()
package = importlib.import_module(app)
for module in pkgutil.walk_packages(package.__path__, app + "."):
    if ".migrations" not in module.name:
        importlib.import_module(module.name)
higher = [name.split(".") for name in above]
loaded = sorted(name for name in sys.modules if name.split(".")[:2] in higher)
assert not loaded, f"{app} loaded higher apps' modules: {loaded}"
print("ok", app)
"""


def apps():
    """Every app in the layers below the pages, with the apps below and above its layer."""
    ordered, params = layers(), []
    for index, layer in enumerate(ordered[:-1]):
        below = [app for lower in ordered[:index] for app in lower]
        above = [app for higher in ordered[index + 1 :] for app in higher]
        for app in layer:
            siblings = [other for other in layer if other != app]
            params.append(pytest.param(app, below, above + siblings, id=app))
    return params


def check(app, below, above):
    return subprocess.run(
        [sys.executable, "-c", CHECK, app, ",".join(below), ",".join(above)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(("app", "below", "above"), apps())
def test_an_app_runs_with_only_the_apps_below_it_installed(app, below, above):
    completed = check(app, below, above)

    assert completed.returncode == 0, completed.stderr[-3000:]
    assert f"ok {app}" in completed.stdout


def test_an_app_that_loads_one_counted_above_it_fails_the_check():
    # jobs stores results of registry's versions: counted below registry, it must fail.
    completed = check(
        "deployhub.jobs", ["deployhub.teams", "deployhub.devices"], ["deployhub.registry"]
    )

    # Refused either way: registry's models will not load uninstalled, or its modules are listed.
    assert completed.returncode != 0
    assert "deployhub.registry" in completed.stderr.splitlines()[-1]


def test_every_installed_hub_app_has_its_place_in_the_layers():
    from django.conf import settings

    placed = {app for layer in layers() for app in layer}
    installed = {app for app in settings.INSTALLED_APPS if app.startswith("deployhub.")}

    assert installed <= placed, f"not in the layer contract: {sorted(installed - placed)}"
    assert layers()[0] == ["deployhub.teams"]


def test_an_app_that_loads_a_module_counted_above_it_fails_the_check():
    # engines states its release gates with deployhub.core.gates: with the neutral package
    # counted above engines, the check fails and names what was loaded.
    ordered = layers()
    below = [app for layer in ordered[:-3] for app in layer if app != "deployhub.engines"]
    completed = check("deployhub.engines", below, ["deployhub.core"])

    assert completed.returncode != 0
    assert "deployhub.engines loaded higher apps' modules: ['deployhub.core'," in completed.stderr
    assert "'deployhub.core.gates'" in completed.stderr
