"""API v1 for enrolment: a device registers itself with an enrolment token (POST enrol, no
Authorization header: docs/protocol.md, "Enrolment"), and a team admin makes, lists and
revokes the tokens of a class (docs/api.md).

enrol_device is the device's call, written by hand and routed with the device protocol
(api/urls.py); the admin's calls are django-ninja operations, for full tokens only."""

from django.db import transaction
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from ninja import Router, Status
from ninja.pagination import paginate
from pydantic import Field

from deployhub.api.auth import (
    BadInput,
    check_fields,
    error,
    field_length,
    json_body,
    locked_out,
    text,
)
from deployhub.api.protocol import device_json, reported_fingerprint
from deployhub.api.v1 import Listed, Page, Schema, Strict, answers
from deployhub.devices.access import (
    get_device_class_by_slug_for_user,
    get_enrolment_token_for_user,
)
from deployhub.devices.actions import create_enrolment_token, revoke_enrolment_token
from deployhub.devices.enrolment import (
    EnrolmentRefused,
    NameTaken,
    UnknownEnrolmentToken,
    enrol,
    hub_url,
    setup_lines,
    token_state,
)
from deployhub.devices.models import Device, EnrolmentToken
from deployhub.engines.actions import record_fingerprint
from deployhub.teams import throttle
from deployhub.teams.access import require_role
from deployhub.teams.models import ApiToken, Role

WRONG_TOKEN = (
    "This is a device's or a person's token: enrolment takes an enrolment token (dhe_...), "
    "made by a team admin on the device class's page."
)
# The longest secret read: an enrolment token is 47 characters.
SECRET_CHARS = 200
# The most an enrolment token may say of itself.
MAX_DAYS, MAX_DEVICES = 3650, 1_000_000


# Its django-ninja operations (api/openapi.py mounts it at /api/v1/): the admin's calls.
router = Router(tags=["enrolment"])


class EnrolmentTokenIn(Strict):
    expires_in_days: int | None = Field(
        None, ge=1, le=MAX_DAYS, description="Days it may enrol devices; none: no end."
    )
    max_devices: int | None = Field(
        None, ge=1, le=MAX_DEVICES, description="Devices it may enrol; none: any number."
    )
    note: str = Field("", max_length=field_length(EnrolmentToken, "note"))


class EnrolmentTokenOut(Schema):
    id: int
    device_class: str
    hint: str
    note: str
    expires_at: str | None
    max_devices: int | None
    uses: int
    revoked_at: str | None
    state: str
    refusal: str | None
    created_by: str | None
    created_at: str | None


class EnrolmentTokenMadeOut(Schema):
    enrolment_token: EnrolmentTokenOut
    token: str
    setup: list[str]


class EnrolmentTokenRevokedOut(Schema):
    enrolment_token: EnrolmentTokenOut


@csrf_exempt
@require_POST
def enrol_device(request):
    """Body {"token", "name", "machine_id", "fingerprint"?}: 201 with the new device and its
    token, 200 with a machine's device enrolled before and a fresh token (docs/protocol.md)."""
    try:
        check_fields(request)
        secret, name, machine_id, fingerprint = _enrolment_fields(json_body(request, scrub=True))
    except BadInput as exc:
        return error(400, str(exc))
    if Device.objects.holds(secret) or ApiToken.objects.holds(secret):
        return error(403, WRONG_TOKEN)  # a known token at the wrong call: not a guess
    try:
        with transaction.atomic():
            enrolment = enrol(secret, name, machine_id, request.headers.get("User-Agent", ""))
            if fingerprint is not None:
                record_fingerprint(enrolment.device, fingerprint)
    except UnknownEnrolmentToken as exc:
        if seconds := throttle.count_token_failure(request):
            return locked_out(seconds)
        return error(401, str(exc))
    except EnrolmentRefused as exc:
        return error(403, str(exc))
    except NameTaken as exc:
        return error(409, str(exc))
    answer = {
        "device": device_json(enrolment.device),
        "token": enrolment.token,
        "created": enrolment.created,
    }
    return JsonResponse(answer, status=201 if enrolment.created else 200)


def _enrolment_fields(body):
    """The token, name, machine id and fingerprint an enrolment sends; BadInput otherwise."""
    secret = text(body, "token", required=True, max_length=SECRET_CHARS).strip()
    name = text(body, "name", required=True, max_length=field_length(Device, "name")).strip()
    machine_id = text(
        body, "machine_id", required=True, max_length=field_length(Device, "machine_id")
    ).strip()
    return secret, name, machine_id, reported_fingerprint(body)


@router.get(
    "device-classes/{slug:slug}/enrolment-tokens",
    response=answers(list[EnrolmentTokenOut]),
    url_name="api_class_enrolment_tokens",
)
@paginate(Page)
def class_enrolment_tokens(request, slug: str):
    """The class's enrolment tokens, newest first, without their secrets (team admins)."""
    device_class = get_device_class_by_slug_for_user(request, slug)
    require_role(request.user, device_class.team, Role.ADMIN)
    tokens = device_class.enrolment_tokens.select_related("device_class", "created_by")
    return Listed(tokens.order_by("-created_at", "-pk"), enrolment_token_json)


@router.post(
    "device-classes/{slug:slug}/enrolment-tokens",
    response=answers(EnrolmentTokenMadeOut, status=201),
    url_name="api_class_enrolment_tokens",
)
def class_enrolment_token_create(request, slug: str, payload: EnrolmentTokenIn):
    """Make an enrolment token for the class (team admins): 201 with it, its secret (in this
    answer only: the hub keeps a hash) and the lines that install, enrol and run a worker."""
    device_class = get_device_class_by_slug_for_user(request, slug)
    require_role(request.user, device_class.team, Role.ADMIN)
    record, secret = create_enrolment_token(
        device_class,
        request.user,
        expires_in_days=payload.expires_in_days,
        max_devices=payload.max_devices,
        note=payload.note,
    )
    answer = {
        "enrolment_token": enrolment_token_json(record),
        "token": secret,
        "setup": setup_lines(hub_url(request), secret),
    }
    return Status(201, answer)


@router.post(
    "enrolment-tokens/{int:pk}/revoke",
    response=answers(EnrolmentTokenRevokedOut),
    url_name="api_enrolment_token_revoke",
)
def enrolment_token_revoke(request, pk: int):
    """Stop the enrolment token enrolling devices (team admins); those it enrolled keep
    working."""
    record = get_enrolment_token_for_user(request, pk)
    revoke_enrolment_token(record, request.user)
    return {"enrolment_token": enrolment_token_json(record)}


def enrolment_token_json(record):
    refusal = record.refusal()
    return {
        "id": record.pk,
        "device_class": record.device_class.slug,
        "hint": record.token_hint,
        "note": record.note,
        "expires_at": _time(record.expires_at),
        "max_devices": record.max_devices,
        "uses": record.uses,
        "revoked_at": _time(record.revoked_at),
        "state": token_state(record),
        "refusal": refusal or None,
        "created_by": record.created_by.get_username() if record.created_by else None,
        "created_at": _time(record.created_at),
    }


def _time(value):
    return value.isoformat() if value else None
