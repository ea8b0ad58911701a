"""Benchmark results as workers send them (old and new shapes), and a way to store them."""

import copy

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.evaluation.models import AccuracyRun
from deployhub.jobs.models import Job, JobKind
from deployhub.registry.uploads import derive_version

LATENCY = {
    "min": 9.0,
    "p50": 10.0,
    "p90": 12.0,
    "p95": 13.0,
    "p99": 15.0,
    "max": 20.0,
    "mean": 10.5,
    "std": 1.0,
}

# What a worker from before the scenarios sent.
OLD_RESULT = {
    "backend": "onnxruntime",
    "provider": "CPUExecutionProvider",
    "batch_size": 1,
    "warmup_iterations": 10,
    "iterations": 1000,
    "intra_op_threads": 2,
    "latency_ms": LATENCY,
    "throughput_ips": 100.0,
    "peak_rss_mb": 80.0,
    "rss_growth_mb": 3.0,
    "fingerprint": {"cpu": {"model": "Test CPU"}},
}

# The rewritten harness: scenario, time-based runs, stability, host, optional blocks.
NEW_RESULT = {
    **OLD_RESULT,
    "scenario": "single-stream",
    "warmup_iterations": 210,
    "warmup_s": 2.0,
    "iterations": 1030,
    "duration_s": 10.0,
    "cv": 0.04,
    "stability": {
        "stable": True,
        "reasons": [],
        "cv": 0.04,
        "drift": 0.01,
        "windows_p50_ms": [10.0, 10.1, 9.9],
    },
    "server": None,
    "offline": None,
    "batch_sweep": None,
    "host": {"cpu_model": "Intel Xeon Test", "logical_cpus": 4, "intra_op_threads": 2},
    "gpu": None,
}

SERVER_BLOCK = {
    "target_qps": 50.0,
    "achieved_qps": 49.6,
    "latency_ms": {**LATENCY, "p99": 21.0},
    "budget_ms": 33.3,
    "max_qps_in_budget": 80.0,
    "tried": [
        {"qps": 50.0, "p99_ms": 21.0, "achieved_qps": 49.6},
        {"qps": 80.0, "p99_ms": 31.0, "achieved_qps": 79.1},
        {"qps": 120.0, "p99_ms": 55.0, "achieved_qps": 101.0},
    ],
}

SWEEP = [
    {"batch_size": 1, "latency_ms": LATENCY, "throughput_ips": 100.0, "cv": 0.03},
    {"batch_size": 8, "latency_ms": {**LATENCY, "p50": 40.0}, "throughput_ips": 200.0, "cv": 0.02},
]

RANGE_CONTRACT = {
    "inputs": {
        "image": {
            "shape": ["batch", 3, 32, 32],
            "batch": {"min": 1, "opt": 8, "max": 24},
            "dynamic": {},
        }
    }
}


def result(base=NEW_RESULT, **changes):
    """Return a deep copy of a result with top-level keys changed."""
    return {**copy.deepcopy(base), **changes}


def record_run(version, device_class, body, engine=None):
    """Store a result as a worker's completion would: through BenchmarkRun.record on a job."""
    job = Job.objects.create(
        team=version.team,
        kind=JobKind.BENCHMARK,
        device_class=device_class,
        model_version=version,
        engine=engine,
        state="succeeded",
    )
    return BenchmarkRun.record(job, body)


def details_of(client, run):
    """Return a run's details as a results table loads them when they are opened."""
    response = client.get(run.details_url)
    assert response.status_code == 200
    return response.content.decode()


def ranged(version, user):
    """Return a child of the version whose contract allows batch 1 to 24."""
    return derive_version(version, user, contract=RANGE_CONTRACT)


def record_evaluation(job, engine, agreement=1.0, max_abs_error=0.1, cosine_min=0.99):
    """Store an engine's evaluation against its source, as an evaluate job's completion would."""
    return AccuracyRun.objects.create(
        job=job,
        engine=engine,
        samples=100,
        top1_agreement=agreement,
        max_abs_error=max_abs_error,
        mean_abs_error=max_abs_error / 5,
        cosine_min=cosine_min,
        cosine_mean=(1 + cosine_min) / 2 if cosine_min < 1 else 1.0,
    )
