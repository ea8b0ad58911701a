"""The conformance corpus end to end: every model uploaded, preflighted and taken through auto mode.

One module-scoped run drives all the models at once against a live hub and two
real workers on one CPU class (all auto runs started before any is waited on,
with short benchmarks), then each model's test checks the outcome the corpus
names for it. A failure names the model, every failed build, its job and error.
"""

import os
import time
import uuid

import onnx
import pytest
from django.core.management import call_command
from django.test.utils import override_settings

from deployhub.devices.models import Device, DeviceClass
from deployhub.engines import auto
from deployhub.teams.models import Role, Team
from tests.conformance_models import (
    BY_NAME,
    CORPUS,
    RECOMMENDED,
    onnx_file,
    torch_missing,
)
from tests.conformance_run import (
    QUICK_BENCHMARKS,
    conclude,
    reached,
    start_model,
    summarise,
    wait_for,
)
from tests.conftest import WorkerProcess, make_user, wait_until
from workers.tasks import TASKS

WORKERS = 2
CORPUS_TIMEOUT_S = 1200
# Models that fail today, each with the fix it waits for (none now).
WAITING = {}
# A comma-separated subset of the corpus to run while working on one model (default: all).
ONLY = [n for n in os.environ.get("CONFORMANCE_ONLY", "").split(",") if n]


def _start_workers(live_server, device_class, folder):
    """Start the workers side by side (each takes seconds to load its backends); wait until
    each has heartbeaten and its consumer is ready."""
    started = []
    for index in range(WORKERS):
        device = Device(device_class=device_class, name=f"corpus-{index}")
        token = device.issue_token()
        device.save()
        started.append(
            (device, WorkerProcess(live_server.url, token, folder / f"worker-{index}.log"))
        )
    workers = [worker for _, worker in started]
    try:
        for device, worker in started:
            wait_until(
                lambda device=device: Device.objects.get(pk=device.pk).last_heartbeat_at,
                timeout=60,
                what=f"worker {device.name} to heartbeat",
                on_timeout=worker.output,
            )
        for worker in workers:
            wait_until(
                lambda w=worker: "ready" in w.output(), 60, "a worker's consumer to be ready"
            )
    except BaseException:
        for worker in workers:  # both run in sessions of their own: pytest would not stop them
            worker.stop()
        raise
    return workers


def _conversion(row):
    """What auto mode converted before building, as plain data: whether it converted the
    upload, and the version it built (its parent, opset, export report and number)."""
    run, child = row.run, row.run.model_version
    return {
        "from_upload": run.converted_from_id == row.version.pk,
        "parent_is_upload": child.parent_id == row.version.pk,
        "opset": child.opset,
        "max_abs_diff": (child.export_report or {}).get("max_abs_diff"),
        "number": child.number,
    }


def _worker_tails(workers):
    return "\n".join(f"--- {w.log_path}\n{w.output()[-3000:]}" for w in workers)


def _drive(live_server, folder):
    team = Team.objects.create(name="Conformance", slug="conformance")
    user = make_user("alice", team, Role.ADMIN)
    device_class = DeviceClass.objects.create(
        team=team, slug=f"cpu-{uuid.uuid4().hex[:8]}", name="Corpus CPU", frame_budget_ms=33.3
    )
    workers = _start_workers(live_server, device_class, folder)
    try:
        started = time.monotonic()
        models = [m for m in CORPUS if not ONLY or m.name in ONLY]
        rows = [start_model(m, folder / "models", team, user, device_class) for m in models]
        wait_for(rows, CORPUS_TIMEOUT_S, on_timeout=lambda: _worker_tails(workers))
        elapsed = time.monotonic() - started
        results = {row.model.name: summarise(conclude(row)) for row in rows}
        for row in rows:
            if row.run is not None and row.run.converted_from_id is not None:
                results[row.model.name]["conversion"] = _conversion(row)
    finally:
        for worker in workers:
            worker.stop()
    return results, f"conformance corpus: {len(rows)} models in {elapsed:.0f} s"


@pytest.fixture(scope="module")
def corpus(django_db_setup, django_db_blocker, live_server, tmp_path_factory, pytestconfig):
    """Run the whole corpus once; yield {model name: summarised result}."""
    folder = tmp_path_factory.mktemp("conformance")
    (folder / "models").mkdir()
    storage = folder / "storage"
    (storage / "tmp").mkdir(parents=True)
    places = {
        "STORAGE_ROOT": storage,
        "MEDIA_ROOT": storage,
        "FILE_UPLOAD_TEMP_DIR": storage / "tmp",
    }
    with (
        django_db_blocker.unblock(),
        override_settings(**places),
        pytest.MonkeyPatch.context() as patch,
    ):
        for name, value in QUICK_BENCHMARKS.items():
            patch.setattr(auto, name, value)
        try:
            results, timing = _drive(live_server, folder)
            reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
            reporter.write_line(f"\n{timing}")  # shown in make test's output
            yield results
        finally:
            call_command("flush", interactive=False, verbosity=0)  # as transactional tests do


def explain(result):
    lines = [
        f"{result['name']} ({result['task']}): expected {result['expect']!r}, "
        f"got {result['outcome']!r}"
    ]
    if result["headline"]:
        lines.append(
            f"recommended {result['build']}: {result['headline']} {result['headline_value']}, "
            f"drop {result['drop']} points, breach {result['breach']!r}"
        )
    if result["summary"]:
        lines.append(f"auto run #{result['run']}: {result['summary']}")
    lines += [f"  failed build {failure}" for failure in result["failures"]]
    return "\n".join(lines)


def _param(model):
    waiting = WAITING.get(model.name)
    marks = [pytest.mark.xfail(strict=True, reason=waiting)] if waiting else []
    return pytest.param(model.name, marks=marks, id=model.name)


@pytest.mark.e2e
@pytest.mark.parametrize("name", [_param(model) for model in CORPUS])
def test_it_reaches_the_outcome_the_corpus_names(corpus, name):
    if name not in corpus:
        pytest.skip("left out by CONFORMANCE_ONLY")
    result = corpus[name]
    if result["skipped"]:
        pytest.skip(result["skipped"])
    assert reached(result), explain(result)
    assert result["task"] == BY_NAME[name].task, explain(result)
    if result["expect"] == RECOMMENDED:
        assert result["breach"] == "", explain(result)  # within the class's tolerance
        if TASKS[result["task"]].labelled:  # judged on its labels (top-1, mAP, mIoU, CER)
            assert result["drop"] is not None, explain(result)
        if "nothing-to-quantise" in BY_NAME[name].features:  # never shown as an INT8 speed-up
            assert not result["build"].endswith("int8"), explain(result)
    assert not result["failures"], explain(result)  # every build preflight allowed, built


@pytest.mark.e2e
def test_auto_mode_converts_the_opset_6_model_first_and_recommends_a_build_of_it(corpus):
    """The corpus run's opset-6 model: converted to opset 17 first, a build of the
    conversion recommended."""
    name = "old_opset6_batchnorm_add"
    if name not in corpus:
        pytest.skip("left out by CONFORMANCE_ONLY")
    result = corpus[name]
    converted = result.get("conversion")
    assert converted, explain(result)
    assert converted["from_upload"] and converted["parent_is_upload"], converted
    assert converted["opset"] == 17 and converted["max_abs_diff"] is not None, converted
    assert converted["max_abs_diff"] < 1e-4, converted
    assert result["summary"].startswith("Converted from opset 6 to 17 first (largest difference ")
    assert f"; builds are of v{converted['number']}. Recommended: " in result["summary"]
    assert result["outcome"] == RECOMMENDED, explain(result)
    assert result["drop"] is not None and result["breach"] == "", explain(result)
    assert not result["failures"], explain(result)


REQUIRED_FEATURES = {
    "initializers-as-inputs",
    "constant-weights",
    "multi-input",
    "multi-output",
    "int64-input",
    "bool-input",
    "uint8-input",
    "float16-input",
    "fixed-batch-2",
    "no-batch-axis",
    "dynamic-hw",
    "external-data",
    "old-opset",
    "nothing-to-quantise",
    "over-100MB",
    "depthwise-conv",
    "transformer",
    "torch-export",
}


def test_it_covers_what_issue_11_asks_for():
    assert len(CORPUS) >= 25
    assert {m.ir for m in CORPUS} >= set(range(3, 11))
    assert {m.opset for m in CORPUS} >= set(range(6, 22))
    assert REQUIRED_FEATURES <= {f for m in CORPUS for f in m.features}
    assert {11, 13, 17, 21} <= {m.opset for m in CORPUS if "conv" in m.features or m.needs_torch}


def test_it_writes_each_model_as_it_declares(tmp_path):
    for model in CORPUS:
        if model.needs_torch and torch_missing():
            continue
        path = onnx_file(model.write(tmp_path))
        proto = onnx.load(str(path), load_external_data=False)
        opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
        assert (proto.ir_version, opset) == (model.ir, model.opset), model.name
        names = [
            i.name
            for i in proto.graph.input
            if i.name not in {t.name for t in proto.graph.initializer}
        ]
        assert names == [spec.name for spec in model.inputs], model.name
        if "initializers-as-inputs" in model.features:
            assert {t.name for t in proto.graph.initializer} <= {i.name for i in proto.graph.input}
        if "over-100MB" in model.features:
            assert sum(f.stat().st_size for f in path.parent.iterdir()) > 100 * 1024**2


TASK_HEADS = {
    "detection": {"anchors-last", "anchors-first", "nms-in-graph"},
    "semantic_segmentation": {"semantic-segmentation"},
    "text_recognition": {"ctc"},
    "embedding": {"embedding"},
}


def test_it_covers_what_issue_26_asks_for():
    for task, features in TASK_HEADS.items():
        found = {f for m in CORPUS if m.task == task for f in m.features}
        assert features <= found, task
    features = {f for m in CORPUS for f in m.features}
    assert {"minus-one-dims", "already-quantised", "old-opset"} <= features
    assert all(m.expect == RECOMMENDED for m in CORPUS if m.opset < 7)  # auto mode converts it
