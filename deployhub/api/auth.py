"""Who may call API v1: people by personal tokens, devices by device tokens.

Each decorator authenticates the caller, then answers the typed exceptions its
views raise with their HTTP status, as a JSON error; never by a message's text.
"""

import functools
import json

from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from deployhub.devices.models import Device
from deployhub.jobs.errors import JobConflict, WrongDevice
from deployhub.jobs.models import Job
from deployhub.registry.datasets import DatasetError
from deployhub.registry.golden import GoldenError
from deployhub.registry.inspect import InvalidModel, UploadTooLarge
from deployhub.teams import throttle
from deployhub.teams.models import ApiToken, TokenScope

PIPELINE_REFUSAL = (
    "A pipeline token may upload, build, benchmark, read and request a release; "
    "reviewing, overriding a gate, promoting, rolling back and draining a device need a "
    "full token."
)


class BadInput(Exception):
    """A field of the request is missing or malformed (HTTP 400)."""


class Conflict(Exception):
    """The request clashes with something stored (HTTP 409); `existing` describes it as JSON."""

    def __init__(self, message, existing):
        super().__init__(message)
        self.existing = existing


def error(status, message):
    return JsonResponse({"error": message}, status=status)


def json_body(request):
    """Return the request's JSON body as a dict ({} when empty); raise BadInput (400) otherwise."""
    try:
        body = json.loads(request.body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"The body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadInput("The body must be a JSON object.")
    return body


def _bearer(request):
    return request.headers.get("Authorization", "").removeprefix("Bearer ").strip()


def _locked_out(seconds):
    """The 429 for an address locked out for made-up tokens, for `seconds` more."""
    response = error(
        429,
        "Too many failed token authentications from this address: "
        f"{throttle.try_again_in(seconds)}.",
    )
    response["Retry-After"] = str(seconds)
    return response


def _refuse_token(request, message):
    """Answer a token that opens nothing: 401, counted against the caller's address (no token:
    no count); 429 when that address is locked out."""
    if _bearer(request) and (seconds := throttle.count_token_failure(request)):
        return _locked_out(seconds)
    return error(401, message)


def token_required(view):
    """Authenticate a person by a personal API token (Authorization: Bearer dhu_...)."""

    @csrf_exempt
    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        # The address's lockout comes with the token, in one query: a right token is not slowed.
        lockout = throttle.token_lockout(request)
        record = ApiToken.objects.annotate(lockout=lockout).by_token(_bearer(request))
        if record is None:
            return _refuse_token(
                request,
                "An API token is required: Authorization: Bearer dhu_... "
                "(create one under Account → API tokens).",
            )
        if seconds := throttle.seconds_until(record.lockout):  # the guesser learns nothing
            return _locked_out(seconds)
        if record.scope == TokenScope.PIPELINE and not getattr(view, "pipelines_may_call", False):
            return error(403, PIPELINE_REFUSAL)
        ApiToken.objects.filter(pk=record.pk).update(last_used_at=timezone.now())
        request.user, request.token_scope = record.user, record.scope
        try:
            return view(request, *args, **kwargs)
        except PermissionDenied as exc:
            return error(403, str(exc) or "You may not do this.")
        except Http404:
            return error(404, "Not found.")
        except Conflict as exc:
            return JsonResponse({"error": str(exc), "existing": exc.existing}, status=409)
        except UploadTooLarge as exc:
            return error(413, str(exc))
        except (InvalidModel, DatasetError, GoldenError, BadInput) as exc:
            return error(400, str(exc))

    return wrapper


def device_required(view):
    """Authenticate the device by its bearer token and pass it to the view."""

    @csrf_exempt
    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.headers.get("Authorization", "").startswith("Bearer "):
            return error(401, "A device token is required: Authorization: Bearer <token>.")
        lockout = throttle.token_lockout(request)
        device = Device.objects.annotate(token_lockout=lockout).by_token(_bearer(request))
        if device is None:
            return _refuse_token(request, "This device token is not valid.")
        if seconds := throttle.seconds_until(device.token_lockout):
            return _locked_out(seconds)
        try:
            return view(request, device, *args, **kwargs)
        except WrongDevice as exc:
            return error(403, str(exc))
        except JobConflict as exc:
            return error(409, str(exc))
        except (BadInput, InvalidModel) as exc:
            return error(400, str(exc))
        except Job.DoesNotExist:
            return error(404, "No such job.")

    return wrapper


def for_pipelines(view):
    """Let a pipeline-scoped token call this view too; every other API view refuses one (403).

    Pipelines get an allowlist, not a blocklist: a view added without this mark is closed
    to them until someone decides it belongs to uploading, building, benchmarking, reading
    or requesting a release.
    """
    view.pipelines_may_call = True
    return view
