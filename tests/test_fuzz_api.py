"""Hostile bodies on every API v1 call and every page: never a 5xx, and /api/v1/ errors are JSON.

Every route of the URLconf is walked (a route added later is fuzzed too) and pointed at
real objects of the cast's team (a version, an engine, a running job, a release...), so the
bodies reach the views' readers, not only their 404s. Each route gets two rounds:

- a sweep: every field its view reads, all set at once to one hostile value (a list, an
  object, "²", a NUL byte, a lone surrogate, 5,000 characters, 2**70, NaN...), as JSON and
  as a form, then JSON nested 100,000 deep and bodies that are not UTF-8; for pages, also as
  a user in no team;
- Hypothesis: a caller (nobody, a personal token, a device token, a session of a team's
  admin or of a user in no team, mostly the one the route serves), a method and a body
  drawn from the same values mixed: JSON objects, other JSON, forms, raw forms that are not
  UTF-8, multipart with a file, fields missing. Derandomised: CI sees the same examples.
"""

import inspect
import json
import re
import time
import uuid
from collections import Counter
from urllib.parse import urlencode

import pytest
from django import forms
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deployhub.api.auth import DEVICE_TOKEN_AT_PERSON_CALL, PERSON_TOKEN_AT_DEVICE_CALL
from deployhub.engines.models import AutoRun
from deployhub.jobs.actions import claim_job, submit_job
from deployhub.jobs.models import JobKind
from deployhub.releases.actions import propose
from deployhub.teams.models import ApiToken, Webhook
from tests.api_calls import token_for
from tests.conftest import ASSETS, PASSWORD, stored_engine
from tests.figure_results import seed_runs
from tests.url_routes import body_fields, filled, routes, view_functions
from workers.fingerprint import shape as fingerprint_shape

pytestmark = pytest.mark.django_db

EXAMPLES = {"api": 12, "page": 5}
FUZZ = settings(
    deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
# Not fuzzed: Django's admin (its own forms), signing in and out (they would end the
# session or lock the cast out), and the sample model (it takes no field; adding its
# 45 MB ResNet-18 takes seconds).
SKIPPED = {"login", "logout", "add_resnet18_sample"}
CALLERS = ("nobody", "token", "device", "session", "no-team session")

# Field names the hub reads somewhere, for routes to receive fields they do not read.
FIELDS = (
    "attempt backend build_config comment contract decision description device_class "
    "draining events fingerprint gate justification kind log message name note notes opset "
    "preprocessing progress reason result scenario state team tags url unknown_key"
).split()
NASTY = [
    *["", " ", "\x00", "a\x00b", "²", "١٢", "-1", "0", "1", "9" * 40, "1e400", "NaN", "true"],
    *["null", "[]", "{}", '{"a": NaN}', "[" * 5000, "../../etc/passwd", "<script>x</script>"],
    *["gerät モデル 🚀", "x" * 5000, "onnxruntime", "int8"],
]
# Text a form can carry (no lone surrogates: they cannot be sent as UTF-8).
form_text = st.one_of(
    st.sampled_from(NASTY),
    st.text(max_size=30),
    st.builds(lambda char, count: char * count, st.characters(codec="utf-8"), st.integers(1, 6000)),
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 2, -1, 0.5, 2**63, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    form_text,
    st.sampled_from(["\ud800", "lone \udfff"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


def deep(depth, opener):
    """JSON nested depth levels: [[[...]]] or {"a": {"a": ... 1}}."""
    closer = "]" if opener == "[" else "}"
    return (opener * depth + ("" if opener == "[" else "1") + closer * depth).encode()


# Bodies that are not a JSON object the hub can read.
RAW_JSON = [
    deep(100_000, "["),
    deep(100_000, '{"a":'),
    deep(900, "["),
    deep(40, '{"a":'),
    b'{"device_class": "\xff\xfe", "name": "\xc3"}',
    b"\xff\xfe\xfd",
    '{"message": "\ud800", "name": "\ud800"}'.encode("utf-16-le", "surrogatepass"),
    b'{"a": NaN, "b": Infinity}',
    b'{"attempt": 1e400}',
    b'{"attempt": ' + b"9" * 5000 + b"}",
    b"[1]",
    b"{",
]
# The sweep's values, each set on every field a view reads at once.
JSON_SWEEP = [{"a": 1}, "a\x00b", "\ud800", 2**70, -1, None]
FORM_SWEEP = ["²", "a\x00b", "x" * 5000, "9" * 40, "-1"]
# One field at a time, the others right, so each reaches its reader (a job's heartbeat
# reads its attempt before its progress): these values, and these right ones.
ONE_AT_A_TIME = {
    "json": [["x"], "x" * 5000, "²", float("nan"), 10**400],
    "form": ["x" * 5000, "²", "9" * 5000],
}
RIGHT = {
    **{"attempt": 1, "progress": 0.5, "message": "m", "log": "l\n", "state": "failed"},
    **{"result": {}, "error": "e", "fingerprint": {"cpu": {"model": "x"}}, "draining": True},
    **{"backend": "onnxruntime", "build_config": {}, "opset": 17, "name": "fuzz"},
    **{"description": "d", "notes": "n", "kind": "validation", "note": "n", "comment": "c"},
    **{"decision": "approve", "gate": "parity", "justification": "j", "reason": "r"},
    **{"scenario": "single-stream", "batch_size": 1, "tags": "a", "slug": "fuzz-class"},
    **{"frame_budget_ms": 33.3, "url": "https://example.com/h", "atol": 0.001, "rtol": 0.001},
}
# A device's fingerprint, each field the hub reads wrong in turn, inside too (a fingerprint
# whose os was a string made every later heartbeat of its device a 500).
FINGERPRINT_FIELDS = sorted(fingerprint_shape())
WRONG_INSIDE = {"version": 3, "flags": "avx2", "machine": [], "driver_api": True, "ok": "yes"}
WRONG_FIELDS = ["Linux", 3, ["x"], True, WRONG_INSIDE, [{"compute_capability": 8.6}]]
RAW_FORMS = [b"name=%ff%fe&notes=%00&team=%c3", b"a=%zz&&=&"]
FILES = [
    (ASSETS / "digits_cnn_v2.onnx").read_bytes(),
    b"PK\x03\x04" + b"\x00" * 60,
    b"\x00\xff" * 100,
]


def keys(fields):
    """Field names to draw: mostly those the route's view reads, sometimes others."""
    return st.sampled_from(fields or FIELDS) | st.sampled_from(FIELDS)


def bodies(fields, right):
    """A body of any kind: JSON (mostly objects of the view's fields, over right values or
    alone), a form, a raw form that is not UTF-8, multipart with a file."""
    drawn = st.dictionaries(keys(fields), json_values, max_size=6)
    objects = drawn | drawn.map(lambda body: {**right, **body})
    if "fingerprint" in fields:
        fingerprints = st.dictionaries(st.sampled_from(FINGERPRINT_FIELDS), json_values)
        objects |= st.builds(lambda body, fp: {**body, "fingerprint": fp}, objects, fingerprints)
    form = st.dictionaries(keys(fields), form_text, max_size=6)
    return st.one_of(
        st.tuples(st.just("json"), objects.map(lambda body: json.dumps(body).encode())),
        st.tuples(st.just("json"), json_values.map(lambda value: json.dumps(value).encode())),
        st.tuples(st.just("json"), st.sampled_from(RAW_JSON)),
        st.tuples(st.just("form"), form),
        st.tuples(st.just("raw form"), st.sampled_from(RAW_FORMS)),
        st.tuples(
            st.just("multipart"),
            st.tuples(form, st.sampled_from(["file", "x"]), st.sampled_from(FILES)),
        ),
    )


def sweep(fields, methods, group, right):
    """The deterministic round: each hostile value on every field at once, each right field
    made wrong in turn, then raw bodies (pages take forms: JSON only deep and not UTF-8).
    Sent with POST, or PATCH to a call that edits and takes no POST."""
    fields = fields or FIELDS
    method = next((m for m in ("POST", "PATCH") if m in methods), None)
    if method is None:
        return [("GET", ("query", dict.fromkeys(fields, value))) for value in FORM_SWEEP]
    return [(method, body) for _, body in posted(fields, group, right)]


def posted(fields, group, right):
    """The sweep's bodies, each as ("POST", body)."""
    requests = [("POST", ("form", dict.fromkeys(fields, value))) for value in FORM_SWEEP]
    requests.append(("POST", ("multipart", (dict.fromkeys(fields, "²"), "file", FILES[0]))))
    requests += [("POST", ("raw form", raw)) for raw in RAW_FORMS]
    requests += one_at_a_time(fields, group, right)
    if group == "page":
        return requests + [("POST", ("json", raw)) for raw in RAW_JSON[:1] + RAW_JSON[4:5]]
    requests += [("POST", ("json", json.dumps(dict.fromkeys(fields, v)))) for v in JSON_SWEEP]
    if "fingerprint" in fields:
        requests += fingerprint_sweep(fields, right)
    return requests + [("POST", ("json", raw)) for raw in RAW_JSON]


def fingerprint_sweep(fields, right):
    """Bodies of the view's right fields with each field of the fingerprint wrong in turn,
    then the right fingerprint again: the device's next heartbeat."""
    right = {name: value for name, value in right.items() if name in fields}
    wrong = [
        {**right, "fingerprint": {**right["fingerprint"], field: value}}
        for field in FINGERPRINT_FIELDS
        for value in WRONG_FIELDS
    ]
    return [("POST", ("json", json.dumps(body))) for body in [*wrong, right]]


def one_at_a_time(fields, group, right):
    """Bodies of the view's right fields with one of them wrong: JSON for the API, a form
    for pages, multipart with a model when the view reads a file."""
    right = {name: value for name, value in right.items() if name in fields}
    kind = "json" if group == "api" and "file" not in fields else "form"
    bodies = [{**right, name: wrong} for name in right for wrong in ONE_AT_A_TIME[kind]]
    if kind == "json":
        return [("POST", ("json", json.dumps(body))) for body in bodies]
    bodies = [{name: as_form(value) for name, value in body.items()} for body in bodies]
    if "file" in fields:
        return [("POST", ("multipart", (body, "file", FILES[0]))) for body in bodies]
    return [("POST", ("form", body)) for body in bodies]


def as_form(value):
    return value if isinstance(value, str) else json.dumps(value)


def source_read_by(view):
    """The source of a view and of the functions of its module it calls, transitively."""
    functions = [inspect.unwrap(function) for function in view_functions(view)]
    module, sources, pending, seen = inspect.getmodule(functions[0]), [], functions, set()
    while pending:
        function = pending.pop()
        if function in seen:
            continue
        seen.add(function)
        sources.append(inspect.getsource(function))
        for name in re.findall(r"\b(\w+)\(", sources[-1]):
            called = vars(module).get(name)
            if inspect.isfunction(called) and called.__module__ == module.__name__:
                pending.append(called)
    return module, "\n".join(sources)


def fields_read_by(view):
    """The field names a view spells (it and its module's helpers), its forms' fields, and
    whether it reads a file: what its readers read."""
    module, source = source_read_by(view)
    names = set(re.findall(r'"([a-z][a-z0-9_]{1,30})"', source)) | body_fields(view)
    for name in re.findall(r"\b([A-Z]\w+Form)\b", source):
        form = vars(module).get(name)
        if isinstance(form, type) and issubclass(form, forms.BaseForm):
            names |= set(form.base_fields)
    if "FILES" in source or "file" in names:
        names.add("file")
    return sorted(names)


class World:
    """The cast's objects the routes point at, and a client per caller."""

    def __init__(self, alice, version, device_class, make_device, storage_root):
        device, device_token = make_device()
        engine = stored_engine(version, device_class)
        (storage_root / "engines").mkdir(exist_ok=True)
        (storage_root / "engines" / "test.onnx").write_bytes(b"not read")
        job = submit_job(
            team=version.team,
            kind=JobKind.BENCHMARK,
            device_class=device_class,
            user=alice,
            model_version=version,
            params={"iterations": 50},
        )
        claim_job(job.pk, device, 1)
        spare = ApiToken(user=alice, name="spare")
        spare.issue()
        spare.save()
        webhook = Webhook.objects.create(team=version.team, url="https://example.com/hook")
        run = AutoRun.objects.create(model_version=version, device_class=device_class)
        seed_runs([engine], 1, 0)  # a benchmark run, for its details (else only its 404)
        self.ids = {
            "versions": version.pk,
            "models": version.model_id,
            "engines": engine.pk,
            "jobs": job.pk,
            "devices": device.pk,
            "classes": device_class.pk,
            "device-classes": device_class.pk,
            "releases": propose(engine, alice, "fuzz").pk,
            "auto": run.pk,
            "auto-runs": run.pk,
            "runs": engine.benchmarks.get().pk,
            "tokens": spare.pk,
            "webhooks": webhook.pk,
        }
        self.slug = device_class.slug
        self.team_slug = version.team.slug
        self.right = {
            "api": {**RIGHT, "device_class": device_class.slug, "team": version.team.slug},
            "page": {**RIGHT, "device_class": device_class.pk, "team": version.team.pk},
        }
        self.clients = self._clients(alice, device_token)

    def _clients(self, alice, device_token):
        loner = get_user_model().objects.create_user(f"loner-{uuid.uuid4().hex[:6]}", PASSWORD)
        session, no_team = Client(), Client()
        session.force_login(alice)
        no_team.force_login(loner)
        return {
            "nobody": (Client(), {}),
            "token": (Client(), token_for(alice)),
            "device": (Client(), {"HTTP_AUTHORIZATION": f"Bearer {device_token}"}),
            "session": (session, {}),
            "no-team session": (no_team, {}),
        }

    def served(self, path):
        """The caller a route serves (the first an empty call does not send away with 401, a
        redirect to sign in, or a 403 for a token of the other kind) and the methods it takes
        (not answered 405)."""
        asked = ("GET", "POST", "PATCH") if path.startswith("/api/v1/") else ("GET", "POST")
        for caller in ("session", "token", "device"):
            client, headers = self.clients[caller]
            answers = {m: client.generic(m, path, **headers) for m in asked}
            if not any(map(sent_away, answers.values())):
                break
        methods = [m for m, answer in answers.items() if answer.status_code != 405]
        return caller, methods or ["GET", "POST"]

    def value(self, before, converter):
        """The id (or slug) of the world's object a route's argument names."""
        if converter == "slug":
            return self.team_slug if before == "teams" else self.slug
        if converter == "str":
            return {"results": "benchmarks", "inputs": "model"}.get(before, "x")
        return self.ids.get(before, 999999)


def sent_away(answer):
    """True when the caller is not whom the route serves: no token or session, or a token of
    the other kind (a person's at a device's call, a device's at a person's)."""
    if answer.status_code in (401, 302):
        return True
    wrong_call = (DEVICE_TOKEN_AT_PERSON_CALL, PERSON_TOKEN_AT_DEVICE_CALL)
    if answer.status_code != 403 or answer["Content-Type"] != "application/json":
        return False
    return answer.json().get("error") in wrong_call


@pytest.fixture
def world(alice, version, device_class, make_device, storage_root):
    # A known token at the wrong call is not counted as a made-up one: no lockout here.
    return World(alice, version, device_class, make_device, storage_root)


def send(client, headers, method, path, body, query=None):
    """Send one request as the test client does for a real caller."""
    kind, payload = body
    if kind == "query":
        query, kind, payload = payload, "json", b""
    path = f"{path}?{urlencode(query)}" if query else path
    if method == "GET":
        return client.get(path, **headers)
    if kind == "json":
        return client.generic(method, path, payload, "application/json", **headers)
    if kind in ("form", "raw form"):
        encoded = urlencode(payload) if kind == "form" else payload
        return client.generic(method, path, encoded, "application/x-www-form-urlencoded", **headers)
    fields, file_field, content = payload
    upload = {file_field: SimpleUploadedFile("fuzz.onnx", content)}
    return client.post(path, {**fields, **upload}, **headers)


def check(response, path, method, caller, body):
    """No 5xx anywhere; every /api/v1/ error is {"error": "<text>"}."""
    where = f"{method} {path} as {caller} with {body!r:.300}"
    assert response.status_code < 500, f"{response.status_code} on {where}"
    if path.startswith("/api/v1/") and response.status_code >= 400:
        assert response["Content-Type"].startswith("application/json"), where
        assert isinstance(response.json().get("error"), str), where


def fuzz_route(world, path, view, group, answers):
    """Sweep one route, then fuzz it with drawn requests; count the answers' statuses."""
    caller, methods = world.served(path)
    fields = fields_read_by(view)

    def ask(caller, method, body, query=None):
        client, headers = world.clients[caller]
        response = send(client, headers, method, path, body, query)
        answers[response.status_code] += 1
        check(response, path, method, caller, body)

    right = world.right[group]
    requests = sweep(fields, methods, group, right)
    for method, body in requests:
        ask(caller, method, body)
    if group == "page":  # a user in no team has no current team: one form is enough
        ask("no-team session", *requests[0])

    @settings(FUZZ, max_examples=EXAMPLES[group])
    @given(
        caller=st.sampled_from([caller] * 12 + list(CALLERS)),
        method=st.sampled_from(methods * 4 + ["DELETE"]),
        body=bodies(fields, right),
        query=st.dictionaries(keys(fields), form_text, max_size=3),
    )
    def drawn(caller, method, body, query):
        ask(caller, method, body, query)

    drawn()


def fuzzed(group):
    """The routes of a group (api or page) with their views."""
    chosen = [
        (route, view)
        for name, route, view in routes()
        if name not in SKIPPED
        and not route.startswith("admin/")
        and (group == "api") == route.startswith("api/v1/")
    ]
    assert len(chosen) > 20, chosen
    return chosen


def fuzz_group(world, group):
    """Fuzz every route of the group; print how many requests, how long, which statuses."""
    started, answers = time.monotonic(), Counter()
    chosen = fuzzed(group)
    for route, view in chosen:
        fuzz_route(world, filled(route, world.value), view, group, answers)
    print(
        f"\n{group}: {sum(answers.values())} requests over {len(chosen)} routes in "
        f"{time.monotonic() - started:.1f} s; statuses {dict(sorted(answers.items()))}"
    )


def test_it_answers_every_api_call_without_a_5xx_and_with_a_json_error(world):
    fuzz_group(world, "api")


def test_it_answers_every_page_and_form_without_a_5xx(world):
    fuzz_group(world, "page")
