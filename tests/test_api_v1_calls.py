"""API v1's calls for what the pages do: submit, list, cancel jobs and read their logs; create,
edit and list device classes and devices; read the audit trail, manage webhooks and the
team's settings. Each as its page allows: a viewer reads, an engineer builds, an admin
administers, another team's objects are 404, a pipeline token opens only what it may, and
bad input is a 400 naming the field that changes nothing."""

import base64
import json
from datetime import timedelta

import pytest
from django.core.files import File
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from deployhub.benchmarks.forms import BenchmarkForm
from deployhub.devices.models import DeviceClass
from deployhub.jobs.actions import cancel_job, claim_job, complete_job
from deployhub.jobs.models import Job, JobKind, JobState
from deployhub.parity.models import ParityRun
from deployhub.registry.models import Model
from deployhub.registry.uploads import create_dataset, create_version
from deployhub.teams.models import Event, Role, Team, Webhook
from tests.api_calls import token_for
from tests.benchmark_results import ranged
from tests.conftest import ASSETS, make_user, queued_benchmark, stored_engine
from tests.parity_packs import SPEC, pack_bytes, synthetic_images, training_pipeline

pytestmark = pytest.mark.django_db


def api(client, user, method, path, body=None, scope="full", **query):
    """Call /api/v1/<path> with the user's personal (or pipeline) token; a body goes as JSON."""
    headers = token_for(user, scope)
    url = f"/api/v1/{path}"
    if method == "get":
        return client.get(url, query, **headers)
    raw = body if isinstance(body, str) else json.dumps(body or {})
    return client.generic(method.upper(), url, raw, "application/json", **headers)


def refused(response, status, *words):
    """The answer is the JSON error with this status, saying each of the words."""
    assert response.status_code == status, response.content[:500]
    message = response.json()["error"]
    for word in words:
        assert word in message, message
    return message


@pytest.fixture
def erin(demo_team):
    """Erin builds: engineer in the demo team."""
    return make_user("erin", demo_team, Role.ENGINEER)


@pytest.fixture
def acme_version(charlie):
    """A version of another team (charlie's)."""
    team = Team.objects.get(slug="acme")
    model = Model.objects.create(team=team, name="acme-model", created_by=charlie)
    with open(ASSETS / "digits_cnn_v2.onnx", "rb") as handle:
        return create_version(model, File(handle, name="acme.onnx"), charlie)


@pytest.fixture
def acme_class(charlie):
    team = Team.objects.get(slug="acme")
    return DeviceClass.objects.create(team=team, slug="acme-gpu", name="Acme GPU")


# --- POST jobs -----------------------------------------------------------------------------------


def test_it_queues_a_compile_and_answers_202_with_the_job(client, erin, version, device_class):
    body = {"kind": "compile", "model_version": version.pk, "device_class": device_class.slug}
    answer = api(client, erin, "post", "jobs", body)

    assert answer.status_code == 202, answer.json()
    job = Job.objects.get()
    assert job.kind == JobKind.COMPILE and job.device_class == device_class
    assert job.params["backend"] == "onnxruntime" and job.created_by == erin
    assert answer["Location"].endswith(f"/api/v1/jobs/{job.pk}")
    assert answer.json()["job"]["id"] == job.pk and answer.json()["reused"] is False


def test_it_queues_a_benchmark_of_a_version_with_the_pages_params(
    client, erin, version, device_class
):
    body = {
        "kind": "benchmark",
        "model_version": version.pk,
        "device_class": device_class.slug,
        "params": {"iterations": 500, "scenario": "single-stream"},
    }
    answer = api(client, erin, "post", "jobs", body)

    assert answer.status_code == 202, answer.json()
    job = Job.objects.get()
    assert job.kind == JobKind.BENCHMARK and job.engine is None
    assert job.params == {
        "scenario": "single-stream",
        "batch_size": 1,
        "iterations": 500,
        "warmup_iterations": 10,
    }


def test_it_queues_a_benchmark_of_an_engine_on_its_own_class(client, alice, version, device_class):
    engine = stored_engine(version, device_class)
    answer = api(client, alice, "post", "jobs", {"kind": "benchmark", "engine": engine.pk})

    assert answer.status_code == 202, answer.json()
    job = Job.objects.get()
    assert job.engine == engine and job.device_class == device_class
    assert answer.json()["engine"] == engine.pk


def test_it_queues_a_batch_sweep_up_to_the_contracts_largest_batch(
    client, alice, version, device_class
):
    child = ranged(version, alice)
    body = {"kind": "batch-sweep", "model_version": child.pk, "device_class": device_class.slug}
    answer = api(client, alice, "post", "jobs", body)

    assert answer.status_code == 202, answer.json()
    assert Job.objects.get().params["batch_sizes"] == [1, 2, 4, 8, 16, 24]


def test_a_sweep_of_a_fixed_batch_is_refused_naming_the_field(client, alice, version, device_class):
    body = {"kind": "batch-sweep", "model_version": version.pk, "device_class": device_class.slug}
    refused(api(client, alice, "post", "jobs", body), 400, "'params.batch_sweep'", "fixed at 1")
    assert not Job.objects.exists()


def test_it_queues_an_evaluation_of_an_engine_on_a_dataset(client, alice, version, device_class):
    engine = stored_engine(version, device_class)
    with open(ASSETS / "validation.npz", "rb") as handle:
        upload = SimpleUploadedFile("validation.npz", handle.read())
    dataset = create_dataset(version, upload, alice, kind="validation", name="val")
    body = {"kind": "evaluate", "engine": engine.pk, "dataset": dataset.pk, "max_samples": 200}
    answer = api(client, alice, "post", "jobs", body)

    assert answer.status_code == 202, answer.json()
    job = Job.objects.get()
    assert job.kind == JobKind.EVALUATE and job.engine == engine
    assert job.params["dataset"] == dataset.pk and job.params["max_samples"] == 200


def test_an_evaluation_needs_a_dataset_or_a_golden_set(client, alice, version, device_class):
    engine = stored_engine(version, device_class)
    answer = api(client, alice, "post", "jobs", {"kind": "evaluate", "engine": engine.pk})
    refused(answer, 400, "Choose a dataset, a golden set or both")
    assert not Job.objects.exists()


def test_it_queues_a_parity_check_of_a_pack_in_the_body(client, alice, demo_team, device_class):
    model = Model.objects.create(team=demo_team, name="spec", created_by=alice)
    with open(ASSETS / "digits_cnn_v2.onnx", "rb") as handle:
        version = create_version(model, File(handle, name="d.onnx"), alice, preprocessing=SPEC)
    images = synthetic_images()
    pack = pack_bytes(images, {name: training_pipeline(i) for name, i in images.items()})
    content = base64.b64encode(pack).decode()
    body = {
        "kind": "parity",
        "model_version": version.pk,
        "tolerance": 0.01,
        "pack": {"filename": "pack.zip", "content_base64": content},
    }
    answer = api(client, alice, "post", "jobs", body)

    assert answer.status_code == 202, answer.json()
    run = ParityRun.objects.get()
    assert answer.json()["parity_run"] == run.pk and run.samples == 3
    assert run.job.kind == JobKind.PARITY and run.job.params["tolerance"] == 0.01


def test_a_pack_that_is_not_base64_is_refused(client, alice, version):
    pack = {"filename": "pack.zip", "content_base64": "not base64!"}
    body = {"kind": "parity", "model_version": version.pk, "pack": pack}
    refused(api(client, alice, "post", "jobs", body), 400, "'pack.content_base64'")
    assert not Job.objects.exists() and not ParityRun.objects.exists()


def test_an_export_of_an_onnx_version_converts_its_opset(client, alice, version, device_class):
    body = {"kind": "export", "model_version": version.pk, "opset": 13}
    answer = api(client, alice, "post", "jobs", body)

    assert answer.status_code == 202, answer.json()
    job = Job.objects.get()
    assert job.kind == JobKind.EXPORT and job.params["convert_to_opset"] == 13


def test_a_viewer_submits_nothing(client, vera, version, device_class):
    body = {"kind": "compile", "model_version": version.pk, "device_class": device_class.slug}
    refused(api(client, vera, "post", "jobs", body), 403, "engineer")
    assert not Job.objects.exists()


def test_another_teams_version_is_not_found(client, charlie, version, device_class):
    body = {"kind": "benchmark", "model_version": version.pk, "device_class": device_class.slug}
    refused(api(client, charlie, "post", "jobs", body), 404)
    assert not Job.objects.exists()


def test_a_class_of_another_team_is_refused_naming_the_field(
    client, alice, version, device_class, acme_class
):
    body = {"kind": "compile", "model_version": version.pk, "device_class": acme_class.slug}
    refused(api(client, alice, "post", "jobs", body), 400, "'device_class'", "acme-gpu")
    assert not Job.objects.exists()


def test_a_pipeline_token_queues_a_benchmark(client, alice, version, device_class):
    body = {"kind": "benchmark", "model_version": version.pk, "device_class": device_class.slug}
    answer = api(client, alice, "post", "jobs", body, scope="pipeline")
    assert answer.status_code == 202, answer.json()
    assert Job.objects.get().kind == JobKind.BENCHMARK


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"kind": "benchmark", "params": {"batch_size": 0}}, "'params.batch_size'"),
        ({"kind": "benchmark", "params": {"scenario": "fast"}}, "'params.scenario'"),
        ({"kind": "benchmark", "params": {"iterations": "5"}}, "params.iterations"),
        ({"kind": "benchmark", "params": {"speed": 5}}, "params.speed"),
        ({"kind": "benchmark", "colour": "red"}, "colour"),
        ({"kind": "compile", "backend": "nope"}, "nope"),
        ({"kind": "compile", "build_config": []}, "build_config"),
        ({"kind": "teleport"}, "teleport"),
        ({"device_class": "x"}, "kind"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_queues_nothing(
    client, alice, version, device_class, body, named
):
    body = {"model_version": version.pk, "device_class": device_class.slug, **body}
    refused(api(client, alice, "post", "jobs", body), 400, named)
    assert not Job.objects.exists()


def test_the_benchmark_params_are_the_pages_form_fields():
    from deployhub.api.jobs import BenchmarkParams

    assert set(BenchmarkParams.model_fields) == set(BenchmarkForm.base_fields) - {"device_class"}


# --- GET jobs, cancel, log -----------------------------------------------------------------------


def test_it_lists_the_teams_jobs_newest_first_with_filters(
    client, vera, alice, version, device_class, acme_version, charlie, acme_class
):
    first = queued_benchmark(version, device_class, alice)
    second = queued_benchmark(version, device_class, alice)
    cancel_job(first.pk, alice)
    queued_benchmark(acme_version, acme_class, charlie)

    everything = api(client, vera, "get", "jobs").json()
    assert [job["id"] for job in everything["items"]] == [second.pk, first.pk]
    assert everything["count"] == 2
    queued = api(client, vera, "get", "jobs", state="queued").json()
    assert [job["id"] for job in queued["items"]] == [second.pk]
    by_class = api(client, vera, "get", "jobs", device_class=device_class.slug, kind="benchmark")
    assert by_class.json()["count"] == 2
    assert api(client, vera, "get", "jobs", model_version=version.pk + 999).json()["count"] == 0
    assert api(client, vera, "get", "jobs", limit=1).json()["items"][0]["id"] == second.pk


def test_an_unknown_state_is_a_400_naming_it(client, vera, job):
    refused(api(client, vera, "get", "jobs", state="sleeping"), 400, "'state'")


def test_a_pipeline_token_lists_jobs_and_reads_a_log(client, alice, job):
    assert api(client, alice, "get", "jobs", scope="pipeline").json()["count"] == 1
    log = api(client, alice, "get", f"jobs/{job.pk}/log", scope="pipeline")
    assert log.status_code == 200 and log["Content-Type"].startswith("text/plain")


def test_it_answers_the_whole_log_as_text(client, vera, job, make_device):
    device, _ = make_device()
    claim_job(job.pk, device, 1)
    lines = "".join(f"line {n}\n" for n in range(200))
    complete_job(job.pk, device, 1, JobState.FAILED, error="boom", log=lines)

    answer = api(client, vera, "get", f"jobs/{job.pk}/log")
    assert answer.status_code == 200
    text = answer.content.decode()
    assert "line 0\n" in text and "line 199\n" in text and "failed: boom" in text


def test_another_teams_job_log_is_not_found(client, charlie, job):
    refused(api(client, charlie, "get", f"jobs/{job.pk}/log"), 404)


def test_an_engineer_cancels_a_queued_job(client, erin, job):
    answer = api(client, erin, "post", f"jobs/{job.pk}/cancel")
    assert answer.status_code == 200, answer.json()
    assert answer.json()["state"] == "cancelled"
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert Event.objects.filter(verb="job.cancel", target_id=job.pk).exists()


def test_a_finished_job_cannot_be_cancelled_again(client, alice, job):
    cancel_job(job.pk, alice)
    body = refused(api(client, alice, "post", f"jobs/{job.pk}/cancel"), 409, "already cancelled")
    assert body


def test_a_viewer_another_team_and_a_pipeline_do_not_cancel(client, vera, charlie, alice, job):
    refused(api(client, vera, "post", f"jobs/{job.pk}/cancel"), 403, "engineer")
    refused(api(client, charlie, "post", f"jobs/{job.pk}/cancel"), 404)
    refused(api(client, alice, "post", f"jobs/{job.pk}/cancel", scope="pipeline"), 403)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and not job.cancel_requested


# --- device classes and devices ------------------------------------------------------------------

NEW_CLASS = {"slug": "jetson-orin", "name": "Jetson Orin", "frame_budget_ms": 20.0}


def test_an_admin_creates_a_class_with_the_pages_defaults(client, alice, demo_team):
    answer = api(client, alice, "post", "device-classes", NEW_CLASS)

    assert answer.status_code == 201, answer.json()
    created = DeviceClass.objects.get(slug="jetson-orin")
    assert created.team == demo_team and created.frame_budget_ms == 20.0
    assert created.accuracy_tolerance == 1.0 and created.serving_pattern == "realtime"
    assert answer.json()["budget"]["frame_budget_ms"] == 20.0
    assert Event.objects.filter(verb="device_class.created", target_id=created.pk).exists()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"frame_budget_ms": -1.0}, "'frame_budget_ms'"),
        ({"serving_pattern": "batch"}, "'throughput_target_ips'"),
        ({"serving_pattern": "sometimes"}, "'serving_pattern'"),
        ({"slug": "no spaces"}, "'slug'"),
        ({"task_tolerances": {"detection": {"drop": "lots"}}}, "'task_tolerances'"),
        ({"name": "x" * 101}, "name"),
        ({"memory_limit_mb": 1.5}, "memory_limit_mb"),
    ],
)
def test_a_class_the_page_refuses_is_refused_and_not_stored(client, alice, change, named):
    refused(api(client, alice, "post", "device-classes", {**NEW_CLASS, **change}), 400, named)
    assert not DeviceClass.objects.exists()


def test_a_slug_taken_is_refused(client, alice, device_class):
    body = {**NEW_CLASS, "slug": device_class.slug}
    refused(api(client, alice, "post", "device-classes", body), 400, "'slug'")
    assert DeviceClass.objects.count() == 1


def test_only_an_admin_of_the_team_creates_a_class(client, erin, alice, charlie):
    refused(api(client, erin, "post", "device-classes", NEW_CLASS), 403, "admin")
    refused(api(client, charlie, "post", "device-classes", {**NEW_CLASS, "team": "demo"}), 404)
    refused(api(client, alice, "post", "device-classes", NEW_CLASS, scope="pipeline"), 403)
    assert not DeviceClass.objects.exists()


def test_an_admin_edits_a_class_and_the_change_is_recorded(client, alice, device_class):
    other = DeviceClass.objects.create(team=device_class.team, slug="cpu-b", name="B")
    change = {"frame_budget_ms": 50.0, "memory_limit_mb": 512, "trusts_builds_of": ["cpu-b"]}
    answer = api(client, alice, "patch", f"device-classes/{device_class.slug}", change)

    assert answer.status_code == 200, answer.json()
    device_class.refresh_from_db()
    assert device_class.frame_budget_ms == 50.0 and device_class.memory_limit_mb == 512
    assert device_class.name == "Test CPU"  # left out: kept
    assert list(device_class.trusts_builds_of.all()) == [other]
    assert answer.json()["trusts_builds_of"] == ["cpu-b"]
    event = Event.objects.get(verb="device_class.changed")
    assert event.data["before"]["frame_budget_ms"] == 33.3
    assert event.data["after"]["frame_budget_ms"] == 50.0


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"serving_pattern": "batch"}, "'throughput_target_ips'"),
        ({"accuracy_tolerance": -1.0}, "'accuracy_tolerance'"),
        ({"trusts_builds_of": ["acme-gpu"]}, "'trusts_builds_of'"),
        ({"slug": "renamed"}, "slug"),
        ({"frame_budget_ms": "fast"}, "frame_budget_ms"),
    ],
)
def test_a_bad_edit_changes_nothing(client, alice, device_class, acme_class, change, named):
    path = f"device-classes/{device_class.slug}"
    refused(api(client, alice, "patch", path, change), 400, named)
    device_class.refresh_from_db()
    assert device_class.serving_pattern == "realtime" and device_class.accuracy_tolerance == 1.0
    assert not device_class.trusts_builds_of.exists()
    assert not Event.objects.filter(verb="device_class.changed").exists()


def test_a_viewer_another_team_and_a_pipeline_do_not_edit_a_class(
    client, vera, charlie, alice, device_class
):
    path, change = f"device-classes/{device_class.slug}", {"frame_budget_ms": 5.0}
    refused(api(client, vera, "patch", path, change), 403, "admin")
    refused(api(client, charlie, "patch", path, change), 404)
    refused(api(client, alice, "patch", path, change, scope="pipeline"), 403)
    device_class.refresh_from_db()
    assert device_class.frame_budget_ms == 33.3


def test_a_member_and_a_pipeline_read_a_class(client, vera, alice, charlie, device_class):
    path = f"device-classes/{device_class.slug}"
    answer = api(client, vera, "get", path)
    assert answer.status_code == 200 and answer.json()["slug"] == device_class.slug
    assert api(client, alice, "get", path, scope="pipeline").status_code == 200
    refused(api(client, charlie, "get", path), 404)


def test_it_lists_the_teams_devices_with_filters(
    client, vera, device_class, make_device, acme_class
):
    online, _ = make_device("online-1")
    online.last_heartbeat_at = timezone.now()
    online.save()
    drained, _ = make_device("drained-1")
    drained.draining = True
    drained.last_heartbeat_at = timezone.now() - timedelta(days=1)
    drained.save()
    make_device("acme-1", cls=acme_class)

    def names(**query):
        return [d["name"] for d in api(client, vera, "get", "devices", **query).json()["items"]]

    assert names() == ["drained-1", "online-1"]
    assert names(online="true") == ["online-1"]
    assert names(online="false") == ["drained-1"]
    assert names(draining="true") == ["drained-1"]
    assert names(device_class="acme-gpu") == []
    row = api(client, vera, "get", "devices", online="true").json()["items"][0]
    assert row["state"] == "online" and row["url"].endswith(f"/api/v1/devices/{online.pk}")


def test_a_filter_that_is_not_a_truth_value_is_a_400_naming_it(client, vera):
    refused(api(client, vera, "get", "devices", online="sometimes"), 400, "'online'")


# --- the audit trail, webhooks, settings ---------------------------------------------------------


def test_a_member_reads_the_audit_trail_with_the_pages_filters(client, vera, alice, job):
    cancel_job(job.pk, alice)
    everything = api(client, vera, "get", "audit").json()
    assert [e["verb"] for e in everything["items"]][:2] == ["job.cancel", "job.queued"]
    assert everything["count"] == Event.objects.filter(team=job.team).count()
    cancelled = api(client, vera, "get", "audit", verb="job.can", target_type="job").json()
    assert cancelled["count"] == 1 and cancelled["items"][0]["target_id"] == job.pk
    today = timezone.now().date()
    assert api(client, vera, "get", "audit", since=str(today + timedelta(days=1))).json() == {
        "items": [],
        "count": 0,
    }


def test_a_bad_audit_filter_is_a_400_naming_it(client, vera):
    refused(api(client, vera, "get", "audit", since="yesterday"), 400, "since")
    refused(api(client, vera, "get", "audit", target_id="-3"), 400, "target_id")


def test_another_teams_trail_is_not_found_and_a_pipeline_reads_none(client, charlie, alice):
    refused(api(client, charlie, "get", "audit", team="demo"), 404)
    refused(api(client, alice, "get", "audit", scope="pipeline"), 403)


def test_an_admin_adds_a_webhook_and_sees_its_secret_once(client, alice, demo_team):
    body = {"url": "https://ci.example.com/hook", "events": ["release.", "job.failed"]}
    answer = api(client, alice, "post", "webhooks", body)

    assert answer.status_code == 201, answer.json()
    webhook = Webhook.objects.get()
    assert webhook.team == demo_team and webhook.events == ["release.", "job.failed"]
    assert answer.json()["secret"] == webhook.secret
    listed = api(client, alice, "get", "webhooks").json()
    assert listed["count"] == 1 and "secret" not in listed["items"][0]
    assert listed["items"][0]["secret_hint"] == webhook.secret[:10]
    assert Event.objects.filter(verb="webhook.created").exists()


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"url": "http://127.0.0.1/hook"}, "'url'"),
        ({"url": "ftp://example.com/"}, "'url'"),
        ({"url": "https://example.com/", "events": ["no spaces"]}, "'events'"),
        ({"url": "https://example.com/", "events": ["a,b"]}, "'events'"),
        ({"url": "https://example.com/", "events": "release."}, "events"),
    ],
)
def test_a_webhook_the_page_refuses_is_refused_and_not_stored(client, alice, body, named):
    refused(api(client, alice, "post", "webhooks", body), 400, named)
    assert not Webhook.objects.exists()


def test_only_admins_see_add_and_delete_webhooks(client, bob, vera, alice, charlie, demo_team):
    webhook = Webhook.objects.create(team=demo_team, url="https://example.com/h")
    refused(api(client, vera, "get", "webhooks"), 403, "admin")
    refused(api(client, bob, "post", "webhooks", {"url": "https://example.com/x"}), 403)
    refused(api(client, bob, "delete", f"webhooks/{webhook.pk}"), 403)
    refused(api(client, charlie, "delete", f"webhooks/{webhook.pk}"), 404)
    refused(api(client, alice, "delete", f"webhooks/{webhook.pk}", scope="pipeline"), 403)
    assert Webhook.objects.count() == 1

    answer = api(client, alice, "delete", f"webhooks/{webhook.pk}")
    assert answer.status_code == 204
    assert not Webhook.objects.exists()
    assert Event.objects.filter(verb="webhook.deleted", target_id=webhook.pk).exists()


def test_a_member_reads_the_settings_and_an_admin_changes_them(client, vera, alice, demo_team):
    assert api(client, vera, "get", "teams/demo/settings").json() == {
        "team": "demo",
        "name": "Demo",
        "approvals_required": 1,
    }
    answer = api(client, alice, "patch", "teams/demo/settings", {"approvals_required": 2})
    assert answer.status_code == 200 and answer.json()["approvals_required"] == 2
    demo_team.refresh_from_db()
    assert demo_team.approvals_required == 2
    event = Event.objects.get(verb="team.settings")
    assert event.data == {"before": {"approvals_required": 1}, "after": {"approvals_required": 2}}


@pytest.mark.parametrize("value", [0, 11, "2", None])
def test_a_setting_the_page_refuses_changes_nothing(client, alice, demo_team, value):
    body = {"approvals_required": value}
    refused(api(client, alice, "patch", "teams/demo/settings", body), 400, "approvals_required")
    demo_team.refresh_from_db()
    assert demo_team.approvals_required == 1
    assert not Event.objects.filter(verb="team.settings").exists()


def test_a_viewer_another_team_and_a_pipeline_do_not_change_settings(
    client, vera, charlie, alice, demo_team
):
    body = {"approvals_required": 3}
    refused(api(client, vera, "patch", "teams/demo/settings", body), 403, "admin")
    refused(api(client, charlie, "patch", "teams/demo/settings", body), 404)
    refused(api(client, charlie, "get", "teams/demo/settings"), 404)
    refused(api(client, alice, "patch", "teams/demo/settings", body, scope="pipeline"), 403)
    demo_team.refresh_from_db()
    assert demo_team.approvals_required == 1
