"""Templates keep the layers too: an app's templates name no higher app's URL, tag library
or template. A higher app draws on a lower app's page through the page's contributed
sections (deployhub/core/sections.py), as its code does through imports; a partial several
apps draw lives with the app that owns its data, or at the top of templates/ when it
belongs to none. There are no exceptions: a page that needs a higher app's partial takes it
as a contributed section.
"""

import re

import pytest
from django.template.backends.django import get_installed_libraries
from django.urls import URLPattern, URLResolver, get_resolver

from tests.layering import ROOT, layers

URL = re.compile(r"{%\s*url\s+['\"]([\w-]+)['\"]")
LOAD = re.compile(r"{%\s*load\s+([\w\s]+?)\s*%}")
TEMPLATE = re.compile(r"{%\s*(?:include|extends)\s+['\"]([\w-]+)/")


def ranks():
    """Each hub app's layer number, lowest 0; the pages (deployhub/urls.py, views) are last."""
    ordered = layers()
    rank = {app: index for index, layer in enumerate(ordered) for app in layer}
    rank["deployhub.views"] = rank["deployhub.urls"] = len(ordered)
    return rank


def app_of(module, rank):
    """The hub app a module belongs to (deployhub.<app>), or None outside the hub's apps."""
    parts = module.split(".")
    for name in (".".join(parts[:2]),):
        if name in rank:
            return name
    return None


def url_apps(rank):
    """Each URL name, with the app whose view answers it."""
    names, pending = {}, list(get_resolver().url_patterns)
    while pending:
        pattern = pending.pop()
        if isinstance(pattern, URLResolver):
            pending.extend(pattern.url_patterns)
        elif isinstance(pattern, URLPattern) and pattern.name:
            names[pattern.name] = app_of(pattern.callback.__module__, rank)
    return names


def references(text, rank, urls):
    """The apps a template's text names, with what names them."""
    libraries = get_installed_libraries()
    for name in URL.findall(text):
        yield urls.get(name), f"url {name}"
    for group in LOAD.findall(text):
        for library in group.split():
            yield app_of(libraries.get(library, ""), rank), f"load {library}"
    for folder in TEMPLATE.findall(text):
        yield app_of(f"deployhub.{folder}", rank), f"template {folder}/"


def test_no_template_names_a_higher_apps_url_tag_or_template():
    rank = ranks()
    urls = url_apps(rank)
    upward = []
    for path in sorted((ROOT / "templates").glob("*/**/*.html")):
        owner = app_of(f"deployhub.{path.relative_to(ROOT / 'templates').parts[0]}", rank)
        if owner is None:
            continue
        for named, what in references(path.read_text(), rank, urls):
            if named is not None and named != owner and rank[named] >= rank[owner]:
                upward.append(f"{path.relative_to(ROOT)}: {what} ({named})")
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{% url 'figure_release_comparison' 1 %}", "url figure_release_comparison"),
        ("{% load figures %}", "load figures"),
        ('{% include "figures/_model_home.html" %}', "template figures/"),
    ],
)
def test_a_higher_reference_in_a_lower_template_is_found(text, expected):
    rank = ranks()
    found = dict((what, app) for app, what in references(text, rank, url_apps(rank)))
    assert found[expected] == "deployhub.figures"
    assert rank[found[expected]] > rank["deployhub.releases"]
