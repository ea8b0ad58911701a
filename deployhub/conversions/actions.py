"""ONNX children made by a worker's export job: a .pt2 exported, or an ONNX file's opset converted.

Either way the worker uploads one ONNX file with a report of how far it strays
from its source, and the hub stores it as a child version of the job's version.
Conversions sit above jobs and registry: they queue jobs and store versions.
"""

import onnx
from django.conf import settings

from deployhub.core.store import local_copy
from deployhub.jobs.actions import submit_job
from deployhub.jobs.errors import ResultRejected
from deployhub.jobs.models import JobKind, JobState
from deployhub.registry.contract import ContractError, concrete_shapes, validate_contract
from deployhub.registry.inspect import InvalidModel
from deployhub.registry.models import ModelVersion, VersionFormat
from deployhub.registry.tasks import inherited_task
from deployhub.registry.uploads import VERSION_FIELDS, inspect_upload, save_version
from workers.checks.convert import CONVERT_OPSET, MIN_OPSET
from workers.kinds import EXPORT_ARTIFACT


class ConversionRefused(ValueError):
    """A conversion cannot be queued as asked; the message says why."""


def export_params(version):
    """Return the export job's params: fixed shapes from the contract, the opset setting."""
    return {
        "input_shapes": concrete_shapes(version.contract),
        "opset": settings.DEPLOYHUB_EXPORT_OPSET,
    }


def conversion_class(version, chosen=None):
    """Return the class an export or conversion runs on: the one chosen, else the team's first."""
    return chosen or version.team.device_classes.first()


def submit_export(version, device_class, user):
    """Queue the export of a .pt2 version on a device class with torch."""
    return submit_job(
        team=version.team,
        kind=JobKind.EXPORT,
        device_class=device_class,
        user=user,
        model_version=version,
        params=export_params(version),
    )


def convert_params(version, opset):
    """Return the job params that convert a version to opset, its inputs shaped by the contract."""
    contract = version.contract or {}
    shapes = concrete_shapes(contract) if contract.get("inputs") else {}
    return {"convert_to_opset": opset, "input_shapes": shapes}


def submit_convert(version, device_class, user, opset=None):
    """Queue the conversion of an ONNX version to another opset; raise ConversionRefused."""
    opset = _opset(version, CONVERT_OPSET if opset in (None, "") else opset)
    device_class = conversion_class(version, device_class)
    if device_class is None:
        raise ConversionRefused("No device class to convert on: register one, then convert.")
    return submit_job(
        team=version.team,
        kind=JobKind.EXPORT,
        device_class=device_class,
        user=user,
        model_version=version,
        params=convert_params(version, opset),
    )


def _opset(version, asked):
    """Return the opset asked for as an int, refusing what cannot be converted to."""
    if not version.is_onnx:
        raise ConversionRefused("Only an ONNX version has an opset to convert.")
    if version.external_data:
        raise ConversionRefused(
            f"{version} keeps its weights in external data files: converting it is not "
            "supported yet. Convert the file with onnx.version_converter and upload the result."
        )
    newest = onnx.defs.onnx_opset_version()
    try:
        opset = int(str(asked).strip())
    except ValueError:
        opset = None
    if opset is None or isinstance(asked, bool) or not MIN_OPSET <= opset <= newest:
        raise ConversionRefused(f"The opset must be a whole number from {MIN_OPSET} to {newest}.")
    if opset == version.opset:
        raise ConversionRefused(f"{version} is at opset {opset} already: nothing to convert.")
    return opset


def converted_version(job):
    """Return the child version an export or conversion job stored; None when it stored none."""
    if job.state != JobState.SUCCEEDED:
        return None
    uploaded = job.artifacts.filter(attempt=job.attempt).values_list("sha256", flat=True)
    return job.model_version.model.versions.filter(sha256__in=list(uploaded)).first()


def _exported_artifact(job, result):
    artifact = job.artifacts.filter(
        attempt=job.attempt, name=result.get("artifact", EXPORT_ARTIFACT)
    ).last()
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
    parent = job.model_version
    converted = "source_opset" in result
    version = ModelVersion(
        model=parent.model,
        sha256=artifact.sha256,
        size=artifact.size,
        parent=parent,
        original_filename=_child_filename(parent, result if converted else None),
        notes=_conversion_notes(job, result) if converted else _export_notes(job),
        preprocessing=parent.preprocessing,
        contract=_child_contract(parent, info["inputs"]),
        export_report=result,
        task=inherited_task(parent, info),
        created_by=job.created_by,
        **{key: value for key, value in info.items() if key in VERSION_FIELDS},
    )
    version.format = VersionFormat.ONNX
    return save_version(version, path, move=False)


def _child_filename(parent, conversion):
    """Return the child's display filename: <model>-v<n>.onnx, or -opset<N> for a conversion."""
    suffix = f"-opset{conversion['opset']}" if conversion else ""
    return f"{parent.model.name}-v{parent.number}{suffix}.onnx"


def _export_notes(job):
    return f"Exported from v{job.model_version.number} by job #{job.pk}."


def _conversion_notes(job, result):
    """Say what the conversion did and how far the converted model strays from its source."""
    return (
        f"Converted from v{job.model_version.number} (opset {result.get('source_opset')}) "
        f"to opset {result.get('opset')} with onnx.version_converter by job #{job.pk}. "
        f"Largest difference from the source on {result.get('samples')} random inputs: "
        f"{_number(result.get('max_abs_diff'))} absolute, {_number(result.get('max_rel_diff'))} "
        "relative (the source run by the ONNX reference evaluator, the converted model by "
        "ONNX Runtime)."
    )


def _number(value):
    return f"{value:.3g}" if isinstance(value, int | float) else "unknown"
