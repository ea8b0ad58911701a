"""Bad input is a clear 400, never a 500, and /api/v1/ errors are JSON.

Each case below answered 500 once: JSON nested 100,000 deep, a body that is not UTF-8,
a list where a string goes, a job progress that is not a number, NaN, an unknown class
on the auto page, a user in no team, and on PostgreSQL an over-long name or a NUL byte.
"""

import json
import socket
import subprocess

import pytest
import requests
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.demo.management.commands.run_embedded import Command
from deployhub.jobs.actions import claim_job
from deployhub.jobs.models import Job
from deployhub.registry.models import Model, ModelVersion
from deployhub.releases.models import Release
from tests.api_calls import onnx_upload, token_for
from tests.conftest import PASSWORD, stored_engine, wait_until

pytestmark = pytest.mark.django_db

DEEP = b"[" * 100_000 + b"]" * 100_000


def post_raw(client, path, body, headers, content_type="application/json"):
    return client.generic("POST", path, body, content_type=content_type, **headers)


def assert_refused(response, status=400, says=""):
    """The answer is the documented JSON error body, with the status and words expected."""
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert list(body) == ["error"] or "error" in body
    assert says.lower() in body["error"].lower(), body["error"]
    return body["error"]


@pytest.fixture
def device_headers(make_device):
    device, token = make_device()
    return device, {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.fixture
def running_job(job, device_headers):
    device, headers = device_headers
    claim_job(job.pk, device, 1)
    return job, headers


# --- JSON bodies -------------------------------------------------------------------------------


def test_it_refuses_json_nested_100000_deep_on_the_benchmarks_call(client, alice, version):
    response = post_raw(client, f"/api/v1/versions/{version.pk}/benchmarks", DEEP, token_for(alice))
    assert_refused(response, says="nested")


def test_it_refuses_json_nested_100000_deep_on_the_engines_call(client, alice, version):
    response = post_raw(client, f"/api/v1/versions/{version.pk}/engines", DEEP, token_for(alice))
    assert_refused(response, says="nested")


def test_it_refuses_json_nested_100000_deep_on_a_device_heartbeat(client, device_headers):
    device, headers = device_headers
    response = post_raw(client, "/api/v1/device/heartbeat", DEEP, headers)
    assert_refused(response, says="nested")
    device.refresh_from_db()
    assert device.last_heartbeat_at is None


def test_it_refuses_a_fingerprint_nested_deeper_than_the_hub_keeps(client, device_headers):
    device, headers = device_headers
    fingerprint = {"cpu": {}}
    for _ in range(200):  # parses fine, but no fingerprint is 200 levels deep
        fingerprint = {"x": fingerprint}
    response = post_raw(
        client, "/api/v1/device/heartbeat", json.dumps({"fingerprint": fingerprint}), headers
    )
    assert_refused(response, says="nested")
    device.refresh_from_db()
    assert device.fingerprint in (None, {})


def test_it_refuses_a_body_that_is_not_utf8(client, alice, version):
    body = b'{"device_class": "\xff\xfe"}'
    response = post_raw(client, f"/api/v1/versions/{version.pk}/engines", body, token_for(alice))
    assert_refused(response, says="UTF-8")


def test_it_refuses_a_body_in_utf16_that_holds_a_lone_surrogate(client, running_job):
    job, headers = running_job
    before = Job.objects.get(pk=job.pk).message
    body = '{"attempt": 1, "message": "\ud800"}'.encode("utf-16-le", "surrogatepass")
    response = post_raw(client, f"/api/v1/jobs/{job.pk}/heartbeat", body, headers)
    assert_refused(response, says="UTF-8")
    job.refresh_from_db()
    assert job.message == before


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_it_refuses_numbers_json_does_not_have(client, running_job, constant):
    job, headers = running_job
    body = f'{{"attempt": 1, "progress": {constant}}}'
    response = post_raw(client, f"/api/v1/jobs/{job.pk}/heartbeat", body, headers)
    assert_refused(response, says="number")
    job.refresh_from_db()
    assert job.progress == 0


@pytest.mark.parametrize("progress", ["abc", [1], {"a": 1}, True, 10**400])
def test_it_refuses_a_job_progress_that_is_not_a_fraction(client, running_job, progress):
    job, headers = running_job
    body = json.dumps({"attempt": 1, "progress": progress})
    response = post_raw(client, f"/api/v1/jobs/{job.pk}/heartbeat", body, headers)
    assert_refused(response, says="progress")
    job.refresh_from_db()
    assert job.progress == 0


@pytest.mark.parametrize("attempt", ["one", 1.5, "9" * 5000, -1, 2**64])
def test_it_refuses_an_attempt_that_is_not_an_id(client, running_job, attempt):
    job, headers = running_job
    body = json.dumps({"attempt": attempt, "progress": 0.5})
    response = post_raw(client, f"/api/v1/jobs/{job.pk}/heartbeat", body, headers)
    assert_refused(response, says="attempt")
    job.refresh_from_db()
    assert job.progress == 0


@pytest.mark.parametrize("progress, recorded", [(0.25, 0.25), (1.5, 1.0), (-1, 0.0)])
def test_it_records_a_job_progress_clamped_into_0_to_1(client, running_job, progress, recorded):
    job, headers = running_job
    body = json.dumps({"attempt": 1, "progress": progress, "message": "warm-up"})
    response = post_raw(client, f"/api/v1/jobs/{job.pk}/heartbeat", body, headers)
    assert response.status_code == 200
    job.refresh_from_db()
    assert job.progress == recorded and job.message == "warm-up"


@pytest.mark.parametrize(
    "body, says",
    [
        ({"backend": ["x"]}, "'backend': Input should be a valid string"),
        ({"device_class": ["x"]}, "'device_class': Input should be a valid string"),
        ({"build_config": ["x"]}, "'build_config': Input should be a valid dictionary"),
    ],
)
def test_it_refuses_a_list_where_the_engines_call_takes_a_string_or_an_object(
    client, alice, version, device_class, body, says
):
    body = {"device_class": device_class.slug, "backend": "onnxruntime", **body}
    response = post_raw(
        client, f"/api/v1/versions/{version.pk}/engines", json.dumps(body), token_for(alice)
    )
    assert_refused(response, says=says)
    assert not Job.objects.exists()


@pytest.mark.parametrize("text", ["nul\u0000byte", "lone \ud800 surrogate"])
def test_it_refuses_text_postgresql_cannot_store_in_a_persons_json_body(
    client, alice, version, device_class, text
):
    engine = stored_engine(version, device_class)
    body = json.dumps({"note": text})
    response = post_raw(client, f"/api/v1/engines/{engine.pk}/releases", body, token_for(alice))
    assert_refused(response, says="'note'")
    assert not Release.objects.exists()


def test_it_keeps_a_devices_log_with_a_nul_as_a_replacement_character(client, running_job):
    """A build log is the device's output: refusing its heartbeat for one byte would lose
    the job's lease, so the hub keeps the text with U+FFFD where PostgreSQL cannot."""
    job, headers = running_job
    body = json.dumps({"attempt": 1, "message": "lone \ud800", "log": "a\u0000b\n"})
    response = post_raw(client, f"/api/v1/jobs/{job.pk}/heartbeat", body, headers)
    assert response.status_code == 200, response.content
    job.refresh_from_db()
    assert job.message == "lone \ufffd" and "a\ufffdb\n" in job.log


# --- Names and notes on PostgreSQL ---------------------------------------------------------------


def test_it_refuses_a_5000_character_model_name_by_api(client, alice):
    data = {"name": "m" * 5000, "file": onnx_upload()}
    response = client.post("/api/v1/models", data, **token_for(alice))
    assert_refused(response, says="name")
    assert not Model.objects.exists()


@pytest.mark.parametrize("field", ["name", "description", "notes"])
def test_it_refuses_a_nul_byte_in_a_models_text_by_api(client, alice, field):
    data = {"name": "digits", "file": onnx_upload(), field: "a\u0000b"}
    response = client.post("/api/v1/models", data, **token_for(alice))
    assert_refused(response, says="NUL")
    assert not Model.objects.exists()


def test_it_refuses_a_nul_byte_in_a_query_string(client, make_device, device_headers):
    device, headers = device_headers
    path = f"/api/v1/device-classes/{device.device_class.slug}/production?model=1%00"
    assert_refused(client.get(path, **headers), says="NUL")


def test_it_refuses_a_5000_character_model_name_on_the_models_page(client, alice):
    client.force_login(alice)
    file = onnx_upload()
    response = client.post("/models/", {"name": "m" * 5000, "file": file})
    assert response.status_code == 400
    assert b"at most 100 characters" in response.content
    assert not Model.objects.exists()


@pytest.mark.parametrize("field", ["name", "description", "notes"])
def test_it_refuses_a_nul_byte_on_the_models_page(client, alice, field):
    client.force_login(alice)
    data = {"name": "digits", "file": onnx_upload(), field: "a\u0000b"}
    response = client.post("/models/", data)
    assert response.status_code == 400
    assert b"Null characters are not allowed" in response.content
    assert not Model.objects.exists()


def test_it_refuses_a_nul_byte_in_a_versions_notes(client, alice, version):
    client.force_login(alice)
    response = client.post(f"/versions/{version.pk}/notes", {"notes": "a\u0000b"})
    assert response.status_code < 500
    version.refresh_from_db()
    assert "\u0000" not in version.notes


# --- Pages ---------------------------------------------------------------------------------------


def test_it_refuses_auto_mode_on_an_unknown_class_on_the_version_page(
    client, alice, version, device_class
):
    client.force_login(alice)
    for device_class in ("999999", "²", "9" * 40, "9" * 5000, "x"):
        response = client.post(f"/versions/{version.pk}/auto", {"device_class": device_class})
        assert response.status_code == 400
        assert b"Choose one of your team" in response.content


def test_it_answers_404_to_switching_to_an_unknown_team(client, alice):
    client.force_login(alice)
    for team in ("999999", "abc", "²", "9" * 40, "9" * 5000, ""):
        assert client.post("/team/", {"team": team}).status_code == 404, team


def test_it_tells_a_user_in_no_team_to_join_one_before_adding_a_class(client):
    loner = get_user_model().objects.create_user("loner", password=PASSWORD)
    client.force_login(loner)
    response = client.post("/devices/", {"slug": "gpu", "name": "GPU", "frame_budget_ms": "33"})
    assert response.status_code == 403
    assert b"team" in response.content


# --- Every /api/v1/ error is the JSON error body -------------------------------------------------


def test_it_answers_an_unknown_api_path_with_a_json_404(client, alice):
    error = assert_refused(client.get("/api/v1/no-such-call", **token_for(alice)), 404)
    assert "/api/v1/no-such-call" in error


def test_it_answers_a_method_the_call_does_not_take_with_a_json_405(client, alice):
    response = client.delete("/api/v1/models", **token_for(alice))
    error = assert_refused(response, 405, says="DELETE")
    assert "GET" in error and response["Allow"] == "GET, POST"


def test_it_answers_an_unknown_job_to_a_device_with_a_json_404(client, device_headers):
    _, headers = device_headers
    response = client.get("/api/v1/jobs/999999/inputs/model", **headers)
    assert_refused(response, 404)


def test_it_answers_a_crash_under_the_api_with_a_json_500(client, alice, device_class, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("deployhub.api.pipelines.device_class_json", crash)
    client.raise_request_exception = False
    response = client.get("/api/v1/device-classes", **token_for(alice))
    error = assert_refused(response, 500, says="failed")
    assert "boom" not in error


def test_it_still_reads_a_json_body_sent_as_a_form_as_curl_d_does(client, device_headers):
    device, headers = device_headers
    body = json.dumps({"fingerprint": {"cpu": {"model": "X"}}})
    response = post_raw(
        client, "/api/v1/device/heartbeat", body, headers, "application/x-www-form-urlencoded"
    )
    assert response.status_code == 200, response.content
    device.refresh_from_db()
    assert device.fingerprint["cpu"]["model"] == "X"


def test_it_answers_a_json_body_over_the_size_limit_with_a_json_413(
    client, alice, version, settings
):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = json.dumps({"device_class": "x" * 2000})
    response = post_raw(client, f"/api/v1/versions/{version.pk}/auto", body, token_for(alice))
    assert_refused(response, 413, says="at most 1,000 bytes")


def test_it_answers_too_many_form_fields_with_a_json_400(client, alice, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 10
    body = "&".join(f"f{i}=1" for i in range(50))
    response = post_raw(
        client, "/api/v1/models", body, token_for(alice), "application/x-www-form-urlencoded"
    )
    assert_refused(response, 400)


def test_it_answers_a_broken_multipart_body_with_a_json_400(client, alice):
    response = post_raw(
        client, "/api/v1/models", b"--x\r\nnonsense", token_for(alice), "multipart/form-data"
    )
    assert_refused(response, 400, says="multipart")


def test_a_url_too_long_for_gunicorn_is_the_json_error_body_too(tmp_path):
    """gunicorn refuses a request line over 4,094 bytes before Django sees it: make run's web
    command answers that in JSON, as every API error (docker-compose.yml's run the same)."""
    port, command = free_port(), Command()
    command.log_dir = tmp_path
    url = f"http://127.0.0.1:{port}"
    [web] = [c for c in command.children(url, "127.0.0.1", port, "t") if c.name == "web"]
    env = {k: v for k, v in web.env.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["DEPLOYHUB_VAR_DIR"] = str(tmp_path / "var")
    log = tmp_path / "web.log"
    process = subprocess.Popen(
        web.command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    try:
        wait_until(lambda: listening(port), 60, "gunicorn", on_timeout=log.read_text)
        for path in ("/api/v1/models", "/models/"):
            response = requests.get(f"{url}{path}?q={'x' * 5000}", timeout=30)
            assert response.status_code == 414, response.text[:300]
            assert "at most 4,094 bytes" in response.json()["error"]
    finally:
        process.terminate()
        process.wait(timeout=30)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_it_leaves_the_html_404_page_alone_outside_the_api(client, alice):
    client.force_login(alice)
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_it_stores_nothing_when_a_version_upload_has_a_nul_in_its_notes(client, alice, version):
    data = {"file": SimpleUploadedFile("m.onnx", onnx_upload().read()), "notes": "\u0000"}
    response = client.post(f"/api/v1/models/{version.model_id}/versions", data, **token_for(alice))
    assert_refused(response, says="NUL")
    assert ModelVersion.objects.count() == 1
    assert Job.objects.count() == 0
