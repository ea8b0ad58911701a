"""A compare job: time several engines side by side in one process (measure/side_by_side.py)."""

from functools import partial

from workers import kinds
from workers.backends.onnxruntime import engine_model_path, provider_of
from workers.errors import JobError
from workers.jobs.loading import check_engines, harness_runs, load_engine
from workers.kinds import compared_engine_input
from workers.measure import side_by_side
from workers.measure.benchmark import create_session, read_settings

KIND = kinds.COMPARE
# Refuse, before downloading, an engine this worker cannot run.
check = check_engines


def run(job_run, inputs):
    """Time the job's engines side by side in this process; return the protocol's result."""
    params = job_run.job.get("params") or {}
    described = job_run.job["inputs"]
    loaders = {}
    for engine_id in params.get("engines") or ():
        name = compared_engine_input(engine_id)
        if name not in inputs:
            raise JobError(f"the compare job lists engine {engine_id} but has no input {name}")
        loaders[str(engine_id)] = partial(
            _compared_engine, job_run, inputs, described[name], inputs[name], params
        )
    result = side_by_side.compare(
        loaders,
        params,
        progress=job_run.report,
        should_stop=job_run.should_stop,
        model_io=job_run.model_io(),
    )
    for figures in result["engines"]:
        job_run.log.add(
            f"engine {figures['engine']}: best round median {figures['best_round_ms']:.4f} ms, "
            f"median of rounds {figures['median_round_ms']:.4f} ms"
        )
    verdict = "tied with" if result["tied"] else f"{result['lead']:.3f}x faster than"
    job_run.log.add(f"fastest: engine {result['fastest']}, {verdict} the next")
    result["fingerprint"] = job_run.current_fingerprint()
    return result


def _compared_engine(job_run, inputs, engine, path, params):
    """Load one engine of a compare job as the benchmark harness runs it."""
    if not harness_runs(engine):
        return load_engine(job_run, inputs, engine, path)
    provider = provider_of(engine.get("build_config"))
    settings = read_settings({"provider": provider, "seed": params.get("seed")})
    return create_session(engine_model_path(path), settings, preoptimized=True)
