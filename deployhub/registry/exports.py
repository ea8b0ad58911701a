"""A PyTorch export program (.pt2) becomes an ONNX child version, through a worker's export job."""

from django.conf import settings

from deployhub.jobs.errors import ResultRejected
from deployhub.registry.contract import ContractError, concrete_shapes, validate_contract
from deployhub.registry.inspect import InvalidModel
from deployhub.registry.models import ModelVersion, VersionFormat


def export_params(version):
    """Return the export job's params: fixed shapes from the contract, the opset setting."""
    return {
        "input_shapes": concrete_shapes(version.contract),
        "opset": settings.DEPLOYHUB_EXPORT_OPSET,
    }


def submit_export(version, device_class, user):
    """Queue the export of a .pt2 version on a device class with torch."""
    from deployhub.jobs.actions import submit_job

    return submit_job(
        team=version.team,
        kind="export",
        device_class=device_class,
        user=user,
        model_version=version,
        params=export_params(version),
    )


def _exported_artifact(job, result):
    artifact = job.artifacts.filter(attempt=job.attempt, name=result.get("artifact", "onnx")).last()
    if artifact is None:
        raise ResultRejected("The export finished without uploading its ONNX file.")
    if result.get("artifact_sha256") not in (None, artifact.sha256):
        raise ResultRejected(
            "The uploaded ONNX file does not match the sha256 the worker reported."
        )
    return artifact


def _child_contract(parent, inputs):
    try:
        return validate_contract(parent.contract, inputs)
    except ContractError:
        return {}


def record_export(job, result):
    """Create the ONNX child of the exported version from the job's uploaded artifact."""
    from deployhub.registry.uploads import inspect_upload, local_copy

    parent = job.model_version
    artifact = _exported_artifact(job, result)
    if existing := parent.model.versions.filter(sha256=artifact.sha256).first():
        return existing
    with local_copy(artifact.file.name) as path:
        try:
            info = inspect_upload(path, VersionFormat.ONNX)
        except InvalidModel as exc:
            raise ResultRejected(f"The exported ONNX model is not valid: {exc}") from exc
        return _save_child(job, artifact, info, path, result)


def _save_child(job, artifact, info, path, result):
    """Store the exported ONNX file as a child version of the job's .pt2 version."""
    from deployhub.registry.uploads import VERSION_FIELDS, save_version

    parent = job.model_version
    version = ModelVersion(
        model=parent.model,
        sha256=artifact.sha256,
        size=artifact.size,
        parent=parent,
        original_filename=f"{parent.model.name}-v{parent.number}.onnx",
        notes=f"Exported from v{parent.number} by job #{job.pk}.",
        preprocessing=parent.preprocessing,
        contract=_child_contract(parent, info["inputs"]),
        export_report=result,
        created_by=job.created_by,
        **{key: value for key, value in info.items() if key in VERSION_FIELDS},
    )
    version.format = VersionFormat.ONNX
    return save_version(version, path, move=False)
