"""A pipeline-scoped token: an allowlist of what CI may do, walked over every API v1 route.

It may read, upload, build, benchmark and request a release; it may never review,
override a gate, promote, roll back or drain a device. A route added later without a
decision is closed to pipelines, so this walk fails loudly rather than letting one through.
"""

import pytest
from django.urls import URLPattern, get_resolver

from tests.api_calls import token_for

pytestmark = pytest.mark.django_db

DECIDING = {
    "api_release_reviews",
    "api_release_override",
    "api_release_promote",
    "api_release_rollback",
    "api_device_drain",
    "api_device_revoke",
    "api_class_enrolment_tokens",
    "api_enrolment_token_revoke",
}
ARGUMENTS = {"int": "999999", "slug": "no-such-class", "str": "benchmarks"}


def api_routes():
    """Every API v1 route as (name, a path with made-up arguments)."""
    api = next(p for p in get_resolver().url_patterns if str(p.pattern) == "api/v1/")
    routes = []
    for pattern in api.url_patterns:
        assert isinstance(pattern, URLPattern)
        path = str(pattern.pattern)
        for converter, value in ARGUMENTS.items():
            while f"<{converter}:" in path:
                start = path.index(f"<{converter}:")
                path = path[:start] + value + path[path.index(">", start) + 1 :]
        routes.append((pattern.name, f"/api/v1/{path}"))
    return routes


def answers(client, path, headers):
    """The route's answers to GET and POST, leaving out methods it does not have (405)."""
    got = [client.get(path, **headers), client.post(path, "{}", "application/json", **headers)]
    return [response for response in got if response.status_code != 405]


def test_it_refuses_a_pipeline_token_exactly_on_the_deciding_actions(client, alice):
    pipeline = token_for(alice, scope="pipeline")
    refused = set()
    for name, path in api_routes():
        for response in answers(client, path, pipeline):
            if response.status_code == 403 and "pipeline token" in response.json()["error"]:
                refused.add(name)
    assert refused == DECIDING


def test_a_full_token_is_not_refused_for_its_scope_anywhere(client, alice):
    full = token_for(alice)
    for name, path in api_routes():
        for response in answers(client, path, full):
            body = response.content.decode()
            assert "pipeline token" not in body, name


def test_it_closes_a_route_nobody_decided_on_to_pipelines(rf, alice):
    """A new view with only @token_required: a pipeline token gets 403, a full one gets in."""
    from django.http import JsonResponse

    from deployhub.api.auth import token_required

    @token_required
    def new_view(request):
        return JsonResponse({"ok": True})

    for scope, expected in (("pipeline", 403), ("full", 200)):
        headers = token_for(alice, scope=scope)
        assert new_view(rf.get("/api/v1/new", **headers)).status_code == expected
