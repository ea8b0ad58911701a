"""`make run`'s install is the product: a CPU device makes every CPU build auto mode tries.

`make test` builds make run's environment (`.venv`) with make run's own recipe and runs
the suite from another one (`.venv-test`: torch, pytest, Playwright), which would hide a
dependency the product lacks (torch brings sympy). So these tests run make run's Python:
the one DEPLOYHUB_RUN_PYTHON names (`make test` sets it), else `.venv`'s.
"""

import json
import os
import re
import subprocess
import tomllib

import numpy as np
import onnx
import pytest
from django.core.files import File
from onnx import TensorProto, helper, numpy_helper

from deployhub.engines.actions import request_compile
from deployhub.engines.models import Engine
from deployhub.engines.preflight import preflight
from deployhub.jobs.models import Job
from deployhub.registry.models import Model
from deployhub.registry.uploads import create_dataset, create_version
from tests.conftest import ROOT, run_python, wait_until
from workers.backends.known import BACKENDS

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Runtimes that belong on GPU machines only: make run's install must not carry them.
GPU_RUNTIMES = ("torch", "tensorrt")
# The backends auto mode builds with on a CPU device; make run's worker must make all their builds.
CPU_BACKENDS = ("onnxruntime", "openvino")


def make_commands(target):
    """Return what `make -n -B target` would run, one command per line."""
    # Not the flags of the `make test` this may run under (-s would hide the commands).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "-n", "-B", target], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_make_test_builds_make_runs_environment_with_make_runs_recipe():
    install_run = [line for line in make_commands("run") if "venv.sh" in line]

    assert len(install_run) == 1
    assert install_run[0] in make_commands("test")


def test_make_run_installs_every_cpu_backend_and_no_gpu_runtime():
    extras = re.search(r"^EXTRAS_run := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    chosen = extras.group(1).split(",")
    requirements = [
        r for extra in chosen for r in PYPROJECT["project"]["optional-dependencies"][extra]
    ]
    names = {re.split(r"[=<>\[ ]", requirement)[0] for requirement in requirements}

    for name in CPU_BACKENDS:
        assert BACKENDS[name].extra in chosen, name
    assert not names & set(GPU_RUNTIMES)
    assert "sympy" in names and "nncf" in names


def test_the_docker_image_installs_what_make_run_installs():
    makefile = re.search(r"^EXTRAS_run := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    dockerfile = re.search(r"^ARG EXTRAS=(.+)$", (ROOT / "Dockerfile").read_text(), re.M)

    assert dockerfile.group(1) == makefile.group(1)


def test_make_runs_worker_reports_every_cpu_build_possible():
    done = subprocess.run(
        [str(run_python()), "-m", "workers", "fingerprint"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr

    fingerprint = json.loads(done.stdout)

    for name in CPU_BACKENDS:
        assert fingerprint[BACKENDS[name].runtime], f"{name} is not installed by make run"
        for precision, capability in fingerprint["capabilities"][name].items():
            assert capability["ok"], f"{name} {precision}: {capability.get('reason')}"


def write_conv_model(path):
    """Write a small conv net (Conv, BatchNormalization, Relu, pooling, Gemm) to path."""
    rng = np.random.default_rng(0)
    weights = {
        "conv_w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
        "conv_b": rng.standard_normal(8).astype(np.float32) * 0.1,
        "bn_scale": rng.uniform(0.5, 1.5, 8).astype(np.float32),
        "bn_bias": rng.standard_normal(8).astype(np.float32) * 0.1,
        "bn_mean": rng.standard_normal(8).astype(np.float32) * 0.1,
        "bn_var": rng.uniform(0.5, 1.5, 8).astype(np.float32),
        "fc_w": rng.standard_normal((4, 8)).astype(np.float32),
        "fc_b": np.zeros(4, np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["n"]
        ),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "small-conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def small_conv_version(tmp_path, team, user):
    """Upload the small conv net with 32 calibration samples."""
    model = Model.objects.create(team=team, name="small-conv", created_by=user)
    with open(write_conv_model(tmp_path / "small_conv.onnx"), "rb") as handle:
        version = create_version(model, File(handle, name="small_conv.onnx"), user)
    samples = np.random.default_rng(1).standard_normal((32, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "calibration.npz", inputs=samples)
    with open(tmp_path / "calibration.npz", "rb") as handle:
        create_dataset(
            version, File(handle, name="calibration.npz"), user, kind="calibration", name="cal"
        )
    return version


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_make_runs_worker_builds_int8_with_every_cpu_quantiser(
    tmp_path, demo_team, alice, device_class, make_device, start_worker
):
    version = small_conv_version(tmp_path, demo_team, alice)
    device, token = make_device()
    worker = start_worker(device, token, python=run_python())
    device.refresh_from_db()

    for verdict in preflight(version, device_class, list(CPU_BACKENDS), "int8"):
        assert verdict.fails == [], (verdict.backend, device.fingerprint.get("capabilities"))
    jobs = {}
    for name in CPU_BACKENDS:
        config = BACKENDS[name].auto_builds["int8"]
        _, jobs[name] = request_compile(version, device_class, name, config, alice)

    for name, job in jobs.items():
        job = wait_until(
            lambda job=job: (j := Job.objects.get(pk=job.pk)).is_final and j,
            400,
            f"the {name} int8 build",
            interval=0.5,
            on_timeout=worker.output,
        )
        assert job.state == "succeeded", f"{name}: {job.error}\n{job.log}"
        engine = Engine.objects.get(backend=name, model_version=version)
        assert engine.graph_report["quantized_nodes"] > 0, name


# Labelled metrics measured the field's way, by the libraries make run's worker installs.
LABELLED_METRICS = """
import numpy as np
from workers.tasks import TASKS
detection = TASKS["detection"]
boxes = np.array([[2.0, 2.0, 12.0, 12.0]])
found = [{"boxes": boxes, "scores": np.array([0.9]), "classes": np.array([1]),
          "extras": np.zeros((1, 0))}]
labels = {"label_boxes": boxes, "label_classes": np.array([1]), "label_sample": np.array([0])}
print("map", detection.score(found, labels, {})["map"])
text = TASKS["text_recognition"]
params = {"charset": "-abc", "blank": 0}
read = [{"tokens": [1, 2], "text": "ab"}]
print("cer", text.score(read, {"label_texts": np.array(["abc"])}, params)["cer"])
"""


def test_make_runs_worker_scores_detections_and_strings_with_their_libraries():
    done = subprocess.run(
        [str(run_python()), "-c", LABELLED_METRICS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    figures = dict(line.split() for line in done.stdout.splitlines())
    assert float(figures["map"]) == pytest.approx(1.0)  # pycocotools: a perfect box
    assert float(figures["cer"]) == pytest.approx(1 / 3)  # rapidfuzz: one character missing
