"""API v1 for people and pipelines: parity checks of a version's preprocessing, and its gate."""

from typing import Any

from ninja import File, Form, Router, Status, UploadedFile
from ninja.pagination import paginate

from deployhub.api.auth import BadInput
from deployhub.api.v1 import PIPELINES, Listed, Page, Schema, answers
from deployhub.parity.actions import no_worker_warning, submit_parity
from deployhub.parity.gates import parity_gate
from deployhub.parity.models import ParityRun
from deployhub.registry.access import get_version_for_user
from deployhub.teams.access import require_role
from deployhub.teams.models import Role
from workers.checks.parity import PackError, pack_format

router = Router(tags=["parity"])


class ParityRunJob(Schema):
    id: int
    url: str
    state: str


class ParityRunOut(Schema):
    id: int
    version: int
    url: str
    job: ParityRunJob
    device_class: str
    verdict: str
    passed: bool | None
    samples: int
    sample_names: list[str]
    sha256: str
    size: int
    tolerance: float | None
    max_abs_error: float | None
    cause: str | None
    summary: str
    per_sample: list[dict[str, Any]]
    diagnosis: list[dict[str, Any]]
    error: str
    created_by: str
    created_at: str


class QueuedParityOut(ParityRunOut):
    warning: str | None


class ParityGateOut(Schema):
    gate: str
    status: str
    reason: str
    run: int | None


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


def _device_class(version, slug):
    slug = slug.strip()
    if not slug:
        return None
    device_class = version.team.device_classes.filter(slug=slug).first()
    if device_class is None:
        raise BadInput(f"{version.team} has no device class {slug!r}.")
    return device_class


@router.get(
    "versions/{int:pk}/parity",
    response=answers(list[ParityRunOut]),
    auth=PIPELINES,
    url_name="api_version_parity",
)
@paginate(Page)
def version_parity(request, pk: int):
    """The version's parity checks, newest first, with what each found."""
    runs = ParityRun.objects.for_version(get_version_for_user(request, pk))
    return Listed(runs.order_by("-created_at", "-pk"), run_json)


@router.get(
    "versions/{int:pk}/parity/gate",
    response=answers(ParityGateOut),
    auth=PIPELINES,
    url_name="api_version_parity_gate",
)
def version_parity_gate(request, pk: int):
    """The version's parity release gate: passed, failed (with the diagnosis) or missing."""
    return parity_gate(get_version_for_user(request, pk)).as_json()


@router.post(
    "versions/{int:pk}/parity",
    response=answers(QueuedParityOut, status=201),
    auth=PIPELINES,
    url_name="api_version_parity",
)
def version_parity_check(
    request,
    pk: int,
    file: File[UploadedFile | None] = None,
    device_class: Form[str] = "",
    tolerance: Form[str | None] = None,
):
    """Check a parity pack (a multipart .zip of images and tensors.npz) against the version's
    preprocessing spec on a device class (an engineer); 201 with the queued run."""
    version = get_version_for_user(request, pk)
    require_role(request.user, version.team, Role.ENGINEER)
    if file is None:
        raise BadInput(
            f"Send the parity pack as a multipart file field named 'file'. {pack_format()}"
        )
    try:
        run = submit_parity(
            version,
            file,
            request.user,
            device_class=_device_class(version, device_class),
            tolerance=tolerance,
        )
    except PackError as exc:
        raise BadInput(str(exc)) from exc
    warning = no_worker_warning(run.job.device_class)
    return Status(201, {**run_json(run), "warning": warning or None})
