"""Pages for device classes and their devices."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import IntegrityError, transaction
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from deployhub.core import accuracy, worker_dist
from deployhub.devices.access import (
    get_device_class_for_user,
    get_device_for_user,
    get_enrolment_token_for_user,
)
from deployhub.devices.actions import (
    change_device_class,
    create_device_class,
    create_enrolment_token,
    revoke_device,
    revoke_enrolment_token,
    set_draining,
)
from deployhub.devices.enrolment import hub_url, setup_lines, token_state
from deployhub.devices.forms import (
    BudgetForm,
    CompareForm,
    DeviceClassEditForm,
    DeviceClassForm,
    DeviceForm,
    EnrolmentTokenForm,
    ThroughputTargetForm,
)
from deployhub.devices.models import Device
from deployhub.devices.pages import class_sections, device_sections, fleet_sections
from deployhub.teams.access import current_team, require_role
from deployhub.teams.models import Event, Role
from workers.fingerprint import shape_problem
from workers.tasks import TASKS
from workers.version import worker_version


@login_required
def device_classes(request):
    team = current_team(request)
    form = DeviceClassForm()
    if request.method == "POST":
        require_role(request.user, team, Role.ADMIN)
        form = DeviceClassForm(request.POST)
        if form.is_valid():
            return redirect(create_device_class(team, request.user, form))
    classes = team.device_classes.prefetch_related("devices") if team else []
    status = 400 if form.errors else 200
    context = {"classes": classes, "form": form, "hub_version": worker_version()}
    context.update(fleet_sections.context(team))  # each class's waiting work (jobs)
    return render(request, "devices/classes.html", context, status=status)


@login_required
def device_class_detail(request, pk):
    device_class = get_device_class_for_user(request, pk)
    form = DeviceForm()
    new_token = None
    if request.method == "POST":
        require_role(request.user, device_class.team, Role.ADMIN)
        form = DeviceForm(request.POST)
        if form.is_valid():
            new_token = _register_device(request, device_class, form)
    context = _class_context(request, device_class, form=form, new_token=new_token)
    status = 400 if form.errors or context["budget_form"].errors else 200
    return render(request, "devices/class_detail.html", context, status=status)


def _class_context(request, device_class, **extra):
    return {
        **class_sections.context(device_class),
        "device_class": device_class,
        "devices": device_class.devices.all(),
        "task_tolerances": [
            (task, accuracy.describe_tolerance(task, device_class.tolerance_for(task)))
            for task in TASKS
        ],
        "edit_form": DeviceClassEditForm(instance=device_class),
        **_budget_calculator(request, device_class),
        "compare_form": _compare_form(request),
        **_enrolment_context(request, device_class, extra.pop("new_enrolment", None)),
        **extra,
    }


def _enrolment_context(request, device_class, new_enrolment):
    """The class's enrolment tokens and the lines that set up a device: with a new token's
    secret right after it was made (shown once), else with a placeholder."""
    secret = new_enrolment["token"] if new_enrolment else None
    tokens = list(device_class.enrolment_tokens.select_related("created_by"))
    for record in tokens:
        record.state, record.refusal_text = token_state(record), record.refusal()
    return {
        "enrolment_tokens": tokens,
        "enrolment_form": EnrolmentTokenForm(),
        "new_enrolment": new_enrolment,
        "setup_lines": setup_lines(hub_url(request), secret),
    }


def _budget_calculator(request, device_class):
    """Return the calculator of the figure the class's gate judges, and the runs that reach it.

    A real-time class: a target fps gives the budget per frame, and the runs whose p99
    is within it (their fps at p99 reaches the target). A batch class: a target in
    images/s, and the runs whose sustained throughput reaches it.
    """
    if device_class.is_batch:
        return _throughput_calculator(request, device_class)
    form = BudgetForm(request.GET if {"fps", "ms"} & set(request.GET) else None)
    if not form.is_valid():
        return {"budget_form": form, "budget_ms": None, "budget_runs": []}
    budget_ms = form.budget_ms
    runs = _class_runs(device_class).within_budget(budget_ms).order_by("gate_p99")
    return {"budget_form": form, "budget_ms": budget_ms, "budget_runs": runs[:100]}


def _compare_form(request):
    """Return the two-build throughput comparison, bound when the URL asks for it."""
    example = {name: field.initial for name, field in CompareForm.base_fields.items()}
    return CompareForm(request.GET if "batch_a" in request.GET else example, auto_id="cmp_%s")


def _throughput_calculator(request, device_class):
    form = ThroughputTargetForm(request.GET if "ips" in request.GET else None)
    if not form.is_valid():
        return {"budget_form": form, "target_ips": None, "budget_runs": []}
    target = form.cleaned_data["ips"]
    runs = _class_runs(device_class).sustaining(target).order_by("-sustained")
    return {"budget_form": form, "target_ips": target, "budget_runs": runs[:100]}


def _class_runs(device_class):
    return device_class.benchmarkrun_set.select_related(
        "model_version__model", "engine", "device", "device_class", "job"
    )


@login_required
@require_POST
def device_class_edit(request, pk):
    """Change a class's serving pattern and budgets; invalid input changes nothing."""
    device_class = get_device_class_for_user(request, pk)
    require_role(request.user, device_class.team, Role.ADMIN)
    form = DeviceClassEditForm(request.POST, instance=get_device_class_for_user(request, pk))
    if not form.is_valid():
        context = _class_context(request, device_class, form=DeviceForm(), edit_form=form)
        return render(request, "devices/class_detail.html", context, status=400)
    change_device_class(device_class, request.user, form)
    messages.success(request, f"{device_class} saved: {form.instance.gate_rule}")
    return redirect(device_class)


def _register_device(request, device_class, form):
    """Register a device and return its token (shown once), or None with a form error."""
    device = Device(device_class=device_class, name=form.cleaned_data["name"])
    token = device.issue_token()
    try:
        with transaction.atomic():
            device.save()
            Event.record(
                device_class.team, request.user, "device.registered", device, after="registered"
            )
    except IntegrityError:
        form.add_error("name", f"{device_class} already has a device named {device.name!r}.")
        return None
    return {"device": device, "token": token}


@login_required
@require_POST
def enrolment_token_create(request, pk):
    """Make an enrolment token for the class and show its secret, once, on the class page."""
    device_class = get_device_class_for_user(request, pk)
    require_role(request.user, device_class.team, Role.ADMIN)
    form = EnrolmentTokenForm(request.POST)
    if not form.is_valid():
        context = _class_context(request, device_class, form=DeviceForm(), enrolment_form=form)
        return render(request, "devices/class_detail.html", context, status=400)
    record, secret = create_enrolment_token(device_class, request.user, **form.cleaned_data)
    new_enrolment = {"record": record, "token": secret}
    context = _class_context(request, device_class, form=DeviceForm(), new_enrolment=new_enrolment)
    return render(request, "devices/class_detail.html", context)


@login_required
@require_POST
def enrolment_token_revoke(request, pk):
    """Stop an enrolment token enrolling devices; the devices it enrolled keep working."""
    record = get_enrolment_token_for_user(request, pk)
    revoke_enrolment_token(record, request.user)
    messages.success(request, f"Enrolment token {record.token_hint}… revoked.")
    return redirect(record.device_class)


@login_required
@require_POST
def device_revoke(request, pk):
    """Revoke the device: its token stops working, its running job goes back on the queue."""
    device = get_device_for_user(request, pk)
    revoke_device(device, request.user)
    messages.success(request, f"{device} is revoked: enrol it again to bring it back.")
    return redirect("device_detail", device.pk)


@login_required
@require_POST
def device_drain(request, pk):
    """Toggle whether the device takes new jobs."""
    device = get_device_for_user(request, pk)
    set_draining(device, not device.draining, request.user)
    messages.success(request, f"{device} is {'draining' if device.draining else 'accepting jobs'}.")
    return redirect(device.device_class)


@login_required
def device_detail(request, pk):
    device = get_device_for_user(request, pk)
    # One stored before the hub checked shapes may hold a field it cannot read: shown raw only.
    problem = shape_problem(device.fingerprint)
    context = {
        "device": device,
        "fingerprint": {} if problem else device.fingerprint,
        "fingerprint_problem": problem,
        "changes": device.fingerprint_changes.all()[:50],
        "hub_version": worker_version(),
        "install_worker": worker_dist.install_command(hub_url(request)),
        **device_sections.context(device),
    }
    return render(request, "devices/device_detail.html", context)
