"""Prove that this device's backends build and run engines, on a tiny model made on the spot.

`deployhub-worker selftest [--backend NAME]` takes each backend asked for
(every backend the registry knows by default), compiles the tiny model with
that backend's default build config, loads the engine, runs it once and
compares the output with ONNX Runtime's on the CPU, the reference. It prints
one JSON document:

    {"backends": {"onnxruntime": {"ok": true, "build_seconds": 0.05,
                                  "max_abs_diff": 0.0, ...},
                  "tensorrt": {"ok": false, "missing": "tensorrt is not installed: ..."}},
     "fingerprint": {...}}

A backend that cannot run here says what is missing (for TensorRT, the GPU,
driver and CUDA too, read from the fingerprint); one that fails says at which
stage and why. So a user with a GPU proves TensorRT in one command:
`deployhub-worker selftest --backend tensorrt`.
"""

import importlib
import tempfile
import time
from pathlib import Path

from workers import fingerprint as fingerprints
from workers.backends import known

TINY_FEATURES = 16
TINY_BATCH = 2
# The tiny model's input-shape contract, as the hub would pass it: batches of 1 or 2.
TINY_CONTRACT = {
    "inputs": {
        "x": {"shape": ["batch", TINY_FEATURES], "batch": {"sizes": [1, TINY_BATCH]}, "dynamic": {}}
    }
}


def write_tiny_model(path, features=TINY_FEATURES):
    """Write a MatMul + Relu ONNX model with input x[batch, features] to path."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((features, features), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "deployhub-selftest",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", features])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by every ONNX Runtime we support
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return Path(path)


def backends_named(names):
    """Return the backend classes asked for (all when none); raise UnknownBackend for a typo."""
    return [known.get(name) for name in names or known.BACKENDS]


def run(backends, fingerprint=None):
    """Check each backend class; return the selftest document."""
    fingerprint = fingerprints.collect() if fingerprint is None else fingerprint
    return {
        "backends": {backend.name: check_backend(backend, fingerprint) for backend in backends},
        "fingerprint": fingerprint,
    }


def all_ok(document):
    """Return True when every backend in a selftest document passed."""
    return all(entry["ok"] for entry in document["backends"].values())


def check_backend(backend, fingerprint):
    """Return one backend's entry: what is missing, or how its tiny engine built and ran."""
    missing = missing_requirements(backend, fingerprint)
    if missing:
        entry = {"ok": False, "missing": missing[0]}
        return entry | ({"also_missing": missing[1:]} if len(missing) > 1 else {})
    with tempfile.TemporaryDirectory(prefix=f"deployhub-selftest-{backend.name}-") as workdir:
        return exercise(backend(), Path(workdir))


def missing_requirements(backend, fingerprint):
    """Return what this host lacks for a backend, one sentence each (empty when nothing)."""
    missing = []
    problem = _import_problem(backend)
    if problem:
        missing.append(problem)
    return missing + backend.host_problems(fingerprint)


def exercise(backend, workdir):
    """Compile, load and run the tiny model with a backend; compare with the reference."""
    # A backend that builds from the contract (TensorRT's profiles) is given the tiny one.
    config = {"contract": TINY_CONTRACT} if backend.builds_from_contract else {}
    entry = {"ok": False, "build_config": config}
    stage = "compile"
    try:
        model = write_tiny_model(workdir / "tiny.onnx")
        (workdir / "build").mkdir()
        started = time.monotonic()
        built = backend.compile(model, config, workdir / "build")
        entry |= _timing("build_seconds", started)
        entry |= {"artifact": built.artifact.name, "artifact_bytes": built.artifact.stat().st_size}
        entry |= {"tool_versions": built.tool_versions, "graph_report": built.graph_report}
        stage, started = "load", time.monotonic()
        handle = backend.load(built.artifact, config)
        entry |= _timing("load_seconds", started)
        stage, started, feeds = "infer", time.monotonic(), tiny_feeds()
        outputs = backend.infer(handle, feeds)
        entry |= _timing("infer_seconds", started)
        stage = "compare"
        diff = max_abs_diff(outputs, reference_outputs(model, feeds))
    except Exception as error:  # a selftest reports every failure; it never crashes
        return entry | {"stage": stage, "error": f"{type(error).__name__}: {error}"}
    tolerance = backend.selftest_tolerance
    return entry | {"ok": diff <= tolerance, "max_abs_diff": diff, "tolerance": tolerance}


def tiny_feeds():
    """Return the tiny model's input: a fixed batch of TINY_BATCH random rows."""
    import numpy as np

    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal((TINY_BATCH, TINY_FEATURES), dtype=np.float32)}


def reference_outputs(model, feeds):
    """Return the model's outputs computed by ONNX Runtime on the CPU."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def max_abs_diff(outputs, expected):
    """Return the largest absolute difference between two lists of arrays of the same shapes."""
    import numpy as np

    if len(outputs) != len(expected):
        raise ValueError(f"{len(outputs)} outputs, the reference has {len(expected)}")
    diff = 0.0
    for got, want in zip(outputs, expected, strict=True):
        got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            raise ValueError(f"an output has shape {got.shape}, the reference {want.shape}")
        diff = max(diff, float(np.max(np.abs(got - want), initial=0.0)))
    return diff


def _import_problem(backend):
    """Return why a backend's runtime does not import here, None when it does."""
    try:
        importlib.import_module(backend.runtime)
    except ModuleNotFoundError as error:
        if error.name != backend.runtime:
            return f"{backend.runtime} is installed but incomplete ({error})"
        return (
            f"{backend.runtime} is not installed: "
            f"pip install deployhub[{backend.extra}]{backend.install_note}"
        )
    except Exception as error:  # installed without its native libraries, say
        return (
            f"{backend.runtime} is installed but does not import ({type(error).__name__}: {error})"
        )
    return None


def _timing(name, started):
    """Return {name: seconds since started}, rounded for people."""
    return {name: round(time.monotonic() - started, 4)}
