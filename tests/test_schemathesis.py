"""Schemathesis over every operation of API v1, read from the running hub's own schema.

The schema is fetched from /api/v1/openapi.json as a client would (in-process, through the
hub's WSGI application), so an operation added to the API is called here without a list
to update. Every operation is called as three callers: an engineer's personal token, a
viewer's, and an engineer's pipeline token. Path ids mostly name real objects of the
team (a version, an engine, a job, a release...), so the calls reach their readers, not
only their 404s. Each answer must be no 5xx, a status the operation declares, the content
type it declares, and a body its schema describes. Derandomised: CI sees the same cases.
"""

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from deployhub.devices.models import EnrolmentToken
from deployhub.engines.models import AutoRun
from deployhub.jobs.actions import claim_job
from deployhub.releases.actions import propose
from deployhub.teams.models import Role, TokenScope, Webhook
from tests.api_calls import token_for
from tests.conftest import make_user, queued_benchmark, stored_engine
from tests.figure_results import seed_runs

pytestmark = pytest.mark.django_db

SCHEMA_PATH = "/api/v1/openapi.json"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Cases per operation for each caller, few: the file runs in about a minute on two cores.
# The engineer reaches most code; the others mostly meet the same reads, or their 403.
EXAMPLES = {"engineer": 6, "viewer": 3, "pipeline": 3}
# Bodies and queries as the schema describes them: the hostile ones are test_fuzz_api.py's.
# The token is each caller's: Schemathesis makes none up (30 made-up ones lock an address out).
CONFIG = {
    "generation": {"mode": "positive", "deterministic": True, "with-security-parameters": False},
    "phases": {"coverage": {"enabled": False}},
}
# Out of every few cases, this many point their path ids and body fields at real objects.
REAL_OUT_OF = (3, 4)


@pytest.fixture
def hub_app():
    """The hub's WSGI application, answering inside the test's transaction: Django's test
    client does the same (a request's end would otherwise close the test's connection)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield WSGIHandler()
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


class World:
    """The team's objects the cases point at: a running job, an engine with a benchmark run,
    a release, an auto run, a device, a webhook, an enrolment token (as test_fuzz_api.py's)."""

    def __init__(self, alice, version, device_class, make_device, storage_root):
        device, _ = make_device()
        engine = stored_engine(version, device_class)
        (storage_root / "engines").mkdir(exist_ok=True)
        (storage_root / "engines" / "test.onnx").write_bytes(b"not read")
        job = queued_benchmark(version, device_class, alice)
        claim_job(job.pk, device, 1)
        seed_runs([engine], 1, 0)
        enrolment = EnrolmentToken(device_class=device_class, created_by=alice)
        enrolment.issue()
        enrolment.save()
        team = version.team
        run = AutoRun.objects.create(model_version=version, device_class=device_class)
        self.ids = {
            "models": version.model_id,
            "versions": version.pk,
            "engines": engine.pk,
            "jobs": job.pk,
            "devices": device.pk,
            "releases": propose(engine, alice, "schemathesis").pk,
            "auto-runs": run.pk,
            "webhooks": Webhook.objects.create(team=team, url="https://example.com/hook").pk,
            "enrolment-tokens": enrolment.pk,
        }
        # What a path's text parameter names after a segment: a class, a team, a results CSV.
        self.names = {"device-classes": device_class.slug, "teams": team.slug}
        self.names["results"] = "benchmarks"
        # A body's fields the hub looks up: the team's own names, a backend it builds.
        self.fields = {
            **{"device_class": device_class.slug, "team": team.slug, "backend": "onnxruntime"},
            **{"decision": "approve", "gate": "parity", "kind": "validation"},
            **{"scenario": "single-stream", "task": "classification"},
        }

    def value(self, before, name):
        """The real object's id (or name) for a path parameter after the segment `before`."""
        return (self.ids if name == "pk" else self.names).get(before)


@pytest.fixture
def world(alice, version, device_class, make_device, storage_root):
    return World(alice, version, device_class, make_device, storage_root)


@pytest.fixture
def live_schema(hub_app, world):
    """The schema the hub serves now, its path ids mostly mapped to the world's objects."""
    config = SchemathesisConfig.from_dict(CONFIG)
    schema = schemathesis.openapi.from_wsgi(SCHEMA_PATH, hub_app, config=config)
    for hook in real_ids(world):
        schema.hook(hook)
    return schema


def real_ids(world):
    """Hooks that point most cases at the team's real objects: a {pk} after `jobs/` becomes
    the world's job, a {slug} after `teams/` its team's slug, and a body's fields the world
    knows (device_class, team, backend...) take its values."""

    def flatmap_path_parameters(context, path_parameters):
        if not path_parameters:
            return st.just(path_parameters)
        segments = context.operation.path.strip("/").split("/")
        real = dict(path_parameters)
        for name in path_parameters:
            at = next(i for i, segment in enumerate(segments) if f"{{{name}}}" in segment)
            value = world.value(segments[at - 1], name)
            real[name] = path_parameters[name] if value is None else value
        return mostly(real, path_parameters)

    def flatmap_body(context, body):
        if not isinstance(body, dict):
            return st.just(body)
        known = {name: world.fields[name] for name in body if name in world.fields}
        return mostly({**body, **known}, body)

    return flatmap_path_parameters, flatmap_body


def mostly(real, drawn):
    """The real value in most cases, the drawn one in the others (Hypothesis draws both)."""
    real_share, out_of = REAL_OUT_OF
    return st.sampled_from([real] * real_share + [drawn] * (out_of - real_share))


def token_of(kind, team):
    """The Authorization header of one of the three callers of the team."""
    role = Role.VIEWER if kind == "viewer" else Role.ENGINEER
    user = make_user(f"{kind}-caller", team, role)
    scope = TokenScope.PIPELINE if kind == "pipeline" else TokenScope.FULL
    return {"Authorization": token_for(user, scope)["HTTP_AUTHORIZATION"]}


def operations(schema):
    """Every operation the schema holds now; one the schema cannot describe is a failure."""
    found = []
    for result in schema.get_all_operations():
        found.append(result.ok())  # an InvalidSchema is raised here, naming the operation
    assert found, f"{SCHEMA_PATH} holds no operation"
    return found


def called(operation, headers, examples):
    """Call one operation with drawn cases; return the first failure, told as a curl
    command that reproduces it, or None."""

    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # the case as drawn: no time spent shrinking
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy())
    def call(case):
        case.call_and_validate(headers=headers, checks=CHECKS)

    try:
        call()
    except (Exception, BaseExceptionGroup) as failure:  # Schemathesis's failures, and any other
        return f"{operation.label}: {failure}"
    return None


def test_every_operation_answers_each_caller_as_its_schema_says(live_schema, demo_team):
    failures = []
    for kind, examples in EXAMPLES.items():
        headers = token_of(kind, demo_team)
        for operation in operations(live_schema):
            if failure := called(operation, headers, examples):
                failures.append(f"as the {kind}, {failure}")
    assert not failures, f"{len(failures)} failures:\n\n" + "\n\n".join(failures)
