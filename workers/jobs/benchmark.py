"""A benchmark job: time the job's model or engine on this device (workers/measure/benchmark.py)."""

from workers import kinds
from workers.backends.onnxruntime import engine_model_path, provider_of
from workers.errors import JobError
from workers.jobs.loading import check_engines, harness_runs, load_engine, onnx_model_path
from workers.kinds import ENGINE_INPUT, MODEL_INPUT
from workers.measure.benchmark import benchmark_onnxruntime, benchmark_session

KIND = kinds.BENCHMARK
# Refuse, before downloading, an engine this worker cannot run.
check = check_engines


def run(job_run, inputs):
    """Benchmark the job's model or engine input; return the protocol's benchmark result."""
    engine = job_run.job["inputs"].get(ENGINE_INPUT)
    if engine is not None and not harness_runs(engine):
        result = _benchmark_loaded_engine(job_run, inputs, engine)
    else:
        model, params, preoptimized = _benchmark_subject(job_run, inputs)
        result = benchmark_onnxruntime(
            model,
            params,
            progress=job_run.report,
            should_stop=job_run.should_stop,
            preoptimized=preoptimized,
            model_io=job_run.model_io(),
        )
    _log_benchmark(job_run.log, result)
    result["fingerprint"] = job_run.current_fingerprint()
    return result


def _benchmark_loaded_engine(job_run, inputs, engine):
    params = job_run.job.get("params") or {}
    return benchmark_session(
        lambda settings: load_engine(job_run, inputs, engine),
        params,
        progress=job_run.report,
        should_stop=job_run.should_stop,
        model_io=job_run.model_io(),
    )


def _benchmark_subject(job_run, inputs):
    """Return (ONNX file, params, whether it is an optimised engine) for a benchmark."""
    params = job_run.job.get("params") or {}
    if ENGINE_INPUT in inputs:
        engine = job_run.job["inputs"][ENGINE_INPUT]
        params = _engine_benchmark_params(params, engine)
        return engine_model_path(inputs[ENGINE_INPUT]), params, True
    if MODEL_INPUT in inputs:
        return onnx_model_path(inputs[MODEL_INPUT], job_run.workdir / "model"), params, False
    raise JobError("a benchmark job needs an input named 'model' or 'engine'")


def _engine_benchmark_params(params, engine):
    """Return the benchmark params for an onnxruntime engine: its provider, no other."""
    provider = provider_of(engine.get("build_config"))
    asked = params.get("provider", provider)
    if asked != provider:
        raise JobError(f"the engine was built for {provider}; benchmark it there, not on {asked}")
    return {**params, "provider": provider}


def _log_benchmark(log, result):
    """Log a benchmark's headline figures, and why they may not be trusted."""
    latency = result["latency_ms"]
    log.add(
        f"benchmark done: p50 {latency['p50']:.3f} ms, p99 {latency['p99']:.3f} ms, "
        f"{result['throughput_ips']:.1f} inferences/s over {result['iterations']} runs"
    )
    for reason in result["stability"]["reasons"]:
        log.add(f"unstable: {reason}")
    server = result.get("server")
    if server and server["max_qps_in_budget"] is not None:
        best, budget = server["max_qps_in_budget"], server["budget_ms"]
        log.add(f"server: p99 within {budget:g} ms up to {best:.1f} queries/s")
