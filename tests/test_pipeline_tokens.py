"""A pipeline-scoped token: an allowlist of what CI may do, walked over every API v1 route.

It may read, upload, build, benchmark and request a release; it may never review,
override a gate, promote, roll back, drain or revoke a device, or handle enrolment tokens,
webhooks, the audit trail or a team's settings. A route added later without a
decision is closed to pipelines, so this walk fails loudly rather than letting one through.
"""

import pytest
from django.urls import URLPattern, get_resolver

from deployhub.api.auth import Refused
from tests.api_calls import token_for

pytestmark = pytest.mark.django_db

# The calls a pipeline token is refused, as "<method> <route>": an operation's method is
# part of it, since one path may answer a read (open to pipelines) and a change (not).
DECIDING = {
    "POST releases/<int:pk>/reviews",
    "POST releases/<int:pk>/override",
    "POST releases/<int:pk>/promote",
    "POST releases/<int:pk>/rollback",
    "POST devices/<int:pk>/drain",
    "POST devices/<int:pk>/revoke",
    "GET device-classes/<slug:slug>/enrolment-tokens",
    "POST device-classes/<slug:slug>/enrolment-tokens",
    "POST enrolment-tokens/<int:pk>/revoke",
    "POST device-classes",
    "POST jobs/<int:pk>/cancel",
    "GET audit",
    "GET webhooks",
    "POST webhooks",
    "GET teams/<slug:slug>/settings",
}
ARGUMENTS = {"int": "999999", "slug": "no-such-class", "str": "benchmarks"}


def api_routes():
    """Every API v1 route, once, as (its pattern, a path with made-up arguments): the device
    protocol's, the django-ninja operations' and the hand-written calls', each mounted at
    api/v1/ (an operation path's methods share one route)."""
    mounts = [p for p in get_resolver().url_patterns if str(p.pattern) == "api/v1/"]
    routes = {}
    for pattern in (pattern for api in mounts for pattern in api.url_patterns):
        assert isinstance(pattern, URLPattern)
        path = route = str(pattern.pattern)
        for converter, value in ARGUMENTS.items():
            while f"<{converter}:" in path:
                start = path.index(f"<{converter}:")
                path = path[:start] + value + path[path.index(">", start) + 1 :]
        routes.setdefault(route, f"/api/v1/{path}")
    return routes.items()


def answers(client, path, headers):
    """The route's answers to GET and POST, by method, leaving out the methods it does not
    have (405)."""
    got = {
        "GET": client.get(path, **headers),
        "POST": client.post(path, "{}", "application/json", **headers),
    }
    return {method: response for method, response in got.items() if response.status_code != 405}


def test_it_refuses_a_pipeline_token_exactly_on_the_deciding_actions(client, alice):
    pipeline = token_for(alice, scope="pipeline")
    refused = set()
    for route, path in api_routes():
        for method, response in answers(client, path, pipeline).items():
            if response.status_code == 403 and "pipeline token" in response.json()["error"]:
                refused.add(f"{method} {route}")
    assert refused == DECIDING


def test_a_full_token_is_not_refused_for_its_scope_anywhere(client, alice):
    full = token_for(alice)
    for route, path in api_routes():
        for method, response in answers(client, path, full).items():
            refused = response.status_code == 403 and "pipeline token" in response.json()["error"]
            assert not refused, f"{method} {route}"


def test_it_closes_a_route_nobody_decided_on_to_pipelines(rf, alice):
    """A new operation with the API's default auth: a pipeline token gets 403, a full one
    gets in; auth=PIPELINES opens it to both."""
    from deployhub.api.openapi import HubAPI
    from deployhub.api.openapi import api as hub_api
    from deployhub.api.v1 import PIPELINES

    new_api = HubAPI(auth=hub_api.auth, urls_namespace="new-operations")
    new_api.exception_handler(Refused)(lambda request, exc: exc.response)
    new_api.get("/new")(lambda request: {"ok": True})
    new_api.get("/open", auth=PIPELINES)(lambda request: {"ok": True})
    routes = {str(pattern.pattern): pattern.callback for pattern in new_api.url_patterns()}
    new, opened = routes["new"], routes["open"]

    for scope, closed, open_ in (("pipeline", 403, 200), ("full", 200, 200)):
        headers = token_for(alice, scope=scope)
        assert new(rf.get("/api/v1/new", **headers)).status_code == closed
        assert opened(rf.get("/api/v1/open", **headers)).status_code == open_
