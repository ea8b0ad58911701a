"""API v1: Device classes (created and edited by admins) and their devices.

A class is created and changed through the class page's own forms (devices/forms.py),
so a budget, a tolerance or a slug the page refuses is refused here too, with the
same words, and nothing is stored.
"""

import json
from typing import Any

from django.conf import settings
from django.forms import model_to_dict
from django.urls import reverse
from ninja import Query, Router, Status
from ninja.pagination import paginate
from pydantic import Field

from deployhub.api import pipelines
from deployhub.api.auth import BadInput
from deployhub.api.forms import check_form
from deployhub.api.pipelines import DeviceClassOut, device_class_json
from deployhub.api.teams import team_named
from deployhub.api.v1 import PIPELINES, Listed, Page, Schema, Strict, answers
from deployhub.devices.access import get_device_class_by_slug_for_user
from deployhub.devices.actions import change_device_class, create_device_class
from deployhub.devices.forms import DeviceClassEditForm, DeviceClassForm
from deployhub.devices.models import Device, DeviceClass, online_filter
from deployhub.teams.access import require_role, teams_of
from deployhub.teams.models import Role

router = Router(tags=["devices"])

TEXT = settings.DEPLOYHUB_MAX_TEXT_CHARS


class DeviceClassChanges(Strict):
    """The class page's edit form: each field optional, null clears a field that may be empty."""

    name: str | None = Field(None, min_length=1, max_length=100)
    description: str | None = Field(None, max_length=TEXT)
    serving_pattern: str | None = Field(None, max_length=20)
    frame_budget_ms: float | None = None
    throughput_target_ips: float | None = None
    batch_latency_ceiling_ms: float | None = None
    memory_limit_mb: int | None = None
    accuracy_tolerance: float | None = None
    task_tolerances: dict[str, Any] | None = None
    trusts_builds_of: list[str] | None = Field(None, max_length=500)


class DeviceClassIn(Strict):
    """A new class, as the fleet page's form makes one; left out: the page's defaults."""

    team: str | None = Field(None, max_length=100)
    slug: str = Field(min_length=1, max_length=50)
    name: str = Field(min_length=1, max_length=100)
    description: str = Field("", max_length=TEXT)
    serving_pattern: str | None = Field(None, max_length=20)
    frame_budget_ms: float | None = None
    throughput_target_ips: float | None = None
    batch_latency_ceiling_ms: float | None = None
    memory_limit_mb: int | None = None
    accuracy_tolerance: float | None = None
    task_tolerances: dict[str, Any] | None = None


class DeviceClassDetailOut(DeviceClassOut):
    description: str
    trusts_builds_of: list[str]
    page: str


class DeviceOut(Schema):
    id: int
    name: str
    device_class: str
    state: str
    online: bool
    draining: bool
    revoked_at: str | None
    last_heartbeat_at: str | None
    delivery: str
    worker_version: str
    url: str


class DeviceFilters(Schema):
    device_class: str | None = Field(None, max_length=50)
    online: bool | None = None
    draining: bool | None = None


# django-ninja serves one path from one router (a method another router holds there is a
# 405), so POST device-classes joins GET device-classes on api/pipelines.py's router.
@pipelines.router.post(
    "device-classes",
    response=answers(DeviceClassDetailOut, status=201),
    url_name="api_device_classes_create",
    tags=["devices"],
)
def device_class_create(request, payload: DeviceClassIn):
    """Create a device class in a team (its admins), with the fleet page's fields and checks;
    201 with the class."""
    team = team_named(request, payload.team)
    require_role(request.user, team, Role.ADMIN)
    given = payload.model_dump(exclude={"team"}, exclude_none=True)
    form = DeviceClassForm(_form_data(DeviceClass(team=team), given, DeviceClassForm))
    check_form(form, "Device class not created")
    return Status(201, class_detail_json(request, create_device_class(team, request.user, form)))


@router.get(
    "device-classes/{slug:slug}",
    response=answers(DeviceClassDetailOut),
    auth=PIPELINES,
    url_name="api_device_class",
)
def device_class_detail(request, slug: str):
    """One class of the caller's teams: budget, tolerances, backends, online devices."""
    return class_detail_json(request, get_device_class_by_slug_for_user(request, slug))


@router.patch(
    "device-classes/{slug:slug}",
    response=answers(DeviceClassDetailOut),
    url_name="api_device_class_change",
)
def device_class_change(request, slug: str, payload: DeviceClassChanges):
    """Change a class's name, serving pattern, budgets, tolerances or the classes whose
    builds it runs (its team's admins), as the class page's edit form does; its slug names
    its queue and never changes. Fields left out keep their values."""
    device_class = get_device_class_by_slug_for_user(request, slug)
    require_role(request.user, device_class.team, Role.ADMIN)
    given = payload.model_dump(exclude_unset=True)
    if "trusts_builds_of" in given:
        given["trusts_builds_of"] = _trusted(device_class, given["trusts_builds_of"] or [])
    data = _form_data(device_class, given, DeviceClassEditForm)
    form = DeviceClassEditForm(data, instance=device_class)
    check_form(form, "Device class not changed")
    change_device_class(device_class, request.user, form)
    device_class.refresh_from_db()
    return class_detail_json(request, device_class)


def _form_data(device_class, given, form_class):
    """The form's data: the class's current values (a new one's defaults), then those given;
    JSON as the page's field posts it, classes by id."""
    fields = form_class._meta.fields
    data = model_to_dict(device_class, fields)
    if "trusts_builds_of" in data:
        data["trusts_builds_of"] = [other.pk for other in data["trusts_builds_of"]]
    data.update(given)
    data["task_tolerances"] = json.dumps(data.get("task_tolerances") or {})
    return {name: "" if value is None else value for name, value in data.items()}


def _trusted(device_class, slugs):
    """The ids of the team's other classes named by slug; raise BadInput for any other."""
    others = DeviceClass.objects.filter(team=device_class.team_id).exclude(pk=device_class.pk)
    found = dict(others.filter(slug__in=slugs).values_list("slug", "pk"))
    if unknown := [slug for slug in slugs if slug not in found]:
        raise BadInput(
            f"'trusts_builds_of': {device_class.team} has no other device class "
            f"{unknown[0][:50]!r}."
        )
    return [found[slug] for slug in slugs]


def class_detail_json(request, device_class):
    return {
        **device_class_json(device_class),
        "description": device_class.description,
        "trusts_builds_of": [other.slug for other in device_class.trusts_builds_of.all()],
        "page": request.build_absolute_uri(device_class.get_absolute_url()),
    }


@router.get("devices", response=answers(list[DeviceOut]), auth=PIPELINES, url_name="api_devices")
@paginate(Page)
def devices_list(request, filters: Query[DeviceFilters]):
    """The devices of the caller's teams' classes, revoked ones included, by class and name;
    ?device_class= (a slug), ?online=true|false, ?draining=true|false."""
    devices = Device.objects.filter(device_class__team__in=teams_of(request.user))
    if filters.device_class:
        devices = devices.filter(device_class__slug=filters.device_class)
    if filters.online is not None:
        online = online_filter()
        devices = devices.filter(online) if filters.online else devices.exclude(online)
    if filters.draining is not None:
        devices = devices.filter(draining=filters.draining)
    devices = devices.select_related("device_class").order_by("device_class__slug", "name", "id")
    return Listed(devices, lambda device: device_row(request, device))


def device_row(request, device):
    heartbeat, revoked = device.last_heartbeat_at, device.revoked_at
    return {
        "id": device.pk,
        "name": device.name,
        "device_class": device.device_class.slug,
        "state": device.state,
        "online": device.is_online,
        "draining": device.draining,
        "revoked_at": revoked.isoformat() if revoked else None,
        "last_heartbeat_at": heartbeat.isoformat() if heartbeat else None,
        "delivery": device.delivery,
        "worker_version": device.worker_version,
        "url": request.build_absolute_uri(reverse("api_device", args=[device.pk])),
    }
