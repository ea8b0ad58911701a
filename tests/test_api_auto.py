"""Auto mode, its runs, jobs and device classes through the API, for pipelines."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.devices.models import DeviceClass
from deployhub.engines import auto
from deployhub.engines.models import AutoBuild, AutoRun
from deployhub.jobs.models import Job, JobKind
from deployhub.registry.models import ModelVersion
from deployhub.registry.uploads import create_dataset
from tests.api_calls import call, token_for
from tests.benchmark_results import LATENCY, record_evaluation, record_run, result
from tests.compile_jobs import FINGERPRINT
from tests.conftest import ASSETS, category_sent_with, stored_engine


@pytest.fixture
def online_device(make_device, client):
    """A CPU device of the class with ONNX Runtime that has just heartbeated."""
    device, token = make_device("cpu-1")
    call(client, token, "device/heartbeat", {"fingerprint": FINGERPRINT})
    return device, token


@pytest.fixture
def validation(version, alice):
    with open(ASSETS / "validation.npz", "rb") as handle:
        upload = SimpleUploadedFile("validation.npz", handle.read())
    return create_dataset(version, upload, alice, kind="validation", name="validation")


def start(client, version, body, user):
    raw = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(
        f"/api/v1/versions/{version.pk}/auto",
        raw,
        content_type="application/json",
        **token_for(user),
    )


def get(client, path, user):
    return client.get(f"/api/v1/{path}", **token_for(user))


def test_it_starts_auto_mode_and_answers_202_with_where_to_follow_it(
    client, version, device_class, alice, online_device, validation
):
    answer = start(client, version, {"device_class": device_class.slug}, alice)

    assert answer.status_code == 202
    run = AutoRun.objects.get(pk=answer.json()["auto_run"]["id"])
    assert answer["Location"].endswith(f"/api/v1/auto-runs/{run.pk}")
    assert answer.json()["auto_run"]["url"] == answer["Location"]
    assert run.device_class == device_class and run.created_by == alice
    body = get(client, f"auto-runs/{run.pk}", alice).json()
    assert body["state"] == "running" and body["recommended"] is None
    assert body["dataset"]["name"] == "validation"
    builds = {(b["backend"], b["precision"]): b for b in body["builds"]}
    fp32 = builds[("onnxruntime", "fp32")]
    assert fp32["state"] == "running" and fp32["jobs"][JobKind.COMPILE] is not None
    assert Job.objects.get(pk=fp32["jobs"][JobKind.COMPILE]).kind == JobKind.COMPILE
    gpu_only = builds[("tensorrt", "fp16")]
    assert gpu_only["state"] == "skipped" and "NVIDIA GPU" in gpu_only["skipped"]


def measured(run, name, p50, agreement=1.0):
    """Add a build to the run whose engine was benchmarked and evaluated."""
    version, device_class = run.model_version, run.device_class
    engine = stored_engine(version, device_class, {"name": name}, digest=name)
    benchmark = record_run(
        version, device_class, result(latency_ms={**LATENCY, "p50": p50, "p99": p50 * 1.2}), engine
    )
    evaluate_job = Job.objects.create(
        team=version.team,
        kind=JobKind.EVALUATE,
        device_class=device_class,
        model_version=version,
        engine=engine,
        state="succeeded",
    )
    record_evaluation(evaluate_job, engine, agreement, max_abs_error=0.05)
    return AutoBuild.objects.create(
        auto_run=run,
        backend="onnxruntime",
        precision=name,
        engine=engine,
        benchmark_job=benchmark.job,
        evaluate_job=evaluate_job,
        finished=True,
    )


def failed(run, error):
    compile_job = Job.objects.create(
        team=run.team,
        kind=JobKind.COMPILE,
        device_class=run.device_class,
        model_version=run.model_version,
        state="failed",
        error=error,
        failure_category=category_sent_with(error),
        log="loading\nparsing\nfailed at node 7\n",
    )
    return AutoBuild.objects.create(
        auto_run=run,
        backend="openvino",
        precision="fp32",
        compile_job=compile_job,
        error=error,
        finished=True,
    )


def test_it_reports_every_build_with_its_figures_and_the_recommended_engine(
    client, version, device_class, alice
):
    run = AutoRun.objects.create(model_version=version, device_class=device_class)
    slow = measured(run, "fp32", p50=8.0)
    fast = measured(run, "int8", p50=2.0, agreement=0.99)
    broken = failed(run, "unsupported_operator: BatchNormalization (opset 6)")
    auto.rank(run)

    body = get(client, f"auto-runs/{run.pk}", alice).json()

    assert body["state"] == "done" and body["outcome"] == "recommended"
    assert body["recommended"]["build"] == fast.pk
    assert body["recommended"]["engine"] == fast.engine_id
    assert "fastest" in body["recommended"]["reason"]
    assert "meets the class's gate" in body["recommended"]["reason"]
    builds = {b["id"]: b for b in body["builds"]}
    assert builds[fast.pk]["benchmark"]["p50_ms"] == 2.0
    assert builds[fast.pk]["benchmark"]["p99_ms"] == pytest.approx(2.4)
    assert builds[fast.pk]["benchmark"]["throughput_ips"] == 100.0
    assert builds[fast.pk]["accuracy"]["top1_agreement"] == 0.99
    assert builds[fast.pk]["accuracy"]["max_abs_error"] == 0.05
    assert builds[fast.pk]["jobs"][JobKind.EVALUATE] == fast.evaluate_job_id
    assert builds[slow.pk]["state"] == "done" and builds[slow.pk]["engine"] == slow.engine_id
    assert builds[broken.pk]["state"] == "failed"
    assert builds[broken.pk]["failure"] == {
        "job": broken.compile_job_id,
        "category": "unsupported_operator",
        "label": "Unsupported operator",
        "message": "unsupported_operator: BatchNormalization (opset 6)",
    }


def test_it_says_when_every_build_failed(client, version, device_class, alice):
    run = AutoRun.objects.create(model_version=version, device_class=device_class)
    failed(run, "unsupported_operator: Upsample")
    failed(run, "shape_or_contract: input 'x' has 3 dims, the contract 4")
    auto.rank(run)

    body = get(client, f"auto-runs/{run.pk}", alice).json()

    assert body["outcome"] == "all_failed" and body["outcome_label"] == "All 2 builds failed"
    assert body["recommended"] is None
    categories = [b["failure"]["category"] for b in body["builds"]]
    assert categories == ["unsupported_operator", "shape_or_contract"]


def test_it_answers_a_job_with_its_state_failure_log_and_links(
    client, version, device_class, alice
):
    run = AutoRun.objects.create(model_version=version, device_class=device_class)
    job = failed(run, "out_of_memory: the build needed 9 GB").compile_job

    body = get(client, f"jobs/{job.pk}", alice).json()

    assert body["kind"] == JobKind.COMPILE and body["state"] == "failed"
    assert body["failure_category"] == "out_of_memory"
    assert body["error"] == "out_of_memory: the build needed 9 GB"
    assert body["log_tail"].endswith("failed at node 7\n")
    assert body["model_version"] == version.pk
    assert body["model_version_url"].endswith(f"/api/v1/versions/{version.pk}")
    assert body["page"].endswith(f"/jobs/{job.pk}/")
    assert body["created_at"] and body["finished_at"] is None


def test_it_keeps_the_device_protocol_for_devices(client, job, online_device):
    _, device_token = online_device

    answer = client.get(f"/api/v1/jobs/{job.pk}", HTTP_AUTHORIZATION=f"Bearer {device_token}")

    assert answer.status_code == 403  # a person's API token reads jobs; a device claims them


def test_it_lists_the_teams_device_classes_with_their_budget_and_devices(
    client, device_class, alice, charlie, online_device
):
    body = get(client, "device-classes", alice).json()

    [listed] = body["items"]
    assert listed["slug"] == device_class.slug and listed["serving_pattern"] == "realtime"
    assert listed["budget"]["frame_budget_ms"] == 33.3
    assert listed["budget"]["fps"] == pytest.approx(30.03, abs=0.01)
    assert listed["budget"]["gate"].startswith("p99 per frame within 33.3 ms")
    assert listed["online_devices"] == ["cpu-1"]
    assert get(client, "device-classes", charlie).json() == {"items": [], "count": 0}


def test_it_hides_another_teams_runs_jobs_and_versions(
    client, version, device_class, alice, charlie, job, online_device, validation
):
    run = AutoRun.objects.create(model_version=version, device_class=device_class)

    assert get(client, f"auto-runs/{run.pk}", charlie).status_code == 404
    assert get(client, f"jobs/{job.pk}", charlie).status_code == 404
    answer = start(client, version, {"device_class": device_class.slug}, charlie)
    assert answer.status_code == 404 and answer.json() == {"error": "Not found."}
    assert AutoRun.objects.count() == 1


def test_it_lets_a_viewer_read_a_run_but_not_start_one(
    client, version, device_class, vera, online_device, validation
):
    run = AutoRun.objects.create(model_version=version, device_class=device_class)

    assert get(client, f"auto-runs/{run.pk}", vera).status_code == 200
    answer = start(client, version, {"device_class": device_class.slug}, vera)
    assert answer.status_code == 403 and "engineer" in answer.json()["error"]
    assert AutoRun.objects.count() == 1 and not Job.objects.exists()


@pytest.mark.parametrize(
    "body, says",
    [
        ("{", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        ("[1]", "JSON object"),
        ({}, "device_class"),
        ({"device_class": 7}, "device_class"),
        ({"device_class": "no-such-class"}, "no device class 'no-such-class'"),
        ({"device_class": "CLASS", "batch": 8}, "Unknown field 'batch'"),
    ],
)
def test_it_refuses_bad_input_with_400_and_starts_nothing(
    client, version, device_class, alice, online_device, validation, body, says
):
    if isinstance(body, dict) and body.get("device_class") == "CLASS":
        body["device_class"] = device_class.slug

    answer = start(client, version, body, alice)

    assert answer.status_code == 400 and says in answer.json()["error"]
    assert not AutoRun.objects.exists() and not Job.objects.exists()


def test_it_refuses_auto_mode_without_a_dataset_and_says_what_to_attach(
    client, version, device_class, alice, online_device
):
    answer = start(client, version, {"device_class": device_class.slug}, alice)

    assert answer.status_code == 400 and "attach a validation" in answer.json()["error"]
    assert not AutoRun.objects.exists() and not Job.objects.exists()


def test_it_refuses_auto_mode_on_a_version_that_is_not_onnx(
    client, version, device_class, alice, online_device, validation
):
    program = ModelVersion.objects.create(
        model=version.model,
        number=version.number + 1,
        file="versions/model.pt2",
        sha256="1" * 64,
        size=1,
        format="pt2",
    )

    answer = start(client, program, {"device_class": device_class.slug}, alice)

    assert answer.status_code == 400 and "ONNX" in answer.json()["error"]
    assert not AutoRun.objects.exists() and not Job.objects.exists()


def test_it_lists_a_versions_auto_runs_newest_first_by_class(
    client, version, device_class, alice, charlie
):
    other = DeviceClass.objects.create(team=device_class.team, slug="other-class", name="Other")
    older = AutoRun.objects.create(model_version=version, device_class=device_class)
    newer = AutoRun.objects.create(model_version=version, device_class=device_class)
    elsewhere = AutoRun.objects.create(model_version=version, device_class=other)

    listed = get(client, f"versions/{version.pk}/auto-runs", alice).json()
    assert [run["id"] for run in listed["items"]] == [elsewhere.pk, newer.pk, older.pk]
    assert listed["count"] == 3 and listed["items"][1]["url"].endswith(f"/auto-runs/{newer.pk}")
    on_class = get(client, f"versions/{version.pk}/auto-runs?device_class={other.slug}", alice)
    assert [run["id"] for run in on_class.json()["items"]] == [elsewhere.pk]
    assert get(client, f"versions/{version.pk}/auto-runs", charlie).status_code == 404
