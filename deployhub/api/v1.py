"""What every API v1 operation for people and pipelines is built from (django-ninja): the
tokens it takes, strict bodies, the error body, the statuses it answers, one way to page.
The API itself, with its routers, is api/openapi.py.

The rules of the hand-written calls hold here (docs/api.md): every error is
{"error": "..."} with its status, another team's objects are 404, a personal token opens
every call its person may make, a pipeline's token only the calls marked for pipelines
(auth=PIPELINES), and a field of the wrong type, range or length is a 400 naming it.
Pydantic reads the bodies and query strings: Strict schemas, so a list is never taken for
a string nor "5" for 5. The device protocol (docs/protocol.md) is not here: it is the
worker's, with its own exact behaviour, and stays in api/protocol.py.
"""

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
from django.http import HttpRequest
from ninja import Schema
from ninja.pagination import LimitOffsetPagination
from ninja.security import HttpBearer
from pydantic import ConfigDict, Field

from deployhub.api import auth
from deployhub.api.auth import BIGINT


class PersonToken(HttpBearer):
    """A personal API token with full scope: Authorization: Bearer dhu_..."""

    pipelines_may_call = False

    def __call__(self, request: HttpRequest) -> AbstractBaseUser:
        user = auth.person_for(request, self.pipelines_may_call)
        auth.check_fields(request)  # a NUL in a query string or a form field: 400
        return user

    # __call__ reads the header: ninja never calls this.
    def authenticate(self, request: HttpRequest, token: str) -> Any:  # pragma: no cover
        raise NotImplementedError


class PipelineToken(PersonToken):
    """A personal API token, or a pipeline's: the calls a CI pipeline makes."""

    pipelines_may_call = True


PEOPLE = PersonToken()
PIPELINES = [PipelineToken()]


class Strict(Schema):
    """A request body: unknown fields, and values of another type, are refused (400)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Error(Schema):
    """Every error's body; a 409 may add `existing`, a description of what is in the way."""

    error: str
    existing: Any = None


# The statuses every call of a person may answer besides its own (docs/api.md's table).
ERRORS = (400, 401, 403, 404, 429)


def answers(ok: Any, status: int = 200, also: Iterable[int] = ()) -> dict[int, Any]:
    """The response= of an operation: its own answer, then the errors it may give."""
    return {status: ok, **{code: Error for code in (*ERRORS, *also)}}


def file_answer(media_type: str, description: str) -> dict[str, Any]:
    """The openapi_extra of an operation whose 200 is a file, not JSON (its errors stay JSON:
    answers(None, ...))."""
    body = {"schema": {"type": "string"}}
    return {"responses": {200: {"description": description, "content": {media_type: body}}}}


class Listed:
    """What a list call returns: its rows (a queryset, in a stable order) and how one row is
    shown; Page reads and shows only the rows of the page asked for."""

    def __init__(self, rows: QuerySet, shown: Callable[[Any], Any]) -> None:
        self.rows, self.shown = rows, shown


class Page(LimitOffsetPagination):
    """Every list: ?limit= (1 to 500, 50 when absent) and ?offset=, answered as
    {"items": [...], "count": <rows in all>}."""

    class Input(Schema):
        limit: int = Field(50, ge=1, le=500)
        offset: int = Field(0, ge=0, le=BIGINT)

    def paginate_queryset(
        self,
        queryset: Any,
        pagination: Any,
        request: HttpRequest,  # ninja always passes it, as the base class declares
        **params: Any,
    ) -> Any:
        limit, offset = pagination.limit, pagination.offset
        if isinstance(queryset, Listed):
            rows = queryset.rows[offset : offset + limit]
            return {"items": [queryset.shown(row) for row in rows], "count": queryset.rows.count()}
        return super().paginate_queryset(queryset, pagination, request=request, **params)
