"""API v1 for people and pipelines: django-ninja operations, one router per area, and the
OpenAPI 3.1 schema generated from them at /api/v1/openapi.json (docs at /api/docs/).

The rules of docs/api.md hold for every operation: errors are {"error": "..."} with their
status (the handlers below), another team's objects are 404, pipeline tokens open only the
calls marked for them (api/v1.py). The device protocol (docs/protocol.md) is not here: it
is the worker's, with its own exact behaviour, in api/protocol.py.
"""

from collections.abc import Callable
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, RawPostDataException
from django.urls import URLPattern, path, reverse
from ninja import NinjaAPI, Swagger
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.responses import Response

from deployhub.api import (
    auth,
    catalog,
    devices,
    enrolment,
    figures,
    fleet,
    jobs,
    parity,
    pipelines,
    production,
    releases,
    results,
    teams,
)
from deployhub.api.v1 import PEOPLE
from deployhub.registry.datasets import DatasetError
from deployhub.registry.golden import GoldenError
from deployhub.registry.inspect import InvalidModel, UploadTooLarge


class HubAPI(NinjaAPI):
    """Mounted without a URL namespace (deployhub/urls.py): an operation keeps the URL name
    its hand-written view had, so reverse("api_job", ...) holds wherever it was written."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._served_schemas: dict[str, bytes] = {}

    def url_patterns(self) -> list[Any]:
        """ninja's URLs, /openapi.json served by openapi_json (below) instead of ninja's view,
        behind the same docs_decorator ninja would put in front of its own."""
        view: Callable[..., Any] = self.openapi_json
        if self.docs_decorator:  # ninja types it with a free TypeVar, and ignores it itself
            view = self.docs_decorator(view)  # type: ignore[arg-type]
        return [
            path(str(url.pattern), view, name=url.name)
            if isinstance(url, URLPattern) and url.name == "openapi-json"
            else url
            for url in self._get_urls()
        ]

    def openapi_json(self, request: HttpRequest, **path_params: Any) -> HttpResponse:
        """The schema, built once per root path and then served as it was built: the
        operations are fixed once the areas' routers are added (below), and building it walks
        every operation's pydantic models, most of a second of CPU each time."""
        prefix = self.get_root_path(path_params)
        if prefix not in self._served_schemas:
            schema = self.get_openapi_schema(path_prefix=prefix, path_params=path_params)
            self._served_schemas[prefix] = Response(schema).content
        return HttpResponse(self._served_schemas[prefix], content_type="application/json")

    def get_openapi_operation_id(self, operation: Any) -> str:
        return operation.view_func.__name__  # each is unique: a test says so

    def get_root_path(self, path_params: dict[str, Any]) -> str:
        return reverse("api-root", kwargs=path_params)


class JsonBody(Parser):
    """Bodies are read as every API v1 call reads them (auth.json_body): UTF-8 JSON objects,
    finite numbers, text PostgreSQL can store; a refusal says what is wrong."""

    def parse_body(self, request: HttpRequest) -> Any:
        return auth.json_body(request)


class Docs(Swagger):
    """Swagger UI from django-ninja's own copy of its assets (no CDN), at /api/docs/."""

    def get_openapi_url(self, api: NinjaAPI, path_params: dict[str, Any]) -> str:
        return reverse("openapi-json", kwargs=path_params)


api = HubAPI(
    title="DeployHub API",
    version="1",
    description=(
        "Models, versions, device classes, jobs, auto mode, engines, results and releases "
        "for people and pipelines. Every call takes a personal API token (Account → API "
        "tokens); a pipeline token opens the calls marked for pipelines. Errors are "
        '{"error": "..."}. The device protocol is in docs/protocol.md.'
    ),
    urls_namespace="api_v1",
    openapi_url="/openapi.json",
    parser=JsonBody(),
    docs=Docs(),
    docs_url=None,  # at /api/docs/ (deployhub/urls.py), beside the API, not inside it
    auth=PEOPLE,
)


def docs(request: HttpRequest) -> HttpResponse:
    """The API's interactive docs (Swagger UI)."""
    return api.docs.render_page(request, api)


def _answer(status: int, message: str, **more: Any) -> JsonResponse:
    return JsonResponse({"error": message, **more}, status=status)


@api.exception_handler(auth.Refused)
def _refused(request: HttpRequest, exc: auth.Refused) -> HttpResponse:
    return exc.response


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> JsonResponse:
    return _answer(400, "; ".join(_said(each) for each in exc.errors[:5]))


@api.exception_handler(RawPostDataException)
def _form_not_json(request: HttpRequest, exc: Exception) -> JsonResponse:
    # a form's fields were read (auth.check_fields) as a form
    return _answer(400, "This call takes a JSON body: send Content-Type: application/json.")


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: Exception) -> JsonResponse:
    return _answer(401, "An API token is required: Authorization: Bearer dhu_....")


@api.exception_handler(PermissionDenied)
def _forbidden(request: HttpRequest, exc: Exception) -> JsonResponse:
    return _answer(403, str(exc) or "You may not do this.")


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Exception) -> JsonResponse:
    return _answer(404, "Not found.")


@api.exception_handler(auth.Conflict)
def _conflict(request: HttpRequest, exc: auth.Conflict) -> JsonResponse:
    return _answer(409, str(exc), existing=exc.existing)


@api.exception_handler(UploadTooLarge)
def _too_large(request: HttpRequest, exc: Exception) -> JsonResponse:
    return _answer(413, str(exc))


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> JsonResponse:
    if isinstance(exc.__cause__, auth.BadInput):  # JsonBody's refusal, wrapped by ninja
        return _answer(400, str(exc.__cause__))
    return _answer(exc.status_code, str(exc))


for bad_input in (auth.BadInput, InvalidModel, DatasetError, GoldenError):
    api.add_exception_handler(bad_input, lambda request, exc: _answer(400, str(exc)))


# Where pydantic says a value came from, left out of a field's name: "'kind'", not
# "'form.kind'"; a body's fields are under its parameter, often "payload".
PLACES = ("body", "query", "path", "form", "file", "payload")


def _said(error: dict[str, Any]) -> str:
    """One of pydantic's complaints as a sentence that names the field."""
    loc = [str(part) for part in error.get("loc", ())]
    where = [part for part in loc if part not in PLACES] or loc[-1:]
    name = repr(".".join(where))
    kind, message = error.get("type", ""), error.get("msg", "is not valid")
    context = error.get("ctx") or {}
    if kind == "missing" and where == ["payload"]:
        return "This call takes a JSON body (Content-Type: application/json)."
    if kind == "missing":
        return f"Say {name}: it is required here."
    if kind == "extra_forbidden":
        return f"Unknown field {name}."
    if kind == "string_too_long" and isinstance(error.get("input"), str):
        length, limit = len(error["input"]), context.get("max_length")
        return f"{name} is {length:,} characters long: at most {limit}."
    return f"{name}: {message[:200]}."


# Each area's operations, mounted at /api/v1/: one module per area, each with its router.
AREAS = (
    catalog,
    results,
    figures,
    parity,
    production,
    releases,
    fleet,
    enrolment,
    pipelines,
    jobs,
    devices,
    teams,
)
for area in AREAS:
    api.add_router("", area.router)
