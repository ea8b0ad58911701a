"""`deployhub-worker selftest`: build, load and run a tiny model per backend; one JSON document."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workers import selftest
from workers.backends.base import Backend, CompileResult
from workers.backends.known import BACKENDS
from workers.backends.tensorrt import TensorRTBackend
from workers.errors import JobError

ROOT = Path(__file__).resolve().parent.parent
NO_GPU = {"gpus": None, "nvidia_driver": None, "cuda": None, "torch": None}


def selftest_command(*args):
    """Run `python -m workers selftest ARGS` as a user would; return the completed process."""
    return subprocess.run(
        [sys.executable, "-m", "workers", "selftest", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_it_proves_onnxruntime_and_prints_one_json_document():
    completed = selftest_command("--backend", "onnxruntime")

    assert completed.returncode == 0, completed.stderr
    document = json.loads(completed.stdout)
    assert list(document["backends"]) == ["onnxruntime"]
    result = document["backends"]["onnxruntime"]
    assert result["ok"] is True
    assert result["max_abs_diff"] <= 1e-5
    assert result["build_seconds"] >= 0 and result["artifact"] == "engine.onnx"
    assert result["tool_versions"]["onnxruntime"]
    assert document["fingerprint"]["onnxruntime"]["version"]


@pytest.mark.skipif(TensorRTBackend.available(), reason="TensorRT is installed here")
def test_it_says_tensorrt_is_missing_and_what_to_install():
    completed = selftest_command("--backend", "tensorrt")

    assert completed.returncode == 1, completed.stderr
    document = json.loads(completed.stdout)
    result = document["backends"]["tensorrt"]
    assert result["ok"] is False
    assert result["missing"] == (
        "tensorrt is not installed: pip install deployhub[tensorrt] "
        "(needs an NVIDIA GPU and driver)"
    )
    if document["fingerprint"]["nvidia_driver"] is None:
        assert "no NVIDIA driver found (NVML could not initialise)" in result["also_missing"]


def test_it_refuses_an_unknown_backend_with_exit_status_2():
    completed = selftest_command("--backend", "tflite")

    assert completed.returncode == 2
    assert completed.stdout == ""
    assert "there is no backend named 'tflite'" in completed.stderr
    assert "known: onnxruntime, tensorrt" in completed.stderr


def test_it_checks_every_known_backend_by_default_without_crashing():
    completed = selftest_command()

    document = json.loads(completed.stdout)
    assert list(document["backends"]) == list(BACKENDS)
    assert all(isinstance(entry["ok"], bool) for entry in document["backends"].values())
    every_ok = all(entry["ok"] for entry in document["backends"].values())
    assert completed.returncode == (0 if every_ok else 1), completed.stderr
    for entry in document["backends"].values():
        assert entry["ok"] or entry.get("missing") or entry.get("error")


class NotBuiltYet(Backend):
    """A backend double whose compile refuses, like one still being written."""

    name, runtime, extra = "not-built-yet", "onnxruntime", "worker"

    @classmethod
    def compat_fields(cls, fingerprint, build_config):
        return {}

    def compile(self, source, build_config, workdir, *, timing_cache=None, **kwargs):
        raise JobError("the compiler arrives with the compile-backends issue")

    def load(self, artifact, build_config):
        raise AssertionError("never loaded")

    def infer(self, handle, feeds):
        raise AssertionError("never run")


class OffByOne(NotBuiltYet):
    """A backend double that builds and runs, and gets every output wrong by 1."""

    name = "off-by-one"

    def compile(self, source, build_config, workdir, *, timing_cache=None, **kwargs):
        return CompileResult(artifact=Path(source))

    def load(self, artifact, build_config):
        return artifact

    def infer(self, handle, feeds):
        return [out + 1 for out in selftest.reference_outputs(handle, feeds)]


class NeedsAModule(NotBuiltYet):
    """A backend double whose runtime is not installed anywhere."""

    name, runtime, extra = "needs-a-module", "deployhub_no_such_runtime", "nothing"


def test_it_reports_a_backend_that_cannot_compile_yet_with_its_error():
    result = selftest.check_backend(NotBuiltYet, NO_GPU)

    assert result == {
        "ok": False,
        "build_config": {},
        "stage": "compile",
        "error": "JobError: the compiler arrives with the compile-backends issue",
    }


def test_it_fails_a_backend_whose_output_differs_from_the_reference():
    result = selftest.check_backend(OffByOne, NO_GPU)

    assert result["ok"] is False
    assert result["max_abs_diff"] == pytest.approx(1.0)
    assert result["tolerance"] == OffByOne.selftest_tolerance == 1e-4


def test_it_names_the_package_a_backend_lacks():
    result = selftest.check_backend(NeedsAModule, NO_GPU)

    assert result == {
        "ok": False,
        "missing": ("deployhub_no_such_runtime is not installed: pip install deployhub[nothing]"),
    }


def test_it_lists_what_a_gpu_less_host_lacks_for_tensorrt():
    missing = selftest.missing_requirements(TensorRTBackend, NO_GPU)

    assert missing[-2:] == [
        "no NVIDIA driver found (NVML could not initialise)",
        "torch is not installed: TensorRT's input and output buffers are torch CUDA tensors: "
        "pip install deployhub[torch] (a CUDA build)",
    ]


def test_it_measures_the_largest_difference_over_every_output():
    got = [np.zeros((2, 3)), np.array([1.0, 2.0])]
    want = [np.full((2, 3), 0.25), np.array([1.0, 2.5])]

    assert selftest.max_abs_diff(got, want) == 0.5
    with pytest.raises(ValueError, match="shape"):
        selftest.max_abs_diff([np.zeros(3)], [np.zeros(4)])
    with pytest.raises(ValueError, match="1 outputs, the reference has 2"):
        selftest.max_abs_diff([np.zeros(3)], want)
