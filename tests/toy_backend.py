"""A fifth backend in one file, as CONTRIBUTING's recipe writes one: numpy runs the tiny model.

It builds by saving the tiny selftest model's weights and runs them with numpy,
so tests/test_toy_backend.py can register it and see it everywhere a backend shows.
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from workers.backends.base import Backend, CompileResult


class ToyBackend(Backend):
    """Runs a one-layer ONNX model (MatMul with a weight, then Relu) with numpy."""

    name = "toy"
    runtime = "numpy"
    extra = "worker"
    runs_on_cpu = True
    auto_builds = {"fp32": {}}

    @classmethod
    def compat_fields(cls, fingerprint, build_config):
        return {"numpy": (fingerprint or {}).get("numpy")}

    @classmethod
    def canonical_config(cls, build_config):
        return {"scale": 1.0, **(build_config or {})}

    @classmethod
    def artifact_problem(cls, path):
        """A .npy array of weights, read without pickle."""
        try:
            np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            return f"it is not a .npy array ({exc})"
        return ""

    def compile(self, source, build_config, workdir, *, progress=None):
        [weight] = onnx.load(str(source)).graph.initializer
        artifact = Path(workdir) / "weights.npy"
        np.save(artifact, numpy_helper.to_array(weight) * build_config.get("scale", 1.0))
        return CompileResult(artifact=artifact, tool_versions={"numpy": np.__version__})

    def load(self, artifact, build_config):
        return np.load(artifact)

    def infer(self, handle, feeds):
        [x] = feeds.values()
        return [np.maximum(x @ handle, 0)]
