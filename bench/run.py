#!/usr/bin/env python
"""make bench: DeployHub's speed targets, measured on this machine.

Each row prints the figure, its target and PASS or MISS; all rows also go to
bench/results.json. A miss is reported, never hidden; the exit code stays 0 so
every row is always printed (CI does not run this: the machine is shared and noisy).

`python bench/run.py [bench_job_pipeline] [bench_upload_memory]` runs some rows only.
Needs PostgreSQL and Redis on 127.0.0.1 (`make bench` checks they answer). It
uses its own database (deployhub_bench) and Redis database 14.
"""

import io
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = "deployhub_bench"
# The device worker runs in make run's environment (the Makefile says where), as users get it.
RUN_PYTHON = os.environ.get("DEPLOYHUB_RUN_PYTHON") or sys.executable
# What this script points at its own PostgreSQL and Redis; the conformance run stays embedded.
EMBEDDED_OVERRIDES = ("DATABASE_URL", "CELERY_BROKER_URL", "DEPLOYHUB_VAR_DIR")

os.environ.update(
    DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{BENCH_DB}",
    CELERY_BROKER_URL="redis://127.0.0.1:6379/14",
    DEPLOYHUB_VAR_DIR=tempfile.mkdtemp(prefix="deployhub-bench-"),
    DJANGO_SETTINGS_MODULE="deployhub.settings",
)
sys.path.insert(0, str(ROOT))

from bench.dispatch import bench_job_pipeline  # noqa: E402
from bench.figures import bench_figures  # noqa: E402
from bench.fleet import (  # noqa: E402
    bench_fleet_backlog,
    bench_fleet_dispatch,
    bench_fleet_idle,
    bench_fleet_reconnect,
)
from bench.harness import bench_harness_overhead  # noqa: E402
from bench.load import bench_load  # noqa: E402
from bench.rows import note, print_rows, row, write_results  # noqa: E402
from bench.stack import Stack, setup_fleet_for, wait_for  # noqa: E402


def recreate_database():
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {BENCH_DB}")


UPLOAD_BYTES = 1024**3


def write_big_onnx_zip(folder):
    """Write a valid ONNX model whose 1 GB initializer lives in external data, zipped as stored."""
    import zipfile

    import onnx
    from onnx import TensorProto, helper

    elements = UPLOAD_BYTES // 4
    weights = folder / "weights.bin"
    with open(weights, "wb") as out:
        block = bytes(64 * 1024 * 1024)
        for _ in range(UPLOAD_BYTES // len(block)):
            out.write(block)
    tensor = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[elements])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in {
        "location": "weights.bin",
        "offset": "0",
        "length": str(UPLOAD_BYTES),
    }.items():
        tensor.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W", "i"], ["y"])],
        "big",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializer=[tensor],
    )
    onnx.save_model(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx"
    )
    archive = folder / "big.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.write(folder / "model.onnx", "model.onnx")
        zf.write(weights, "weights.bin")
    weights.unlink()
    return archive


class MultipartFile:
    """A multipart body read from disk as it is sent: requests streams it with a Content-Length."""

    def __init__(self, path, fields, boundary="deployhub-bench-boundary"):
        head = "".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
            for k, v in fields.items()
        )
        head += (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{path.name}"\r\nContent-Type: application/zip\r\n\r\n'
        )
        self.parts = [
            io.BytesIO(head.encode()),
            open(path, "rb"),
            io.BytesIO(f"\r\n--{boundary}--\r\n".encode()),
        ]
        self.length = sum(len(p.getvalue()) for p in self.parts[::2]) + path.stat().st_size
        self.content_type = f"multipart/form-data; boundary={boundary}"

    def __len__(self):
        return self.length

    def read(self, size=-1):
        size = 1024 * 1024 if size is None or size < 0 else size
        while self.parts:
            if chunk := self.parts[0].read(size):
                return chunk
            self.parts.pop(0).close()
        return b""


class PeakRSS:
    """Sample the resident memory of some processes in a thread; keep each one's peak."""

    def __init__(self, pids):
        import threading

        import psutil

        self.processes = [psutil.Process(pid) for pid in pids]
        self.baseline = {p.pid: p.memory_info().rss for p in self.processes}
        self.peak = dict(self.baseline)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self):
        while not self.stop.wait(0.01):
            for p in self.processes:
                self.peak[p.pid] = max(self.peak[p.pid], p.memory_info().rss)

    def growth_mb(self):
        self.stop.set()
        self.thread.join()
        return max(self.peak[pid] - self.baseline[pid] for pid in self.peak) / 1024**2


def bench_upload_memory():
    """Row: peak RSS growth of the web processes while a 1 GB model is uploaded through the API."""
    import psutil
    import requests
    from django.contrib.auth import get_user_model

    from deployhub.registry.models import Model
    from deployhub.teams.models import ApiToken, Membership, Role, Team

    team = Team.objects.create(name="Upload bench", slug="upload-bench")
    user = get_user_model().objects.create_user("uploader")
    Membership.objects.create(user=user, team=team, role=Role.ENGINEER)
    record = ApiToken(user=user, name="bench")
    token = record.issue()
    record.save()
    model = Model.objects.create(team=team, name="big-model", created_by=user)
    _, _, device_class, device, device_token = setup_fleet_for(team)
    stack = Stack(device_token, device)
    work = Path(tempfile.mkdtemp(prefix="deployhub-upload-"))
    try:
        archive = write_big_onnx_zip(work)
        body = MultipartFile(archive, {"notes": "1 GB bench"})
        web = [c.pid for c in psutil.Process(stack.processes[0].pid).children()]
        for _ in range(8):  # load the views (and what they import) in every web process first
            requests.get(f"{stack.url}/api/v1/models", headers={"Authorization": f"Bearer {token}"})
        meter = PeakRSS(web)
        started = time.monotonic()
        response = requests.post(
            f"{stack.url}/api/v1/models/{model.pk}/versions",
            data=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": body.content_type},
            timeout=1800,
        )
        seconds = time.monotonic() - started
        growth = meter.growth_mb()
    finally:
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)
    if response.status_code != 201:
        raise SystemExit(
            f"bench: the 1 GB upload was refused: {response.status_code} {response.text}"
        )
    return [
        row(
            f"web RSS growth during a 1 GB upload ({seconds:.0f} s, stored and validated)",
            growth,
            "MB",
            64,
        ),
    ]


def bench_compile_reuse():
    """Row: a repeated compile answered from the engine store vs the build it replaces."""
    from django.core.files import File

    from deployhub.engines.actions import request_compile
    from deployhub.jobs.models import Job
    from deployhub.registry.models import Model
    from deployhub.registry.uploads import create_version
    from deployhub.teams.models import Team

    team, user, device_class, device, token = setup_fleet_for(
        Team.objects.create(name="Compile bench", slug="compile-bench")
    )
    model = Model.objects.create(team=team, name="digits", created_by=user)
    with open(ROOT / "deployhub" / "demo" / "assets" / "digits_cnn_v2.onnx", "rb") as handle:
        version = create_version(model, File(handle, name="digits_cnn_v2.onnx"), user)
    config = {"optimization_level": "all", "provider": "CPUExecutionProvider"}
    stack = Stack(token, device)
    try:
        started = time.perf_counter()
        _, job = request_compile(version, device_class, "onnxruntime", config, user)
        while not (job := Job.objects.get(pk=job.pk)).is_final:
            time.sleep(0.005)
        build = time.perf_counter() - started
        if job.state != "succeeded":
            raise SystemExit(f"bench: the compile failed: {job.error}\n{job.log}")
        reuses = []
        for _ in range(20):
            started = time.perf_counter()
            engine, no_job = request_compile(version, device_class, "onnxruntime", config, user)
            reuses.append(time.perf_counter() - started)
            assert engine is not None and no_job is None
    finally:
        stack.stop()
    reuse = statistics.median(reuses)
    return [
        row("compile answered from the store (median of 20)", reuse * 1000, "ms", 50),
        row(
            f"store vs build it replaces ({build * 1000:.0f} ms)",
            build / reuse,
            "×",
            10,
            lower_is_better=False,
        ),
    ]


DEMO_ASSETS = ROOT / "deployhub" / "demo" / "assets"
AUTO_DEADLINE_S = 480
# Side by side: each runner warms up, then runs in turn, round after round, for about
# TIMING_SECONDS in all, so that drift on a shared machine touches all of them alike.
TIMING_SECONDS, TIMING_ROUNDS, WARMUP_SECONDS = 3.0, 15, 0.5
BATCH_SIZES = (1, 8)
AGREEMENT_TARGET = 0.99  # top-1 agreement of the recommended build with the FP32 source
# The best build a person picks by hand for ResNet-18 on a CPU: OpenVINO INT8 through NNCF,
# LATENCY hint. Auto mode's pick is held to it, measured side by side in the same process.
HAND_PICKED = {
    "name": "hand-picked openvino int8",
    "backend": "openvino",
    "config": {"device": "CPU", "precision": "int8", "performance_hint": "LATENCY"},
}
HAND_PICKED_MARGIN = 1.10
# From pressing auto mode on the ResNet-18 sample to its recommendation, on 2 cores.
AUTO_TIME_TARGET_S = 120


@dataclass
class AutoSubject:
    """A model auto mode builds for, with its datasets and the same network in eager torch."""

    name: str
    onnx: Path
    datasets: dict  # {kind: .npz path}
    eager: object  # a torch module in eval mode, the ONNX file's weights
    notes: str = ""
    hand_picked: dict | None = None  # {backend, build config}: this machine's best by hand


def load_script(name):
    """Import a script of scripts/ as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_onnx_weights(module, onnx_path):
    """Load an ONNX file's initializers into a torch module of the same names; return it."""
    import onnx
    import torch
    from onnx import numpy_helper

    weights = {
        tensor.name: torch.from_numpy(numpy_helper.to_array(tensor).copy())
        for tensor in onnx.load(str(onnx_path)).graph.initializer
    }
    missing, unexpected = module.load_state_dict(weights, strict=False)
    if unexpected or any(not name.endswith("num_batches_tracked") for name in missing):
        raise SystemExit(f"bench: {onnx_path.name} does not match its torch module: {missing}")
    return module.eval()


def demo_subject():
    """The demo model (digits CNN v2), rebuilt in torch from the weights in its ONNX file."""
    assets = load_script("make_demo_assets")
    onnx_path = DEMO_ASSETS / "digits_cnn_v2.onnx"
    eager = with_onnx_weights(assets.DigitsCNN(assets.VERSIONS[2]["widths"]), onnx_path)
    datasets = {kind: DEMO_ASSETS / f"{kind}.npz" for kind in ("calibration", "validation")}
    return AutoSubject("demo", onnx_path, datasets, eager)


def resnet18_subject(work):
    """ResNet-18 with random weights, written by scripts/make_resnet18.py into work."""
    script = load_script("make_resnet18")
    onnx_path, npz_path, eager = script.write_resnet18(work / "resnet18")
    notes = "random weights: for latency only"
    datasets = {"calibration": npz_path, "validation": npz_path}
    return AutoSubject("resnet18", onnx_path, datasets, eager, notes, HAND_PICKED)


def upload_subject(subject, team, user):
    """Store the subject as a model version with its datasets; return the version."""
    from django.core.files import File

    from deployhub.registry.models import Model
    from deployhub.registry.uploads import create_dataset, create_version

    model = Model.objects.create(team=team, name=subject.name, created_by=user)
    with open(subject.onnx, "rb") as handle:
        version = create_version(
            model, File(handle, name=subject.onnx.name), user, notes=subject.notes
        )
    for kind, path in subject.datasets.items():
        with open(path, "rb") as handle:
            create_dataset(version, File(handle, name=path.name), user, kind=kind, name=kind)
    return version


def finish_auto_run(version, device_class, user):
    """Start auto mode on a version and wait until it has ranked its builds."""
    from deployhub.engines import auto
    from deployhub.engines.models import AutoRun

    started = time.monotonic()
    run = auto.start(version, device_class, user)
    wait_for(
        lambda: AutoRun.objects.get(pk=run.pk).state == "done",
        AUTO_DEADLINE_S,
        f"auto mode on {version}",
    )
    run = AutoRun.objects.get(pk=run.pk)
    if run.recommended is None:
        errors = "; ".join(f"{b}: {b.error or b.skipped}" for b in run.builds.all())
        raise SystemExit(f"bench: auto mode on {version} recommended nothing: {errors}")
    run.elapsed_s = (run.finished_at - run.created_at).total_seconds()
    run.waited_s = time.monotonic() - started
    return run


def load_build(build, work):
    """Load an auto build's engine from storage with its backend; return run(feeds)."""
    from django.core.files.storage import default_storage

    from workers.backends.known import BACKENDS

    engine = build.engine
    artifact = work / f"engine-{engine.pk}{Path(engine.file.name).suffix}"
    shutil.copyfile(default_storage.path(engine.file.name), artifact)  # backends unpack beside it
    backend = BACKENDS[build.backend]()
    handle = backend.load(artifact, engine.build_config)
    return lambda feeds: backend.infer(handle, feeds)


def load_hand_picked(subject, work):
    """Build the subject's hand-picked engine here, as a person would; return run(feeds)."""
    from workers.backends.known import BACKENDS

    picked = subject.hand_picked
    backend = BACKENDS[picked["backend"]]()
    folder = work / "hand-picked"
    folder.mkdir(exist_ok=True)
    built = backend.compile(
        subject.onnx, picked["config"], folder, calibration=subject.datasets["calibration"]
    )
    handle = backend.load(built.artifact, picked["config"])
    return lambda feeds: backend.infer(handle, feeds)


def time_side_by_side(runners):
    """Time the runners in turn, round after round, as auto mode's compare job does
    (workers/measure/side_by_side.py); return each one's best round median in ms.

    The best round, not all of them: when another process takes one of the cores,
    eager torch's OpenMP threads wait on each other and its runs take 10 to 40 times
    longer (ONNX Runtime's 3 times), so a burst of load elsewhere, not the runtimes,
    would decide the ratios. A round's median still ignores a single slow run.
    """
    from workers.measure import side_by_side

    settings = side_by_side.Settings(
        rounds=TIMING_ROUNDS, duration_s=TIMING_SECONDS, warmup_s=WARMUP_SECONDS
    )
    _, medians = side_by_side.time_in_rounds(runners, settings)
    return {name: min(values) for name, values in medians.items()}


def measured_builds(run):
    """Return the builds of an auto run that were benchmarked, by name ("openvino int8")."""
    return {
        f"{b.backend} {b.precision}": b for b in run.builds.all() if not b.error and b.benchmark
    }


def measure_side_by_side(subject, run, work):
    """Time PyTorch eager, ONNX Runtime FP32 and every build at each batch size, in this process.

    Every runtime gets the machine's cores. Also return the load average after each
    batch size, and the FP32 top-1 classes of the evaluation inputs, after checking
    that eager torch computes the ONNX file's logits.
    """
    import numpy as np
    import onnxruntime as ort
    import torch

    cores = os.cpu_count()
    torch.set_num_threads(cores)
    options = ort.SessionOptions()
    options.intra_op_num_threads = cores
    session = ort.InferenceSession(str(subject.onnx), options, providers=["CPUExecutionProvider"])
    builds = {name: load_build(build, work) for name, build in measured_builds(run).items()}
    if subject.hand_picked:
        builds[subject.hand_picked["name"]] = load_hand_picked(subject, work)
    with np.load(subject.datasets.get("validation", subject.datasets["calibration"])) as data:
        inputs = data["inputs"]
    timings, loads = {}, {}
    with torch.inference_mode():
        reference = session.run(None, {"image": inputs})[0]
        eager = subject.eager(torch.from_numpy(inputs)).numpy()
        if not np.allclose(eager, reference, atol=1e-3, rtol=1e-3):
            raise SystemExit(f"bench: eager torch and ONNX Runtime disagree on {subject.name}")
        for batch in BATCH_SIZES:
            tensor, feeds = torch.from_numpy(inputs[:batch]), {"image": inputs[:batch]}
            runners = {
                "eager": partial(subject.eager, tensor),
                "ort": partial(session.run, None, feeds),
                **{name: partial(run_build, feeds) for name, run_build in builds.items()},
            }
            timings[batch] = time_side_by_side(runners)
            loads[batch] = os.getloadavg()[0]  # eager torch slows most on a busy machine
    return timings, loads, reference.argmax(axis=1)


def print_builds(subject, run):
    """Print what every build of an auto run measured, or why it did not run (to stderr)."""
    for build in run.builds.all():
        if build.benchmark and build.accuracy:
            what = (
                f"p50 {build.benchmark.latency_p50_ms:.3g} ms, top-1 agreement "
                f"{build.accuracy.top1_agreement:.3f}, within tolerance {build.within_tolerance}"
            )
            if build.side_by_side_ms is not None:
                what += f", side by side {build.side_by_side_ms:.3g} ms per image"
        else:
            what = (build.error or build.skipped).splitlines()[0][:120]
        print(f"bench: auto mode on {subject.name}, {build}: {what}", file=sys.stderr)
    print(f"bench: auto mode on {subject.name}: {run.summary}", file=sys.stderr)


def speedup_rows(subject, label, key, timings, loads, targets):
    """Rows: eager torch's latency over a runner's, at each batch size, with the load average."""
    return [
        row(
            f"{subject.name}: {label} vs PyTorch eager, batch {batch} "
            f"({timings[batch][key]:.3g} vs {timings[batch]['eager']:.3g} ms, "
            f"load {loads[batch]:.1f})",
            timings[batch]["eager"] / timings[batch][key],
            "×",
            target,
            lower_is_better=False,
        )
        for batch, target in zip(BATCH_SIZES, targets, strict=True)
    ]


def agreement_row(subject, name, accuracy, classes):
    """Row: the recommended build's top-1 agreement with the FP32 source, from auto mode."""
    if accuracy.top1 is not None:
        detail = f"top-1 {accuracy.reference_top1:.3f} → {accuracy.top1:.3f}"
    else:
        detail = f"no labels; FP32 top-1 spans {len(set(classes.tolist()))} classes"
    return row(
        f"{subject.name}: recommended ({name}) top-1 agreement with FP32 "
        f"({accuracy.samples} samples; {detail})",
        accuracy.top1_agreement,
        "",
        AGREEMENT_TARGET,
        lower_is_better=False,
    )


def fastest_rows(subject, run, name, timings):
    """Rows: the recommended build against the fastest build, as auto mode and as we measured.

    Auto mode's own figures are those of its side-by-side run where it had one (the
    builds that came close), else the builds' separate runs.
    """
    builds = measured_builds(run)
    figures = {
        key: build.side_by_side_ms
        for key, build in builds.items()
        if build.side_by_side_ms is not None
    }
    where = "auto mode's side-by-side run" if figures else "the run"
    figures = figures or {key: build.benchmark.latency_p50_ms for key, build in builds.items()}
    fastest = min(figures, key=figures.get)
    here = {key: timings[1][key] for key in builds}
    fastest_here = min(here, key=here.get)
    outside = {
        key: "" if b.within_tolerance else ", outside tolerance" for key, b in builds.items()
    }
    return [
        row(
            f"{subject.name}: recommended ({name}) vs fastest build in {where} "
            f"({fastest}, {figures[fastest]:.3g} ms{outside[fastest]})",
            figures[name] / figures[fastest],
            "×",
            1.10,
        ),
        row(
            f"{subject.name}: recommended ({name}) vs fastest build, side by side, batch 1 "
            f"({fastest_here}, {here[fastest_here]:.3g} ms{outside[fastest_here]})",
            here[name] / here[fastest_here],
            "×",
            1.10,
        ),
    ]


def eager_targets(subject, timings):
    """Return the recommended build's speed-up targets over eager torch, per batch size.

    A fixed speed-up depends on the CPU (docs/design.md, Decisions in force): at batch 1
    the target is the hand-picked build's own speed-up, within HAND_PICKED_MARGIN, where
    there is one.
    """
    if not subject.hand_picked:
        return (1, 1)
    one = timings[1]
    return (round(one["eager"] / one[subject.hand_picked["name"]] / HAND_PICKED_MARGIN, 2), 1)


def hand_picked_rows(subject, name, timings, loads):
    """Rows: the recommended build against the hand-picked one, side by side at batch 1."""
    if not subject.hand_picked:
        return []
    picked, one = subject.hand_picked["name"], timings[1]
    return [
        *speedup_rows(subject, picked, picked, timings, loads, (1, 1)),
        row(
            f"{subject.name}: recommended ({name}) vs {picked} (NNCF, LATENCY hint), "
            f"side by side, batch 1 ({one[name]:.3g} vs {one[picked]:.3g} ms)",
            one[name] / one[picked],
            "×",
            HAND_PICKED_MARGIN,
        ),
    ]


def auto_time_row(subject, run):
    """Row: from pressing auto mode to its recommendation, on the make run install."""
    return row(
        f"{subject.name}: pressing auto mode → recommendation "
        f"({run.builds.count()} builds, worker in make run's environment)",
        run.elapsed_s,
        "s",
        AUTO_TIME_TARGET_S,
    )


def auto_mode_rows(subject, run, timings, loads, classes):
    """Rows of one model: speed-ups over eager torch, agreement, and auto mode's choice."""
    best = run.recommended
    name = f"{best.backend} {best.precision}"
    targets = eager_targets(subject, timings)
    return [
        *speedup_rows(subject, f"recommended ({name})", name, timings, loads, targets),
        *speedup_rows(subject, "ONNX Runtime FP32", "ort", timings, loads, (1, 1)),
        *hand_picked_rows(subject, name, timings, loads),
        agreement_row(subject, name, best.accuracy, classes),
        *fastest_rows(subject, run, name, timings),
        *([auto_time_row(subject, run)] if subject.hand_picked else []),
    ]


def bench_auto_mode():
    """Rows: auto mode's recommended build vs PyTorch eager and ONNX Runtime FP32, per model."""
    from deployhub.devices.models import Device
    from deployhub.teams.models import Team

    team, user, device_class, device, token = setup_fleet_for(
        Team.objects.create(name="Auto bench", slug="auto-bench")
    )
    work = Path(tempfile.mkdtemp(prefix="deployhub-auto-"))
    try:
        subjects = [demo_subject(), resnet18_subject(work)]
        versions = [upload_subject(subject, team, user) for subject in subjects]
        stack = Stack(token, device)
        try:
            wait_for(lambda: Device.objects.get(pk=device.pk).fingerprint, 60, "a fingerprint")
            runs = [finish_auto_run(version, device_class, user) for version in versions]
        finally:
            stack.stop()
        rows = []
        for subject, run in zip(subjects, runs, strict=True):
            print_builds(subject, run)
            timings, loads, classes = measure_side_by_side(subject, run, work)
            rows += auto_mode_rows(subject, run, timings, loads, classes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


# A detector with a trained-like output distribution (tests/conformance_models.py): the
# corpus's YOLOv8-style head at 128 x 128, strides 8 and 16 (320 anchors), random weights
# but class scores that leave a few boxes an image above 0.25, in input pixels.
DETECTOR_SIZE, DETECTOR_LEVELS = 128, ((8, 32), (16, 64))


def detector_subject(work):
    """The detector written into work, with datasets whose labels are its own detections."""
    from dataclasses import replace

    from tests.conformance_models import (
        BY_NAME,
        DetectorShape,
        Input,
        datasets,
        write_yolov8_anchors_last,
    )

    shape = DetectorShape(DETECTOR_SIZE, DETECTOR_LEVELS)
    model = replace(
        BY_NAME["yolov8_anchors_last"],
        name="detector",
        write=partial(write_yolov8_anchors_last, shape=shape, name="detector"),
        inputs=(Input("images", "float32", (3, DETECTOR_SIZE, DETECTOR_SIZE)),),
    )
    onnx_path = model.write(work)
    paths = {}
    for kind, data in zip(("calibration", "validation"), datasets(model, onnx_path), strict=True):
        paths[kind] = work / f"detector-{kind}.npz"
        paths[kind].write_bytes(data)
    notes = "random weights, trained-like scores: a few boxes an image"
    return AutoSubject("detector", onnx_path, paths, eager=None, notes=notes)


def print_task_builds(subject, run):
    """Print each build's figures in its task's terms, or why it did not run (to stderr)."""
    for build in run.builds.all():
        accuracy = build.accuracy
        if build.benchmark and accuracy:
            what = (
                f"p50 {build.benchmark.latency_p50_ms:.3g} ms, {accuracy.headline} "
                f"{accuracy.headline_value:.4f}, "
                f"{accuracy.tolerance_breach(run.device_class) or 'within tolerance'}"
            )
        else:
            what = (build.error or build.skipped).splitlines()[0][:120]
        print(f"bench: auto mode on {subject.name}, {build}: {what}", file=sys.stderr)
    print(f"bench: auto mode on {subject.name}: {run.summary}", file=sys.stderr)


def time_builds_side_by_side(subject, run, work):
    """Time every measured build of the run in turn at batch 1, in this process; return ms."""
    import numpy as np

    builds = {name: load_build(build, work) for name, build in measured_builds(run).items()}
    with np.load(subject.datasets["validation"]) as data:
        feeds = {"images": data["inputs"][:1]}
    return time_side_by_side({name: partial(infer, feeds) for name, infer in builds.items()})


def fastest_within_tolerance_row(subject, run, here):
    """Row: the recommended build against the fastest build within the task's tolerance."""
    builds = measured_builds(run)
    best = run.recommended
    name = f"{best.backend} {best.precision}"
    within = {key: ms for key, ms in here.items() if builds[key].within_tolerance}
    fastest = min(within, key=within.get)
    accuracy = best.accuracy
    return row(
        f"{subject.name}: recommended ({name}, {accuracy.headline} "
        f"{accuracy.headline_value:.3f}) vs fastest build within the "
        f"{accuracy.task.replace('_', ' ')} tolerance ({len(within)} of {len(builds)}), "
        f"side by side, batch 1 ({fastest}, {here[name]:.3g} vs {within[fastest]:.3g} ms)",
        here[name] / within[fastest],
        "×",
        HAND_PICKED_MARGIN,
    )


def bench_detector():
    """Row: auto mode on a detector, its pick vs the fastest build within the detection
    tolerance (mAP against its own detections), timed side by side here."""
    from deployhub.devices.models import Device
    from deployhub.teams.models import Team

    team, user, device_class, device, token = setup_fleet_for(
        Team.objects.create(name="Detector bench", slug="detector-bench")
    )
    work = Path(tempfile.mkdtemp(prefix="deployhub-detector-"))
    try:
        subject = detector_subject(work)
        version = upload_subject(subject, team, user)
        if version.task.get("task") != "detection":
            raise SystemExit(f"bench: the detector was proposed as {version.task}")
        stack = Stack(token, device)
        try:
            wait_for(lambda: Device.objects.get(pk=device.pk).fingerprint, 60, "a fingerprint")
            run = finish_auto_run(version, device_class, user)
        finally:
            stack.stop()
        print_task_builds(subject, run)
        here = time_builds_side_by_side(subject, run, work)
        return [fastest_within_tolerance_row(subject, run, here)]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_conformance():
    """Row: the conformance corpus through auto mode (scripts/conformance.py), as a share.

    It runs the embedded product in a process of its own (SQLite, filesystem broker),
    with its workers in make run's environment; its table goes to stderr as it is.
    """
    done = subprocess.run(
        [sys.executable, "scripts/conformance.py", "--worker-python", RUN_PYTHON],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in EMBEDDED_OVERRIDES},
    )
    print(done.stdout + done.stderr[-3000:], file=sys.stderr)
    match = re.search(r"^conformance: (\d+)/(\d+) models", done.stdout, re.MULTILINE)
    if match is None:
        why = "scripts/conformance.py printed no count"
        return [note("conformance corpus", None, "%", "MISS", why)]
    passed, total = int(match[1]), int(match[2])
    return [
        row(
            f"conformance corpus: models with a recommended build or a named preflight "
            f"refusal ({passed}/{total})",
            100 * passed / total,
            "%",
            100,
            lower_is_better=False,
        )
    ]


def bench_load_embedded():
    """Rows: the load of bench_load on make run's embedded stack (SQLite, filesystem broker)."""
    from bench import load

    return load.bench_load_embedded(
        {k: v for k, v in os.environ.items() if k not in EMBEDDED_OVERRIDES}
    )


BENCHES = [
    bench_job_pipeline,
    bench_load,
    bench_load_embedded,
    bench_fleet_idle,
    bench_fleet_dispatch,
    bench_fleet_backlog,
    bench_fleet_reconnect,
    bench_upload_memory,
    bench_compile_reuse,
    bench_auto_mode,
    bench_detector,
    bench_harness_overhead,
    bench_conformance,
    bench_figures,
]


def main():
    recreate_database()
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    chosen = [b for b in BENCHES if not sys.argv[1:] or b.__name__ in sys.argv[1:]]
    try:
        rows = [{**r, "bench": bench.__name__} for bench in chosen for r in bench()]
    finally:
        shutil.rmtree(os.environ["DEPLOYHUB_VAR_DIR"], ignore_errors=True)  # storage, models
    print_rows(rows)
    write_results(rows)


if __name__ == "__main__":
    main()
