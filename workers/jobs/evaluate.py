"""An evaluate job: compare an engine with its FP32 source on a dataset, golden pairs or both."""

from workers import kinds
from workers.backends.onnxruntime import engine_model_path, provider_of
from workers.checks import golden
from workers.checks.evaluate import evaluate
from workers.errors import JobError
from workers.jobs.loading import check_engines, harness_runs, load_engine, onnx_model_path
from workers.kinds import DATASET_INPUT, ENGINE_INPUT, GOLDEN_INPUT, MODEL_INPUT

KIND = kinds.EVALUATE
# Refuse, before downloading, an engine this worker cannot run.
check = check_engines


def run(job_run, inputs):
    """Compare the job's engine with its FP32 source on a dataset, on golden pairs, or both."""
    engine = job_run.job["inputs"].get(ENGINE_INPUT)
    if (
        engine is None
        or MODEL_INPUT not in inputs
        or not {DATASET_INPUT, GOLDEN_INPUT} & inputs.keys()
    ):
        raise JobError(
            "an evaluate job needs the inputs 'engine' and 'model', and 'dataset', 'golden' or both"
        )
    run_engine = _evaluated_engine(job_run, inputs, engine)
    source = inputs[MODEL_INPUT]
    if source.suffix != ".pt2":
        source = onnx_model_path(source, job_run.workdir / "reference")
    params = job_run.job.get("params") or {}
    watch = {
        "progress": job_run.report,
        "should_stop": job_run.should_stop,
        "model_io": job_run.model_io(),
    }
    result = {}
    if DATASET_INPUT in inputs:
        result = evaluate(run_engine, source, inputs[DATASET_INPUT], params, **watch)
        job_run.log.add(evaluation_summary(result))
    if GOLDEN_INPUT in inputs:
        golden_params = params.get("golden") or {}
        result["golden"] = golden.evaluate_golden(
            run_engine, source, inputs[GOLDEN_INPUT], golden_params, **watch
        )
        job_run.log.add(golden.summary(result["golden"]))
    return {
        **result,
        "backend": engine.get("backend"),
        "fingerprint": job_run.current_fingerprint(),
    }


def _evaluated_engine(job_run, inputs, engine):
    """Return run(feeds) -> outputs of the job's engine, loaded by its backend."""
    if not harness_runs(engine):
        loaded = load_engine(job_run, inputs, engine)
        return lambda feeds: loaded.run(None, feeds)
    import onnxruntime

    path = engine_model_path(inputs[ENGINE_INPUT])
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    providers = [provider_of(engine.get("build_config"))]
    session = onnxruntime.InferenceSession(str(path), options, providers=providers)
    return lambda feeds: session.run(None, feeds)


def evaluation_summary(result):
    """Say what an evaluation found in one line: the task's agreement with the source, then
    its labelled headline when the dataset had labels."""
    key = result["agreement_metric"]
    agreement = result["agreement"].get(key)
    shown = "not measured" if agreement is None else f"{agreement:.4f}"
    line = f"evaluated {result['samples']} samples as {result['task']}: {key} {shown}"
    metric = result.get("metric")
    engine, reference = (result.get("engine") or {}), (result.get("reference") or {})
    if metric and engine.get(metric) is not None:
        line += f", {metric} {engine[metric]:.4f} (FP32 source {reference[metric]:.4f})"
    return (
        f"{line}, max abs error {result['max_abs_error']:.3g}, "
        f"cosine min {result['cosine_min']:.5f}"
    )
