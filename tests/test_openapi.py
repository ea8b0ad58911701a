"""API v1's OpenAPI schema as a client reads it, its docs page, and the docs written from it.

Every check walks the operations the schema holds when it runs: an operation added to the
API is checked without a list to update here.
"""

import importlib.util
import re
from collections import Counter
from urllib.parse import urlsplit

import pytest
from django.test import Client
from ninja.openapi.schema import OpenAPISchema
from playwright.sync_api import expect

from deployhub.api.openapi import api
from tests.conftest import ROOT

SCHEMA_PATH = "/api/v1/openapi.json"
# The errors every call may answer (docs/api.md's table): a bad field, no token, a role or a
# pipeline token, another team's object, a locked-out address.
ERRORS = {"400", "401", "403", "404", "429"}
API_DOC = ROOT / "docs" / "api.md"
REFERENCE_DOC = ROOT / "docs" / "api-reference.md"
METHOD = r"(GET|POST|PUT|PATCH|DELETE)"


def load_reference_script():
    """scripts/api_reference.py as a module (scripts/ is not a package)."""
    path = ROOT / "scripts" / "api_reference.py"
    spec = importlib.util.spec_from_file_location("api_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


api_reference = load_reference_script()


@pytest.fixture
def schema(db):
    """The schema as a client without a token fetches it."""
    answer = Client().get(SCHEMA_PATH)
    assert answer.status_code == 200, answer.content[:500]
    assert answer["Content-Type"].startswith("application/json")
    return answer.json()


def operations(schema):
    found = list(api_reference.operations(schema))
    assert found, f"{SCHEMA_PATH} holds no operation"
    return found


def test_the_schema_is_openapi_3_1_and_served_without_a_token(schema):
    assert schema["openapi"].startswith("3.1."), schema["openapi"]
    assert schema["info"]["title"] and schema["info"]["description"]


def test_every_operation_has_a_unique_id_a_description_and_a_tag(schema):
    found = operations(schema)
    ids = Counter(operation.get("operationId") for _, _, operation in found)
    assert not [name for name, times in ids.items() if times > 1 or not name], ids
    undescribed = [f"{m} {p}" for m, p, op in found if not (op.get("description") or "").strip()]
    untagged = [f"{m} {p}" for m, p, op in found if not op.get("tags")]
    assert not undescribed, f"operations without a docstring: {undescribed}"
    assert not untagged, f"operations without a tag: {untagged}"


def test_every_operation_declares_its_errors_with_the_error_body(schema):
    missing, bodiless = {}, []
    for method, path, operation in operations(schema):
        declared = set(operation["responses"])
        if ERRORS - declared:
            missing[f"{method} {path}"] = sorted(ERRORS - declared)
        for status in sorted(code for code in declared if code >= "400"):
            body = operation["responses"][status].get("content", {}).get("application/json", {})
            if body.get("schema", {}).get("$ref") != "#/components/schemas/Error":
                bodiless.append(f"{method} {path} {status}")
    assert not missing, f"errors not declared: {missing}"
    assert not bodiless, f'errors whose body is not {{"error": ...}}: {bodiless}'


def test_no_two_body_schemas_share_a_name(monkeypatch):
    """django-ninja names each body schema after its class and keeps the last one of a name:
    two areas' `GateOut` classes of different fields would give one of them the other's."""
    shapes = {}
    keep = OpenAPISchema.add_schema_definitions

    def recorded(self, definitions):
        for name, definition in definitions.items():
            shapes.setdefault(name, set()).add(shape(definition))
        keep(self, definitions)

    monkeypatch.setattr(OpenAPISchema, "add_schema_definitions", recorded)
    api.get_openapi_schema(path_params={})
    clashes = {name: sorted(found) for name, found in shapes.items() if len(found) > 1}
    assert not clashes, f"schemas of one name and different fields (rename one): {clashes}"


def shape(definition):
    """What tells two schemas apart: their fields, or their values for an enum."""
    return tuple(sorted(definition.get("properties", {}))) or tuple(definition.get("enum", ()))


def documented(markdown):
    """The calls docs/api.md gives a heading, as "GET jobs/<id>": a heading's `GET`, `PUT
    path` spans name each method the path after them takes."""
    calls, methods = set(), []
    for heading in re.findall(r"^#+ .*$", markdown, flags=re.MULTILINE):
        for span in re.findall(r"`([^`]+)`", heading):
            if found := re.fullmatch(METHOD + r"(?: (\S+))?", span):
                methods.append(found[1])
                if found[2]:  # a query shown after the path ("?model=<id>") is not part of it
                    path = re.split(r"[?\[]", found[2])[0]
                    calls.update(f"{method} {path}" for method in methods)
                    methods = []
    return calls


def test_every_operation_has_its_heading_in_the_api_docs(schema):
    headings = documented(API_DOC.read_text())
    shown = api_reference.shown_path
    wanted = [f"{method} {shown(path)}" for method, path, _ in operations(schema)]
    missing = [call for call in wanted if call not in headings]
    assert not missing, "docs/api.md has no heading for:\n" + "\n".join(
        f"## `{call}`" for call in missing
    )


def test_the_api_reference_is_up_to_date(schema):
    written = REFERENCE_DOC.read_text() if REFERENCE_DOC.exists() else ""
    current = api_reference.reference(schema, api_reference.cli_commands())
    assert written == current, "docs/api-reference.md is out of date: run `make api-reference`"


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_docs_page_shows_every_operation_from_this_hub_alone(live_server, browser):
    """Swagger UI at /api/docs/ in Chromium: every operation listed, no console error, no
    request to another host (its assets are the hub's own), nothing its CSP refuses."""
    schema = Client().get(SCHEMA_PATH).json()
    wanted = sorted((method, path) for method, path, _ in operations(schema))
    page = browser.new_page()
    page.set_default_timeout(30_000)
    errors, requested, elsewhere = [], [], []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.route("**/*", lambda route: stay_home(route, live_server.url, requested, elsewhere))
    page.add_init_script(
        "window.refused = []; document.addEventListener('securitypolicyviolation',"
        " (event) => window.refused.push(event.violatedDirective + ' ' + event.blockedURI));"
    )
    answer = page.goto(f"{live_server.url}/api/docs/")
    assert answer.status == 200
    expect(page.locator(".opblock")).to_have_count(len(wanted))
    shown = page.eval_on_selector_all(
        ".opblock",
        "blocks => blocks.map(block => [block.querySelector('.opblock-summary-method')"
        ".textContent, block.querySelector('.opblock-summary-path').dataset.path])",
    )
    policy = answer.headers.get("content-security-policy")
    assert sorted(map(tuple, shown)) == wanted
    assert page.evaluate("window.refused") == [], f"Content-Security-Policy: {policy}"
    assert f"{live_server.url}{SCHEMA_PATH}" in requested  # what the page asked for was seen
    assert not elsewhere, f"requests that left the hub: {elsewhere}"
    assert not errors, errors


def stay_home(route, hub_url, requested, elsewhere):
    """Record every request; let one to the hub through, refuse any other (data: is local)."""
    requested.append(route.request.url)
    url = urlsplit(route.request.url)
    if url.scheme in ("data", "blob") or url.netloc == urlsplit(hub_url).netloc:
        route.continue_()
    else:
        elsewhere.append(route.request.url)
        route.abort()
