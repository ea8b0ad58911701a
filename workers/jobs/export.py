"""An export job: a .pt2 program exported to ONNX, or an ONNX model converted to another opset."""

from workers import kinds
from workers.checks.convert import conversion_line, convert_onnx
from workers.checks.export import export_pt2_to_onnx
from workers.errors import JobError
from workers.kinds import EXPORT_ARTIFACT, MODEL_INPUT

KIND = kinds.EXPORT


def run(job_run, inputs):
    """Export the job's .pt2 input to ONNX (or convert an ONNX input's opset), upload it.

    Return the protocol's export result.
    """
    if MODEL_INPUT not in inputs:
        raise JobError("an export job needs an input named 'model' (the .pt2 program)")
    params = job_run.job.get("params") or {}
    onnx_path = job_run.workdir / "export" / f"{inputs['model'].stem}.onnx"
    onnx_path.parent.mkdir()
    if "convert_to_opset" in params:  # an ONNX version converted to another opset
        result = convert_onnx(inputs[MODEL_INPUT], onnx_path, params, progress=job_run.report)
        job_run.log.add(conversion_line(result))
        sha256 = job_run.upload(EXPORT_ARTIFACT, onnx_path)
        return {**result, "artifact": EXPORT_ARTIFACT, "artifact_sha256": sha256}
    result = export_pt2_to_onnx(inputs[MODEL_INPUT], onnx_path, params, progress=job_run.report)
    job_run.log.add(
        f"exported to ONNX opset {result['opset']} ({result['onnx_bytes']} bytes); "
        f"largest difference from PyTorch over {result['samples']} samples: "
        f"{result['max_abs_diff']:.3g} absolute, {result['max_rel_diff']:.3g} relative"
    )
    sha256 = job_run.upload(EXPORT_ARTIFACT, onnx_path)
    return {**result, "artifact": EXPORT_ARTIFACT, "artifact_sha256": sha256}
