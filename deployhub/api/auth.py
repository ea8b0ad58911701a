"""Who may call API v1: people by personal tokens, devices by device tokens; what they may send.

person_for authenticates a person for the django-ninja operations (api/v1.py), whose
handlers (api/openapi.py) answer the typed exceptions raised here and in the domain with
their HTTP status; device_required does both for the device protocol's hand-written views.
Never by a message's text. Every JSON body goes through json_body and every field through
a typed reader (text, number, integer, json_object) or a strict schema, so bad input is a
400 naming the field, never a 500 from the database or the parser.
"""

import functools
import math

from django.http import JsonResponse, RawPostDataException
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from deployhub.core import json_input, worker_dist
from deployhub.devices.enrolment import revoked_refusal
from deployhub.devices.models import TOKEN_PREFIX as DEVICE_TOKEN_PREFIX
from deployhub.devices.models import Device
from deployhub.jobs.errors import JobConflict, WrongDevice
from deployhub.jobs.models import Job
from deployhub.registry.inspect import InvalidModel
from deployhub.teams import throttle
from deployhub.teams.models import ApiToken, TokenScope
from workers.version import parse_user_agent

PIPELINE_REFUSAL = (
    "A pipeline token may upload, build, benchmark, read and request a release; "
    "reviewing, overriding a gate, promoting, rolling back, draining or revoking a device "
    "and enrolment tokens need a full token."
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


def json_body(request, scrub=False):
    """Return the request's JSON body as a dict ({} when empty); raise BadInput (400) otherwise.

    The body must be UTF-8 JSON, an object nested at most json_input.MAX_DEPTH levels, with
    finite numbers only and text PostgreSQL can store (deployhub/core/json_input.py). A device's
    calls scrub that text instead (NUL as U+FFFD): a build log is never refused for a byte.
    """
    try:
        body = json_input.parse(request.body or b"{}", scrub=scrub)
    except json_input.JSONInputError as exc:
        raise BadInput(str(exc)) from exc
    except RawPostDataException as exc:  # a multipart form, already read as one
        raise BadInput("This call takes a JSON body: send Content-Type: application/json.") from exc
    if not isinstance(body, dict):
        raise BadInput("The body must be a JSON object.")
    return body


def _check_text(where, value):
    if problem := json_input.text_problem(value):
        raise BadInput(f"{where[:100]} {problem}.")


def check_fields(request):
    """Raise BadInput when a query-string or form field, or a file's name, holds a NUL."""
    fields = [*request.GET.lists()]
    if request.method == "POST" and request.content_type in FORM_TYPES:
        fields += [*request.POST.lists()]
        fields += [(name, [f.name for f in files]) for name, files in request.FILES.lists()]
    for name, values in fields:
        _check_text(f"A field name ({name[:40]!r})", name)
        for value in values:
            _check_text(repr(name[:40]), value)


FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


def text(data, name, default=None, *, required=False, max_length=None):
    """Return data[name] as a string (default when absent or null); raise BadInput when it is
    another type, blank but required, longer than max_length, or holds a NUL."""
    value = data.get(name)
    if value is None or (required and isinstance(value, str) and not value.strip()):
        if required:
            raise BadInput(f"Say {name!r}: it is required here.")
        return default
    if not isinstance(value, str):
        raise BadInput(f"{name!r} must be a string, not {_json_type(value)}.")
    _check_text(repr(name), value)
    if max_length is not None and len(value) > max_length:
        raise BadInput(f"{name!r} is {len(value):,} characters long: at most {max_length}.")
    return value


def number(data, name, default=None, *, low=None, high=None):
    """Return data[name] as a float within [low, high] (default when absent or null)."""
    value = data.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInput(f"{name!r} must be a number, not {_json_type(value)}.")
    if abs(value) > 1e300 or not math.isfinite(value) or not _within(value, low, high):
        raise BadInput(f"{name!r} must be a number from {low} to {high}; got {value!r:.30}.")
    return float(value)


# Ids and counts fit PostgreSQL's bigint.
BIGINT = 2**63 - 1


def integer(data, name, default=None, *, low=0, high=BIGINT):
    """Return data[name] as an int within [low, high] (default when absent or null); a string
    of digits counts, as a multipart form sends it."""
    value = data.get(name)
    if value is None:
        return default
    if isinstance(value, str) and value.strip().lstrip("-").isdecimal() and len(value) < 40:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{name!r} must be an integer, not {_json_type(value)}.")
    if not _within(value, low, high):
        raise BadInput(f"{name!r} must be an integer from {low} to {high}; got {value!r:.30}.")
    return value


def flag(data, name, default=None):
    """Return data[name] as true or false (default when absent or null)."""
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadInput(f"{name!r} must be true or false, not {_json_type(value)}.")
    return value


def json_object(data, name, default=None):
    """Return data[name] as a dict (default when absent or null)."""
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, dict):
        raise BadInput(f"{name!r} must be a JSON object, not {_json_type(value)}.")
    return value


def _within(value, low, high):
    return (low is None or value >= low) and (high is None or value <= high)


def _json_type(value):
    names = {bool: "true/false", int: "a number", float: "a number", str: "a string"}
    names |= {list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def field_length(model, name):
    """The max_length of a model's field: what PostgreSQL refuses past."""
    return model._meta.get_field(name).max_length


def bearer(request):
    """Return the token of the request's Authorization: Bearer header ('' when none)."""
    header = request.headers.get("Authorization", "")
    return header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""


# A claim's body is {"attempt": N}: a bigger call goes through device_required.
PLAIN_CALL_BYTES = 4096


def plain_device_call(request):
    """Return (token, address, body) of a plain device call, else None.

    Plain: a Bearer device token and a small JSON body that device_required would accept.
    A view may act on one before the device is read (a claim: api/protocol.py); any other
    call goes through device_required, which checks the token before it reads the body.
    """
    token = bearer(request)
    if not token.startswith(DEVICE_TOKEN_PREFIX) or request.content_type != "application/json":
        return None
    if _protocol_refused(request):  # device_required answers it 426
        return None
    try:
        if int(request.META.get("CONTENT_LENGTH") or 0) > PLAIN_CALL_BYTES:
            return None
        check_fields(request)
        body = json_body(request, scrub=True)
    except (ValueError, BadInput):
        return None
    return token, throttle.client_address(request), body


def locked_out(seconds):
    """The 429 for an address locked out for made-up tokens, for `seconds` more."""
    response = error(
        429,
        "Too many failed token authentications from this address: "
        f"{throttle.try_again_in(seconds)}.",
    )
    response["Retry-After"] = str(seconds)
    return response


def _refuse_token(request, message, other_kind, wrong_call):
    """Answer a token that opens nothing here: 429 while the caller's address is locked out;
    else 401 for a made-up token, counted against the address (no token: no count).

    A token that other_kind (the manager of the other kind of token) holds is a mistake, not
    a guess: a device's token at a person's call, a person's or a pipeline's at a device's.
    It gets 403 with `wrong_call` and is never counted: counting those locked make run's
    worker out of the address it shares with every local script.
    """
    token = bearer(request)
    if token and other_kind.holds(token):
        if seconds := throttle.token_lockout_seconds(request):
            return locked_out(seconds)
        return error(403, wrong_call)
    if token and (seconds := throttle.count_token_failure(request)):
        return locked_out(seconds)
    return error(401, message)


DEVICE_TOKEN_AT_PERSON_CALL = (
    "This is a device token: it opens the device calls only (docs/protocol.md). This call "
    "takes a personal API token: Authorization: Bearer dhu_... (Account → API tokens)."
)
PERSON_TOKEN_AT_DEVICE_CALL = (
    "This is a personal API token: device calls take the device's own token, shown once "
    "when the device was registered."
)


class Refused(Exception):
    """The caller is not let in: `response` is the answer (401, 403 or 429)."""

    def __init__(self, response):
        super().__init__(response.status_code)
        self.response = response


def person_for(request, pipelines_may_call=False):
    """Return the person whose personal API token the request carries (Authorization: Bearer
    dhu_...), with request.user and request.token_scope set; raise Refused otherwise.

    A pipeline's token is let in only where pipelines_may_call: an allowlist, not a blocklist.
    """
    # The address's lockout comes with the token, in one query: a right token is not slowed.
    lockout = throttle.token_lockout(request)
    record = ApiToken.objects.annotate(lockout=lockout).by_token(bearer(request))
    if record is None:
        raise Refused(
            _refuse_token(
                request,
                "An API token is required: Authorization: Bearer dhu_... "
                "(create one under Account → API tokens).",
                Device.objects,
                DEVICE_TOKEN_AT_PERSON_CALL,
            )
        )
    if seconds := throttle.seconds_until(record.lockout):  # the guesser learns nothing
        raise Refused(locked_out(seconds))
    if record.scope == TokenScope.PIPELINE and not pipelines_may_call:
        raise Refused(error(403, PIPELINE_REFUSAL))
    ApiToken.objects.filter(pk=record.pk).update(last_used_at=timezone.now())
    request.user, request.token_scope = record.user, record.scope
    return record.user


def device_required(view):
    """Authenticate the device by its bearer token and pass it to the view."""

    @csrf_exempt
    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        try:
            device = device_for(request)
        except Refused as refused:
            return refused.response
        try:
            check_fields(request)
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


def device_for(request):
    """Return the device whose token the request carries (Authorization: Bearer ...); raise
    Refused (401, 403, 426 or 429) otherwise.

    A device's own token on a device call is served even from a locked-out address: its
    heartbeats keep its lease and its completion is never lost to someone else's made-up
    tokens (a 256-bit token is not found by guessing, so the lockout keeps slowing guessers
    and shows them nothing).
    """
    if not request.headers.get("Authorization", "").startswith("Bearer "):
        raise Refused(error(401, "A device token is required: Authorization: Bearer <token>."))
    address = throttle.client_address(request)
    device = Device.objects.by_token(bearer(request), address=address)
    if device is None:
        raise Refused(
            _refuse_token(
                request,
                "This device token is not valid.",
                ApiToken.objects,
                PERSON_TOKEN_AT_DEVICE_CALL,
            )
        )
    if device.revoked_at is not None:  # a known token, not a guess: never counted
        raise Refused(error(401, revoked_refusal(device)))
    if refused := _worker_refusal(request, device):
        raise Refused(refused)
    return device


def _worker_refusal(request, device):
    """Keep what the device's worker says of itself; answer 426, with the line that installs
    the hub's own worker, when this hub does not speak its protocol (docs/protocol.md).

    A caller that does not say it is a deployhub worker (curl, a script) is served as it is.
    """
    version, protocol = parse_user_agent(request.headers.get("User-Agent"))
    if version is None and protocol is None:
        return None
    device.record_worker(version, protocol)
    if protocol is not None and not worker_dist.speaks(protocol):
        return error(426, worker_dist.refusal(protocol, request.build_absolute_uri("/")))
    return None


def _protocol_refused(request):
    """True when the caller is a deployhub worker speaking a protocol this hub does not."""
    _, protocol = parse_user_agent(request.headers.get("User-Agent"))
    return protocol is not None and not worker_dist.speaks(protocol)
