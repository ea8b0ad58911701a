"""A worker's benchmark result JSON, read into the fields of a run; anything malformed refused.

BenchmarkRun.record stores what run_fields returns, and LatencySamples.read the samples
block that sample_fields checks (the protocol: docs/protocol.md).
"""

import base64
import math

import numpy as np

from deployhub.benchmarks.scenarios import Scenario
from workers.measure.latency import SAMPLES_FORMAT, SAMPLES_KEPT

PERCENTILES = ("min", "p50", "p90", "p95", "p99", "max", "mean", "std")


def run_fields(result):
    """Return a run's fields from a worker's benchmark result; raise ValueError if malformed."""
    try:
        return {
            **_core(result),
            **_conditions(result),
            **_stability(result),
            **_server(result),
            **_offline(result),
            **_gpu(result),
            "batch_sweep": [_sweep_row(r) for r in _block(result, "batch_sweep", list) or []],
        }
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed benchmark result: {exc!r}") from exc


def _number(value, cast=float):
    """Return `value` as a finite number, or None when absent; raise ValueError otherwise."""
    if value is None:
        return None
    number = cast(value)
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number


def _required(value):
    """Return `value` as a finite float; raise ValueError when it is absent or not a number."""
    if value is None:
        raise ValueError("a required number is missing")
    return _number(value)


def _block(result, key, kind=dict):
    """Return the optional block `key` of a result (None when absent); raise if mistyped."""
    value = result.get(key)
    if value is not None and not isinstance(value, kind):
        raise ValueError(f"{key} must be a JSON {'object' if kind is dict else 'list'}")
    return value


def _latency(block):
    """Return a latency block with every percentile as a number (missing ones None)."""
    if not isinstance(block, dict):
        raise ValueError("latency_ms must be a JSON object")
    return {key: _number(block.get(key)) for key in PERCENTILES}


def _conditions(result):
    host = _block(result, "host") or {}
    scenario = result.get("scenario") or Scenario.SINGLE_STREAM
    if scenario not in dict(Scenario.choices()):
        raise ValueError(f"unknown scenario {scenario!r}")
    return {
        "scenario": scenario,
        "warmup_s": _number(result.get("warmup_s")),
        "duration_s": _number(result.get("duration_s")),
        "host": host,
        "host_cpu_model": str(host.get("cpu_model") or "")[:200],
        "host_logical_cpus": _number(host.get("logical_cpus"), int),
    }


def _stability(result):
    stability = _block(result, "stability") or {}
    reasons = stability.get("reasons") or []
    if not isinstance(reasons, list):
        raise ValueError("stability.reasons must be a list of sentences")
    stable = stability.get("stable")
    return {
        "cv": _number(result["cv"] if result.get("cv") is not None else stability.get("cv")),
        "stable": None if stable is None else bool(stable),
        "drift": _number(stability.get("drift")),
        "stability": {
            "reasons": [str(reason) for reason in reasons],
            "cv_core": _number(stability.get("cv_core")),
            "windows_p50_ms": [_number(v) for v in stability.get("windows_p50_ms") or []],
        },
    }


def _server(result):
    server = _block(result, "server")
    if server is None:
        return {}
    tried = server.get("tried") or []
    if not isinstance(tried, list) or not all(isinstance(row, dict) for row in tried):
        raise ValueError("server.tried must be a list of objects")
    return {
        "server": {
            **server,
            "latency_ms": _latency(server["latency_ms"]) if server.get("latency_ms") else None,
            "tried": [
                {key: _number(row.get(key)) for key in ("qps", "p99_ms", "achieved_qps")}
                for row in tried
            ],
        },
        "server_target_qps": _number(server.get("target_qps")),
        "server_achieved_qps": _number(server.get("achieved_qps")),
        "server_p99_ms": _number((server.get("latency_ms") or {}).get("p99")),
        "max_qps_in_budget": _number(server.get("max_qps_in_budget")),
    }


def _offline(result):
    offline = _block(result, "offline")
    if offline is None:
        return {}
    return {
        "offline_samples": _number(offline.get("samples"), int),
        "offline_wall_s": _number(offline.get("wall_s")),
        "offline_throughput_ips": _number(offline.get("throughput_ips")),
    }


def _sweep_row(row):
    if not isinstance(row, dict):
        raise ValueError("each batch_sweep row must be an object")
    return {
        "batch_size": int(row["batch_size"]),
        "latency_ms": _latency(row.get("latency_ms") or {}),
        "throughput_ips": _number(row.get("throughput_ips")),
        "cv": _number(row.get("cv")),
    }


def _gpu(result):
    gpu = _block(result, "gpu")
    if gpu is None:
        return {}
    return {"gpu": gpu, "peak_device_memory_mb": _number(gpu.get("peak_device_memory_mb"))}


def _core(result):
    latency = result["latency_ms"]
    return {
        "backend": str(result["backend"]),
        "provider": str(result.get("provider") or ""),
        "batch_size": int(result["batch_size"]),
        "warmup_iterations": int(result.get("warmup_iterations") or 0),
        "iterations": int(result["iterations"]),
        "intra_op_threads": int(result.get("intra_op_threads") or 0),
        "throughput_ips": _required(result["throughput_ips"]),
        "peak_rss_mb": _number(result.get("peak_rss_mb")),
        "rss_growth_mb": _number(result.get("rss_growth_mb")),
        "fingerprint": result.get("fingerprint") or {},
        **{f"latency_{key}_ms": _required(latency[key]) for key in PERCENTILES},
    }


def sample_fields(block, iterations):
    """Return (bytes, count, measured) of a latency_samples block; raise ValueError if wrong."""
    if not isinstance(block, dict) or block.get("format") != SAMPLES_FORMAT:
        raise ValueError(f'it must be an object with "format": "{SAMPLES_FORMAT}"')
    count, measured = _whole(block, "count"), _whole(block, "measured")
    if not 1 <= count <= min(measured, SAMPLES_KEPT):
        raise ValueError(
            f"count {count} must be 1 to {SAMPLES_KEPT} and at most measured ({measured})"
        )
    if measured != iterations:
        raise ValueError(f"measured {measured} differs from the run's iterations {iterations}")
    if not isinstance(block.get("data"), str):
        raise ValueError("data must be a base64 string")
    data = base64.b64decode(block["data"], validate=True)
    if len(data) != 4 * count:
        raise ValueError(f"data holds {len(data)} bytes; {count} float32 samples take {4 * count}")
    values = np.frombuffer(data, dtype="<f4")
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ValueError("data holds a NaN, infinite or negative latency")
    return data, count, measured


def _whole(block, key):
    """Return block[key] as a whole number; raise ValueError otherwise."""
    value = block.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be a whole number, got {value!r}")
    return value
