"""Check that this device's runtimes work, on a tiny model built on the spot.

`deployhub-worker selftest` runs every check in CHECKS and prints one line
each. A new runtime (TensorRT, OpenVINO) adds its check function to CHECKS.
"""

import tempfile
from pathlib import Path

from workers.benchmark import benchmark_onnxruntime

TINY_FEATURES = 16
SELFTEST_PARAMS = {"warmup_iterations": 5, "iterations": 50, "batch_size": 2}


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


def check_onnxruntime(workdir):
    """Benchmark the tiny model with ONNX Runtime; return a one-line summary."""
    model = write_tiny_model(Path(workdir) / "tiny.onnx")
    result = benchmark_onnxruntime(model, SELFTEST_PARAMS)
    latency = result["latency_ms"]
    return (
        f"{result['provider']}, batch {result['batch_size']}: "
        f"p50 {latency['p50']:.3f} ms, p99 {latency['p99']:.3f} ms, "
        f"{result['throughput_ips']:.0f} inferences/s, peak RSS {result['peak_rss_mb']:.0f} MB"
    )


# (name, check): a check takes a scratch folder and returns a one-line summary or raises.
CHECKS = [
    ("onnxruntime", check_onnxruntime),
    # TensorRT goes here: ("tensorrt", check_tensorrt), built and run on the device's GPU.
]


def run_checks(out):
    """Run every check, writing one line each to out; return True when all pass."""
    passed = True
    for name, check in CHECKS:
        with tempfile.TemporaryDirectory(prefix=f"deployhub-selftest-{name}-") as workdir:
            try:
                out.write(f"{name}: ok: {check(workdir)}\n")
            except Exception as error:
                out.write(f"{name}: FAILED: {type(error).__name__}: {error}\n")
                passed = False
    return passed
