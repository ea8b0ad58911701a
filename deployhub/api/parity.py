"""API v1 for people and scripts: parity checks of a version, with personal tokens."""

from django.http import JsonResponse
from django.views.decorators.http import require_http_methods
from ninja import Router

from deployhub.api.auth import BadInput, for_pipelines, token_required
from deployhub.parity.actions import no_worker_warning, submit_parity
from deployhub.parity.gates import parity_gate
from deployhub.parity.models import ParityRun
from deployhub.registry.access import get_version_for_user
from deployhub.teams.access import require_role
from deployhub.teams.models import Role
from workers.parity import PackError, pack_format

# Its django-ninja operations (api/openapi.py mounts it at /api/v1/).
router = Router(tags=["parity"])


def run_json(run):
    job = run.job
    return {
        "id": run.pk,
        "version": run.model_version_id,
        "url": run.get_absolute_url(),
        "job": {"id": job.pk, "url": job.get_absolute_url(), "state": job.state},
        "device_class": job.device_class.slug,
        "verdict": run.verdict,
        "passed": run.passed,
        "samples": run.samples,
        "sample_names": run.sample_names,
        "sha256": run.sha256,
        "size": run.size,
        "tolerance": run.tolerance_used if run.tolerance_used is not None else run.tolerance,
        "max_abs_error": run.max_abs_error,
        "cause": run.cause,
        "summary": run.summary,
        "per_sample": run.per_sample,
        "diagnosis": run.diagnosis,
        "error": job.error,
        "created_by": str(run.created_by or ""),
        "created_at": run.created_at.isoformat(),
    }


def _device_class(request, version):
    slug = request.POST.get("device_class", "").strip()
    if not slug:
        return None
    device_class = version.team.device_classes.filter(slug=slug).first()
    if device_class is None:
        raise BadInput(f"{version.team} has no device class {slug!r}.")
    return device_class


def _pack(request):
    if "file" not in request.FILES:
        raise BadInput(
            f"Send the parity pack as a multipart file field named 'file'. {pack_format()}"
        )
    return request.FILES["file"]


@require_http_methods(["GET", "POST"])
@token_required
@for_pipelines
def version_parity(request, pk):
    version = get_version_for_user(request, pk)
    if request.method == "GET":
        runs = ParityRun.objects.for_version(version)
        body = {"gate": parity_gate(version).as_json(), "runs": [run_json(r) for r in runs]}
        return JsonResponse(body)
    require_role(request.user, version.team, Role.ENGINEER)
    try:
        run = submit_parity(
            version,
            _pack(request),
            request.user,
            device_class=_device_class(request, version),
            tolerance=request.POST.get("tolerance"),
        )
    except PackError as exc:
        raise BadInput(str(exc)) from exc
    warning = no_worker_warning(run.job.device_class)
    return JsonResponse({**run_json(run), "warning": warning or None}, status=201)
