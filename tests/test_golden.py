"""Golden pairs on the hub: attached, checked by a real worker, flagged wherever engines appear."""

import io
import zipfile

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.engines.actions import request_compile
from deployhub.engines.models import AutoBuild, AutoRun, Engine
from deployhub.evaluation.actions import request_evaluation
from deployhub.evaluation.models import AccuracyRun, GoldenRun
from deployhub.jobs.actions import submit_job
from deployhub.jobs.models import Job, JobKind
from deployhub.registry.golden import create_golden_set
from deployhub.registry.models import GoldenSet, Model
from deployhub.registry.uploads import create_dataset, create_version
from deployhub.teams.models import Event
from tests.api_calls import call, token_for
from tests.compile_jobs import FINGERPRINT
from tests.conftest import PASSWORD, stored_engine, wait_until
from tests.golden_models import (
    WRONG_BIAS,
    golden_inputs,
    golden_npz,
    golden_pb_zip,
    linear_model,
    run_model,
    tensor_bytes,
)
from workers.checks import golden as worker_golden

CONFIG = {"optimization_level": "all", "provider": "CPUExecutionProvider"}


def upload_version(model, onnx_model, user, name="linear.onnx"):
    return create_version(model, SimpleUploadedFile(name, onnx_model.SerializeToString()), user)


@pytest.fixture
def linear(alice, demo_team):
    """A version of the two-output linear model: x [1, 4] -> logits [1, 3], features [1, 4]."""
    model = Model.objects.create(team=demo_team, name="linear", created_by=alice)
    return upload_version(model, linear_model(), alice)


def post_golden(client, user, version, filename, data, **fields):
    return client.post(
        f"/api/v1/versions/{version.pk}/golden",
        {"name": "reference", "file": SimpleUploadedFile(filename, data), **fields},
        **token_for(user),
    )


def stored_files(storage_root):
    return sorted(p.relative_to(storage_root).as_posix() for p in storage_root.rglob("*.*"))


def nothing_stored(storage_root, before):
    return not GoldenSet.objects.exists() and stored_files(storage_root) == before


# Attaching ---------------------------------------------------------------------


def test_it_attaches_an_npz_of_golden_pairs(client, alice, linear, storage_root):
    response = post_golden(client, alice, linear, "golden.npz", golden_npz())

    assert response.status_code == 201, response.json()
    golden = GoldenSet.objects.get()
    assert (golden.format, golden.pairs) == ("npz", 4)
    assert golden.input_names == ["x"] and golden.output_names == ["logits", "features"]
    assert (golden.atol, golden.rtol) == (1e-4, 1e-3)
    assert golden.file.name == f"golden/{golden.sha256[:2]}/{golden.sha256}.npz"
    assert (storage_root / golden.file.name).read_bytes() == golden_npz()
    assert Event.objects.filter(verb="golden.created", target_id=golden.pk).exists()
    listed = client.get(f"/api/v1/versions/{linear.pk}/golden", **token_for(alice)).json()
    assert listed["count"] == 1
    assert listed["items"][0]["pairs"] == 4 and listed["items"][0]["runs"] == []


def test_it_attaches_onnx_test_data_from_the_version_page(client, alice, linear):
    client.login(username="alice", password=PASSWORD)
    response = client.post(
        f"/versions/{linear.pk}/golden",
        {
            "name": "zoo",
            "file": SimpleUploadedFile("test_data.zip", golden_pb_zip(named=False)),
            "atol": "0.001",
            "rtol": "0.01",
        },
    )

    assert response.status_code == 302
    golden = GoldenSet.objects.get()
    assert (golden.format, golden.pairs, golden.atol, golden.rtol) == ("onnx-pb", 3, 1e-3, 1e-2)
    page = client.get(linear.get_absolute_url()).content.decode()
    assert 'id="golden"' in page and "zoo" in page and "not checked yet" in page


def pb_zip(members):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


X = golden_inputs(1)[0]
LOGITS = run_model(linear_model(), golden_inputs(1))["logits"][0]


@pytest.mark.parametrize(
    "filename, data, message",
    [
        ("g.npz", golden_npz(extra=np.zeros((4, 2))), "'extra', which is neither an input"),
        ("g.npz", golden_npz(x=None), "no array for the model input 'x'"),
        ("g.npz", golden_npz(logits=None, features=None), "holds no expected output"),
        ("g.npz", golden_npz(x=golden_inputs().astype(np.float64)), "holds float64 values"),
        (
            "g.npz",
            golden_npz(x=np.zeros((4, 2, 4), np.float32)),
            "has shape [2, 4], but the contract of 'x' takes [batch 1, 4]",
        ),
        ("g.npz", golden_npz(x=golden_inputs()[:, 0]), "one pair of a batch-1 input"),
        (
            "g.npz",
            golden_npz(logits=np.zeros((4, 1, 5), np.float32)),
            "has shape [1, 5], but the model's 'logits' is [1, 3]",
        ),
        ("g.npz", golden_npz(logits=np.array(list("abcd"))), "golden pairs are numbers"),
        (
            "g.npz",
            golden_npz(logits=np.array([None, 1, 2, 3], dtype=object)),
            "holds Python objects",
        ),
        ("g.npz", golden_npz(features=np.full((4, 1, 4), np.inf, np.float32)), "NaN or infinite"),
        ("g.npz", golden_npz(logits=np.zeros((3, 1, 3), np.float32)), "number of pairs"),
        ("g.npz", b"not a zip at all", "not a zip archive"),
        ("g.pkl", b"\x80\x04K\x01.", "does not take .pkl golden files"),
        ("g.zip", golden_pb_zip(extra={"linear/model.onnx": b"x"}), "which is not test data"),
        ("g.zip", pb_zip({"readme.txt": b"hi"}), "which is not test data"),
        ("g.zip", pb_zip({"../test_data_set_0/input_0.pb": b""}), "climbs out of the archive"),
        (
            "g.zip",
            pb_zip(
                {
                    "test_data_set_0/input_0.pb": tensor_bytes(X),
                    "test_data_set_0/output_0.pb": tensor_bytes(LOGITS),
                    "test_data_set_0/output_2.pb": tensor_bytes(LOGITS),
                }
            ),
            "has no name, and the model has only 2 outputs",
        ),
        (
            "g.zip",
            pb_zip(
                {
                    "test_data_set_0/input_0.pb": b"\xff\xff\xff\xff",
                    "test_data_set_0/output_0.pb": tensor_bytes(LOGITS),
                }
            ),
            "is not a TensorProto",
        ),
        (
            "g.zip",
            pb_zip(
                {
                    "test_data_set_0/input_0.pb": tensor_bytes(np.array(["a"], dtype=object), "x"),
                    "test_data_set_0/output_0.pb": tensor_bytes(LOGITS),
                }
            ),
            "golden pairs are numbers",
        ),
        ("g.zip", pb_zip({"test_data_set_0/output_0.pb": tensor_bytes(LOGITS)}), "input 'x'"),
    ],
)
def test_it_refuses_a_malformed_golden_file_and_stores_nothing(
    client, alice, linear, storage_root, filename, data, message
):
    before = stored_files(storage_root)
    response = post_golden(client, alice, linear, filename, data)
    assert response.status_code == 400, response.content
    assert message in response.json()["error"]
    assert nothing_stored(storage_root, before)
    assert not any((storage_root / "tmp").iterdir())


def test_it_refuses_a_zip_with_too_many_members(client, alice, linear, storage_root, monkeypatch):
    monkeypatch.setattr(worker_golden, "MAX_MEMBERS", 4)
    before = stored_files(storage_root)
    response = post_golden(client, alice, linear, "g.zip", golden_pb_zip())
    assert response.status_code == 400
    assert "holds 9 members; the limit is 4" in response.json()["error"]
    assert nothing_stored(storage_root, before)


def test_it_refuses_a_file_that_expands_past_the_limit(
    client, alice, linear, storage_root, monkeypatch
):
    # The sizes the archive declares give a zip bomb away before anything is decompressed.
    monkeypatch.setattr(worker_golden, "MAX_BYTES", 300)
    before = stored_files(storage_root)
    response = post_golden(client, alice, linear, "g.npz", golden_npz())
    assert response.status_code == 400 and "the limit is 300" in response.json()["error"]
    assert nothing_stored(storage_root, before)


def test_it_refuses_bad_tolerances_names_and_repeats(client, alice, linear):
    assert (
        "atol must be"
        in post_golden(client, alice, linear, "g.npz", golden_npz(), atol="-1").json()["error"]
    )
    assert (
        "rtol must be"
        in post_golden(client, alice, linear, "g.npz", golden_npz(), rtol="nan").json()["error"]
    )
    assert post_golden(client, alice, linear, "g.npz", golden_npz()).status_code == 201
    again = post_golden(client, alice, linear, "g.npz", golden_npz(inputs=golden_inputs(2)))
    assert "already has a golden set named 'reference'" in again.json()["error"]
    same = post_golden(client, alice, linear, "g.npz", golden_npz(), name="copy")
    assert "already the golden set 'reference'" in same.json()["error"]
    assert GoldenSet.objects.count() == 1


def test_viewers_and_other_teams_cannot_attach(client, linear, vera, charlie):
    assert post_golden(client, vera, linear, "g.npz", golden_npz()).status_code == 403
    assert post_golden(client, charlie, linear, "g.npz", golden_npz()).status_code == 404
    assert not GoldenSet.objects.exists()


# The protocol: what the worker is given and what the hub keeps --------------------------


def make_engine(version, device_class, backend="onnxruntime"):
    return stored_engine(version, device_class, CONFIG, backend)


def attach(version, user, data=None, filename="golden.npz", name="reference"):
    upload = SimpleUploadedFile(filename, data or golden_npz())
    return create_golden_set(version, upload, user, name=name)


def golden_result(job, failing=()):
    outputs = [
        {
            "name": name,
            "passed": name not in failing,
            "elements": 12,
            "mismatched": 4 if name in failing else 0,
            "mismatched_fraction": 1 / 3 if name in failing else 0.0,
            "max_abs_error": 0.2 if name in failing else 1e-7,
            "max_rel_error": 0.5 if name in failing else 1e-6,
            "nonfinite": 0,
            "worst_pair": 2,
            "shape_error": None,
        }
        for name in ("logits", "features")
    ]
    return {
        "set": job.params["golden"]["set"],
        "pairs": 4,
        "atol": 1e-4,
        "rtol": 1e-3,
        "passed": not failing,
        "failing": list(failing),
        "outputs": outputs,
        "reference": {"passed": True, "failing": []},
    }


def test_an_evaluate_job_carries_the_golden_file_and_stores_the_verdict(
    client, alice, linear, device_class, make_device
):
    device, token = make_device()
    call(client, token, "device/heartbeat", {"fingerprint": FINGERPRINT})
    engine, golden = make_engine(linear, device_class), attach(linear, alice)
    job = request_evaluation(engine, alice, golden_set=golden)
    assert job.params["golden"] == {
        "set": golden.pk,
        "atol": 1e-4,
        "rtol": 1e-3,
        "input_names": ["x"],
        "output_names": ["logits", "features"],
    }

    claimed = call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1}).json()
    assert claimed["inputs"]["golden"]["sha256"] == golden.sha256
    assert claimed["inputs"]["golden"]["filename"] == "golden.npz"
    assert "dataset" not in claimed["inputs"]
    download = call(client, token, f"jobs/{job.pk}/inputs/golden", method="get")
    assert b"".join(download.streaming_content) == golden_npz()
    result = {"golden": golden_result(job, ["logits"])}
    body = {"attempt": 1, "state": "succeeded", "result": result}
    assert call(client, token, f"jobs/{job.pk}/complete", body).status_code == 200

    job.refresh_from_db()
    run = GoldenRun.objects.get(job=job)
    assert job.state == "succeeded" and not run.passed and run.failing == ["logits"]
    assert not AccuracyRun.objects.exists()
    assert engine.accuracy_flags == ["golden set 'reference' not reproduced: logits"]
    client.login(username="alice", password=PASSWORD)
    page = client.get(job.get_absolute_url()).content.decode()
    assert '<div id="golden-result"><h2>Golden set reference</h2>' in page
    assert 'id="parity-result"' not in page and 'id="benchmark-result"' not in page


def test_a_golden_result_that_does_not_fit_the_set_fails_the_job(
    client, alice, linear, device_class, make_device
):
    device, token = make_device()
    call(client, token, "device/heartbeat", {"fingerprint": FINGERPRINT})
    engine, golden = make_engine(linear, device_class), attach(linear, alice)
    job = request_evaluation(engine, alice, golden_set=golden)
    call(client, token, f"jobs/{job.pk}/claim", {"attempt": 1})
    result = golden_result(job)
    result["outputs"] = result["outputs"][:1]
    body = {"attempt": 1, "state": "succeeded", "result": {"golden": result}}
    call(client, token, f"jobs/{job.pk}/complete", body)
    job.refresh_from_db()
    assert job.state == "failed" and "the set checks ['features', 'logits']" in job.error
    assert not GoldenRun.objects.exists()


def test_an_evaluation_needs_a_dataset_or_a_golden_set_of_its_own_version(
    client, alice, linear, device_class
):
    from deployhub.evaluation.actions import EvaluationRefused

    engine = make_engine(linear, device_class)
    with pytest.raises(EvaluationRefused, match="Choose a dataset, a golden set or both"):
        request_evaluation(engine, alice)
    next_version = upload_version(linear.model, linear_model(WRONG_BIAS), alice, "v2.onnx")
    other = attach(next_version, alice)
    with pytest.raises(EvaluationRefused, match="belongs to another version"):
        request_evaluation(engine, alice, golden_set=other)
    client.login(username="alice", password=PASSWORD)
    response = client.post(f"/engines/{engine.pk}/evaluate", {"max_samples": 10})
    assert response.status_code == 400 and "Choose a dataset, a golden set or both" in (
        response.content.decode()
    )
    assert not Job.objects.filter(kind=JobKind.EVALUATE).exists()


# Tolerance flags on every page that shows an engine -------------------------------------


def accuracy_run(engine, user, reference_top1, top1, agreement):
    job = submit_job(
        team=engine.team,
        kind=JobKind.EVALUATE,
        device_class=engine.device_class,
        user=user,
        model_version=engine.model_version,
        engine=engine,
        params={"max_samples": 100},
    )
    AccuracyRun.objects.create(
        job=job,
        engine=engine,
        samples=100,
        reference_top1=reference_top1,
        top1=top1,
        top1_agreement=agreement,
        max_abs_error=0.5,
        mean_abs_error=0.01,
        cosine_min=0.99,
        cosine_mean=0.999,
        details={"task": "classification", "metric": "top1"},
    )
    return job


def pages_showing(client, engine, job):
    version, device_class = engine.model_version, engine.device_class
    run = AutoRun.objects.create(model_version=version, device_class=device_class)
    AutoBuild.objects.create(auto_run=run, backend=engine.backend, precision="int8", engine=engine)
    urls = [
        engine.model_version.get_absolute_url(),
        engine.get_absolute_url(),
        job.get_absolute_url(),
        run.get_absolute_url(),
    ]
    return {url: client.get(url).content.decode() for url in urls}


def test_an_engine_outside_its_tolerance_is_flagged_on_every_page(
    client, alice, linear, device_class
):
    engine = make_engine(linear, device_class)
    job = accuracy_run(engine, alice, reference_top1=0.98, top1=0.95, agreement=0.96)
    reason = "top-1 accuracy 3.00 points below the FP32 reference (tolerance 1)"
    assert engine.accuracy_flags == [f"outside the accuracy tolerance: {reason}"]
    client.login(username="alice", password=PASSWORD)
    for url, page in pages_showing(client, engine, job).items():
        assert "⚑ flagged" in page and reason in page, url
    version_page = client.get(linear.get_absolute_url()).content.decode()
    assert version_page.count(reason) == 2  # the engine list and the compatibility matrix
    api_engine = client.get(f"/api/v1/engines/{engine.pk}", **token_for(alice)).json()
    assert api_engine["accuracy_flags"] == engine.accuracy_flags


def test_without_labels_top1_agreement_stands_in_for_the_metric(alice, linear, device_class):
    engine = make_engine(linear, device_class)
    accuracy_run(engine, alice, reference_top1=None, top1=None, agreement=0.98)
    assert engine.accuracy_flags == [
        "outside the accuracy tolerance: top-1 agrees with the FP32 reference on 98.0% of "
        "samples (tolerance: at least 99.0%)"
    ]
    device_class.accuracy_tolerance = 5.0
    device_class.save()
    assert Engine.objects.get(pk=engine.pk).accuracy_flags == []


def test_only_the_latest_accuracy_run_counts(client, alice, linear, device_class):
    engine = make_engine(linear, device_class)
    accuracy_run(engine, alice, reference_top1=0.98, top1=0.90, agreement=0.9)
    job = accuracy_run(engine, alice, reference_top1=0.98, top1=0.975, agreement=0.995)
    assert AccuracyRun.objects.get(job=job).within_tolerance
    assert Engine.objects.get(pk=engine.pk).accuracy_flags == []
    client.login(username="alice", password=PASSWORD)
    assert "⚑ flagged" not in client.get(engine.get_absolute_url()).content.decode()


def test_auto_mode_uses_the_same_tolerance(alice, linear, device_class):
    from deployhub.engines.auto import _accuracy_ok

    engine = make_engine(linear, device_class)
    job = accuracy_run(engine, alice, reference_top1=None, top1=None, agreement=0.985)
    run = AccuracyRun.objects.get(job=job)
    assert not _accuracy_ok(run, device_class)
    device_class.accuracy_tolerance = 2.0
    assert _accuracy_ok(run, device_class)


def test_a_task_metric_other_than_top1_sets_the_drop(alice, linear, device_class):
    engine = make_engine(linear, device_class)
    job = accuracy_run(engine, alice, reference_top1=None, top1=None, agreement=1.0)
    run = AccuracyRun.objects.get(job=job)
    run.task = "semantic_segmentation"
    run.details = {"metric": "miou", "reference": {"miou": 0.70}, "engine": {"miou": 0.66}}
    assert run.metric_drop_points == pytest.approx(4.0)
    assert run.tolerance_breach(device_class) == (
        "mIoU 4.00 points below the FP32 reference (tolerance 1)"
    )


# End to end: a real worker, a right engine and a deliberately wrong one ------------------


def final(job, worker, timeout=120):
    return wait_until(
        lambda: (j := Job.objects.get(pk=job.pk)).is_final and j,
        timeout,
        f"job {job.pk} to finish",
        on_timeout=worker.output,
    )


def compile_engine(version, device_class, user, worker):
    _, job = request_compile(version, device_class, "onnxruntime", CONFIG, user)
    job = final(job, worker)
    assert job.state == "succeeded", job.log + job.error
    return job.engine


def labelled_dataset(version, user):
    inputs = golden_inputs(40)
    labels = run_model(linear_model(), inputs)["logits"][:, 0].argmax(axis=1)
    buffer = io.BytesIO()
    np.savez(buffer, inputs=inputs[:, 0], labels=labels.astype(np.int64))
    upload = SimpleUploadedFile("validation.npz", buffer.getvalue())
    return create_dataset(version, upload, user, kind="validation", name="linear-val")


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_golden_pairs_pass_on_the_right_engine_and_name_the_output_of_a_wrong_one(
    client, alice, demo_team, device_class, make_device, start_worker
):
    model = Model.objects.create(team=demo_team, name="linear", created_by=alice)
    right = upload_version(model, linear_model(), alice)
    wrong = upload_version(model, linear_model(WRONG_BIAS), alice, "linear-wrong-bias.onnx")
    # What the team vouches for, made by the right model, attached to both versions.
    right_golden = attach(right, alice)
    wrong_golden = attach(wrong, alice, golden_pb_zip(), "golden.zip")
    dataset = labelled_dataset(right, alice)
    device, token = make_device()
    worker = start_worker(device, token)
    right_engine = compile_engine(right, device_class, alice, worker)
    wrong_engine = compile_engine(wrong, device_class, alice, worker)

    passed = final(request_evaluation(right_engine, alice, golden_set=right_golden), worker)
    failed = final(
        request_evaluation(wrong_engine, alice, dataset=dataset, golden_set=wrong_golden), worker
    )

    assert passed.state == "succeeded", passed.log + passed.error
    assert GoldenRun.objects.get(job=passed).passed
    assert "every checked output reproduced" in passed.log
    assert failed.state == "succeeded", failed.log + failed.error
    run = GoldenRun.objects.get(job=failed)
    assert not run.passed and run.failing == ["logits"] and run.reference_passed is False
    logits = run.outputs[[o["name"] for o in run.outputs].index("logits")]
    assert logits["mismatched"] == 3 and logits["max_abs_error"] == pytest.approx(0.2, abs=1e-5)
    assert "not reproduced: 'logits'" in failed.log
    assert AccuracyRun.objects.get(job=failed).samples == 40
    assert right_engine.accuracy_flags == []
    assert "golden set 'reference' not reproduced: logits" in wrong_engine.accuracy_flags
    client.login(username="alice", password=PASSWORD)
    for page_of in (wrong_engine, wrong, failed):
        url = page_of.get_absolute_url()
        page = client.get(url).content.decode()
        assert "⚑ flagged" in page and "not reproduced: logits" in page, url
    assert "⚑ flagged" not in client.get(right_engine.get_absolute_url()).content.decode()
