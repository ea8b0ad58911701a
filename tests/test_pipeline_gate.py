"""The CI examples' gate job, run as CI runs it, against a live hub and real workers.

examples/ci/gitlab-ci.yml (the `gate` job's script) and examples/ci/github-actions.yml (the
`gate` step) run the same commands; this test reads them from the files and runs them in
order in one bash -eo pipefail shell (as both CI systems do), with the variables the files
set and the two a project keeps secret (DEPLOYHUB_URL, DEPLOYHUB_TOKEN: a pipeline token).
What the files do around those commands is not run: installing the client (this
environment has it), training (the test writes the model file), posting the summary.

Production on both classes is the demo's digits CNN with some busywork beside it
(tests/gate_models.py). A version without it (faster, same predictions) passes and is
proposed for release on both; one with much more busywork fails; a class with no device
online cannot be decided.

Auto mode tries one build (ONNX Runtime FP32) with short benchmarks here, on a small
validation set: the test checks what the gate decides, not auto mode's grid. The slower
model is some 5x slower at p99 on a busy machine, past the 2x an unstable measurement
needs before the gate calls a slowdown a failure rather than noise.
"""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from django.core.files import File

from deployhub.devices.models import DeviceClass
from deployhub.engines import auto
from deployhub.engines.models import AutoRun
from deployhub.registry.models import Model
from deployhub.registry.uploads import create_dataset, create_version
from deployhub.releases.models import Release, ReleaseState
from deployhub.teams.models import ApiToken
from tests.conformance_run import QUICK_BENCHMARKS
from tests.conftest import ASSETS, ROOT, wait_until, worker_ready
from tests.gate_models import busy_digits

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

CI = ROOT / "examples" / "ci"
PRODUCTION_BUSYWORK = 100  # layers: about 1.5 ms a frame on a quiet CPU
# Fifty times as many (about 60 ms a frame): the gate calls an unstable slowdown under 2x
# "within noise", and on a loaded machine (make test runs this beside the conformance corpus)
# stalls of 30 ms lift the baseline's p99 as much as the candidate's. Ten times as many
# (16 ms) read as +47% there.
SLOWER_BUSYWORK = 5000
VALIDATION_SAMPLES = 40
OFFLINE_CLASS = "edge-arm"  # a class the team added but has no device in yet
GATE_TIMEOUT_S = 480


def gitlab_commands():
    return yaml.safe_load((CI / "gitlab-ci.yml").read_text())["gate"]["script"]


def github_commands():
    job = yaml.safe_load((CI / "github-actions.yml").read_text())["jobs"]["gate"]
    [step] = [step for step in job["steps"] if step.get("id") == "gate"]
    assert step.get("shell") == "bash"  # bash -eo pipefail, as the test runs them
    return step["run"].strip().splitlines()


def ci_variables():
    """The variables both files set to plain values (the rest are the CI system's)."""
    gitlab = yaml.safe_load((CI / "gitlab-ci.yml").read_text())["variables"]
    github = yaml.safe_load((CI / "github-actions.yml").read_text())["jobs"]["gate"]["env"]
    plain = {name: value for name, value in gitlab.items() if "$" not in value}
    assert plain == {name: github[name] for name in plain}
    return plain


def run_ci(folder, env):
    """Run the gate job's commands in `folder` as CI would; answer the finished process."""
    script = "\n".join(gitlab_commands()) + "\n"
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=folder,
        env={**os.environ, **env, "PATH": path},
        capture_output=True,
        text=True,
        timeout=GATE_TIMEOUT_S + 60,
    )


def small_validation_set():
    with np.load(ASSETS / "validation.npz") as full:
        data = {key: full[key][:VALIDATION_SAMPLES] for key in full.files}
    out = io.BytesIO()
    np.savez(out, **data)
    out.seek(0)
    return File(out, name="validation.npz")


def in_production(model, device_classes, user):
    """Make the model's first version production on each class, as auto mode recommends it
    (the classes' auto runs side by side, each on its class's worker)."""
    started = [auto.start(model.versions.get(), c, user) for c in device_classes]
    for device_class, run in zip(device_classes, started, strict=True):
        run = wait_until(
            lambda run=run: (r := AutoRun.objects.get(pk=run.pk)).state == "done" and r,
            300,
            f"the production version's auto run on {device_class.slug}",
            interval=0.2,
        )
        assert run.recommended is not None, run.summary
        Release.objects.create(
            engine=run.recommended.engine,
            model=model,
            device_class=device_class,
            state=ReleaseState.PRODUCTION,
        )


def pipeline_token(user):
    record = ApiToken(user=user, name="ci", scope="pipeline")
    token = record.issue()
    record.save()
    return token


def test_the_ci_gate_passes_a_faster_model_fails_a_slower_one_and_cannot_judge_an_empty_class(
    live_server, start_worker, make_device, alice, demo_team, monkeypatch, tmp_path
):
    assert gitlab_commands() == github_commands()  # one set of commands, two CI systems
    variables = ci_variables()
    for name, value in QUICK_BENCHMARKS.items():
        monkeypatch.setattr(auto, name, value)
    # A second of timed runs: a p99 of a hundred runs and more, not the one slowest.
    realtime = {**QUICK_BENCHMARKS["REALTIME_BENCHMARK"], "duration_s": 1.0}
    monkeypatch.setattr(auto, "REALTIME_BENCHMARK", realtime)
    monkeypatch.setattr(auto, "grid", lambda: [("onnxruntime", "fp32")])
    gated = [variables["GATE_CLASS_A"], variables["GATE_CLASS_B"]]
    classes = [
        DeviceClass.objects.create(team=demo_team, slug=slug, name=slug, frame_budget_ms=500)
        for slug in [*gated, OFFLINE_CLASS]
    ]
    devices = [make_device(f"{c.slug}-1", c) for c in classes[:2]]
    workers = [start_worker(*device, ready=False) for device in devices]  # load side by side
    for worker, (device, _) in zip(workers, devices, strict=True):
        worker_ready(worker, device)

    model = Model.objects.create(team=demo_team, name=variables["MODEL"], created_by=alice)
    with open(busy_digits(tmp_path / "v1.onnx", PRODUCTION_BUSYWORK), "rb") as handle:
        first = create_version(model, File(handle, name="v1.onnx"), alice)
    create_dataset(first, small_validation_set(), alice, kind="validation", name="validation")
    in_production(model, classes[:2], alice)

    secrets = {
        "DEPLOYHUB_URL": live_server.url,
        "DEPLOYHUB_TOKEN": pipeline_token(alice),
        "SOURCE": "tests/test_pipeline_gate.py",
    }

    def pipeline(name, busywork, **overrides):
        folder = tmp_path / name
        folder.mkdir()
        busy_digits(folder / variables["MODEL_FILE"], busywork)
        finished = run_ci(folder, {**variables, **secrets, **overrides})
        said = f"{name}: exit {finished.returncode}\n{finished.stdout}\n{finished.stderr}"
        answer = folder / "gate.json"
        assert answer.exists() and answer.stat().st_size, said
        return finished.returncode, json.loads(answer.read_text()), f"{said}\n{answer.read_text()}"

    code, verdict, said = pipeline("faster", busywork=0)
    assert code == 0, said
    assert [c["outcome"] for c in verdict["classes"]] == ["passed", "passed"], said
    proposed = Release.objects.filter(state=ReleaseState.DRAFT, model=model)
    assert {r.device_class.slug for r in proposed} == set(gated)
    assert {r.engine_id for r in proposed} == {c["engine"] for c in verdict["classes"]}
    assert {r.engine.model_version.number for r in proposed} == {2}
    assert "passed the gate" in proposed.first().note

    code, verdict, said = pipeline("slower", busywork=SLOWER_BUSYWORK)
    assert code == 1, said
    for judged in verdict["classes"]:
        p99 = next(c for c in judged["criteria"] if c["criterion"] == "p99 latency")
        assert p99["status"] == "fail", said
    assert Release.objects.filter(model=model).count() == 4  # nothing more proposed

    code, verdict, said = pipeline("offline", busywork=10, GATE_CLASS_B=OFFLINE_CLASS)
    assert code == 2, said
    reasons = {c["device_class"]: c["reason"] for c in verdict["classes"]}
    assert f"no device online in {OFFLINE_CLASS}" in reasons[OFFLINE_CLASS], said
    assert not AutoRun.objects.filter(model_version__number=4).exists()  # nothing started
