"""The Python client (deployhub_client) and the `deployhub` command against a live hub.

The client declares every API v1 operation it calls (deployhub_client/operations.py); the
first tests hold each against the hub's own /api/v1/openapi.json, so the client cannot
drift from the API. Operations the hub does not have yet are in PENDING: their tests skip,
naming the missing call.
"""

import hashlib
import inspect
import json
import stat
import subprocess
import zipfile

import pytest
from click.testing import CliRunner
from django.test import Client
from django.utils import timezone

from deployhub.engines import signing
from deployhub.engines.models import AutoRun
from deployhub.jobs.models import Job, JobKind
from deployhub.registry.models import Model
from deployhub_client import Hub, HubError, config
from deployhub_client import engines as client_engines
from deployhub_client.cli import COMMANDS_BY_OPERATION, cli
from deployhub_client.engines import EngineRefused, verify_file
from deployhub_client.hub import Unreachable
from deployhub_client.jobs import Jobs
from deployhub_client.operations import OPERATIONS
from deployhub_client.releases import Releases
from tests.api_calls import call, token_for
from tests.compile_jobs import FINGERPRINT
from tests.conftest import ASSETS, run_python, stored_engine
from tests.installed_worker import _dependency_links, clean_env, run, site_packages
from workers.version import worker_version

# Calls the client is written for (docs/cli.md) that the hub does not answer yet.
PENDING: dict[str, str] = {}


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    with django_db_blocker.unblock():
        return Client().get("/api/v1/openapi.json").json()


def operation_in(schema, declared):
    """The schema's operation at the declared method and path, or None."""
    return schema["paths"].get(f"/api/v1/{declared.path}", {}).get(declared.method.lower())


def needs(schema, *operation_ids):
    """Skip the test while the hub lacks one of these operations, naming it."""
    for operation_id in operation_ids:
        if operation_in(schema, OPERATIONS[operation_id]) is None:
            declared = OPERATIONS[operation_id]
            pytest.skip(f"the hub has no {declared.method} {declared.path} ({operation_id}) yet")


def resolved(schema, node):
    """A schema node with its $ref followed."""
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def properties(schema, node):
    """Every property a body may carry: a union's (oneOf, anyOf) members' together."""
    node = resolved(schema, node)
    found = set(node.get("properties", {}))
    for member in node.get("oneOf", []) + node.get("anyOf", []):
        found |= properties(schema, member)
    return found


@pytest.mark.parametrize("operation_id", sorted(OPERATIONS))
def test_each_operation_the_client_calls_is_the_hubs(schema, operation_id):
    declared = OPERATIONS[operation_id]
    found = operation_in(schema, declared)
    if found is None and operation_id in PENDING:
        pytest.skip(PENDING[operation_id])

    assert found is not None, f"the hub has no {declared.method} /api/v1/{declared.path}"
    assert found["operationId"] == operation_id
    content = found.get("requestBody", {}).get("content", {})
    kind = {"json": "application/json", "multipart": "multipart/form-data"}.get(declared.body)
    if declared.fields:
        assert kind in content, f"{operation_id} takes no {kind} body"
        assert set(declared.fields) <= properties(schema, content[kind]["schema"])
    query = {p["name"] for p in found.get("parameters", []) if p["in"] == "query"}
    assert set(declared.query) <= query
    if declared.paged:
        assert {"limit", "offset"} <= query
        listed = found["responses"]["200"]["content"]["application/json"]["schema"]
        assert {"items", "count"} <= properties(schema, listed)


def client_methods():
    for owner in (Hub, Jobs, Releases, client_engines.Engines):
        for name, method in inspect.getmembers(owner, inspect.isfunction):
            if not name.startswith("_") and name not in PLUMBING:
                yield f"{owner.__name__}.{name}", method


# Hub's own means of calling: they take an operation or a path, they declare none.
PLUMBING = {"send", "request", "pages", "call", "listed", "upload_file"}


def test_every_client_method_declares_the_operations_it_calls():
    undeclared = [name for name, method in client_methods() if not hasattr(method, "operations")]

    assert not undeclared
    called = {op.operation_id for _, method in client_methods() for op in method.operations}
    assert called == set(OPERATIONS)


def test_every_operation_has_a_command_that_calls_it():
    assert set(COMMANDS_BY_OPERATION) == set(OPERATIONS)
    for line in COMMANDS_BY_OPERATION.values():
        words = line.split()[1:]
        group = cli.commands[words[0]]
        assert words[0] in cli.commands and (
            not hasattr(group, "commands") or words[1] in group.commands
        ), line


def test_the_client_refuses_to_send_a_field_its_operation_does_not_declare():
    hub = Hub("http://127.0.0.1:9", "dhu_x")

    with pytest.raises(ValueError, match="release_rollback takes no \\['force'\\]"):
        hub.call(OPERATIONS["release_rollback"], 1, json={"reason": "r", "force": True})


# Against a live hub.


@pytest.fixture
def hub(live_server, alice):
    token = token_for(alice)["HTTP_AUTHORIZATION"].removeprefix("Bearer ")
    return Hub(live_server.url, token)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A config folder of the test's own, and no hub from the environment."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("DEPLOYHUB_URL", raising=False)
    monkeypatch.delenv("DEPLOYHUB_TOKEN", raising=False)
    return tmp_path


def test_upload_adds_a_version_to_a_model_by_id_following_the_bytes(hub, version):
    seen = []

    answer = hub.upload(
        ASSETS / "digits_cnn_v1.onnx",
        model=version.model_id,
        notes="from the client",
        on_progress=lambda sent, total: seen.append((sent, total)),
    )

    stored = version.model.versions.get(number=answer["number"])
    assert answer["number"] == 2 and stored.notes == "from the client"
    assert stored.sha256 == hashlib.sha256((ASSETS / "digits_cnn_v1.onnx").read_bytes()).hexdigest()
    assert seen[-1][0] == seen[-1][1] and len(seen) > 1


def test_upload_creates_the_model_named_when_none_has_that_name(hub, schema, demo_team):
    needs(schema, "models", "create_model_with_its_file")
    spec = {"layout": "NCHW"}

    answer = hub.upload(ASSETS / "digits_cnn_v2.onnx", model="new-digits", spec=spec)

    model = Model.objects.get(team=demo_team, name="new-digits")
    assert answer["model"] == model.pk and answer["number"] == 1
    assert model.versions.get().preprocessing is not None


def test_a_refusal_is_a_hub_error_with_the_hubs_status_and_message(hub, live_server, version):
    with pytest.raises(HubError) as missing:
        hub.jobs.get(987654)
    with pytest.raises(HubError) as wrong_class:
        hub.auto(version.pk, "no-such-class", wait=False)
    with pytest.raises(HubError) as no_token:
        Hub(live_server.url, "dhu_made-up").jobs.get(1)

    assert (missing.value.status, missing.value.message) == (404, "Not found.")
    assert wrong_class.value.status == 400 and "no-such-class" in wrong_class.value.message
    assert no_token.value.status == 401
    assert not AutoRun.objects.exists()


def test_an_unreachable_hub_is_said_so():
    with pytest.raises(Unreachable, match="Could not reach http://127.0.0.1:9"):
        Hub("http://127.0.0.1:9", "dhu_x").classes()


@pytest.fixture
def validation(version, alice):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from deployhub.registry.uploads import create_dataset

    upload = SimpleUploadedFile("validation.npz", (ASSETS / "validation.npz").read_bytes())
    return create_dataset(version, upload, alice, kind="validation", name="validation")


@pytest.fixture
def online_device(make_device, client):
    """A CPU device of the class with ONNX Runtime that has just heartbeated."""
    device, token = make_device("cpu-1")
    call(client, token, "device/heartbeat", {"fingerprint": FINGERPRINT})
    return device


def test_auto_starts_a_run_and_polls_it_until_done_the_run_finished_in_the_database(
    hub, version, device_class, validation, online_device
):
    looks = []

    def finish_on_first_look(run):
        looks.append(run["state"])
        AutoRun.objects.filter(pk=run["id"]).update(state="done", finished_at=timezone.now())

    run = hub.auto(version.pk, device_class.slug, on_progress=finish_on_first_look, poll_seconds=0)

    assert looks == ["running", "done"]
    assert run["state"] == "done" and run["device_class"] == device_class.slug
    assert {(b["backend"], b["precision"]) for b in run["builds"]} >= {("onnxruntime", "fp32")}
    assert AutoRun.objects.get().model_version == version


def test_classes_and_jobs_read_the_hubs_lists(hub, schema, device_class, job):
    needs(schema, "jobs_list")

    assert [c["slug"] for c in hub.classes()] == [device_class.slug]
    assert [j["id"] for j in hub.jobs.list(kind=job.kind)] == [job.pk]


def signed_engine(tmp_path, content=b"an engine"):
    path = tmp_path / "engine.bin"
    path.write_bytes(content)
    sha256 = hashlib.sha256(content).hexdigest()
    return path, sha256, signing.sign(sha256)


def test_an_engine_file_is_kept_only_with_its_sha256_and_the_hubs_signature(db, tmp_path):
    path, sha256, signature = signed_engine(tmp_path)
    key = signing.public_key_hex()

    verify_file(path, sha256, signature, key)  # the hub's bytes: kept
    with pytest.raises(EngineRefused, match="sha256"):
        path.write_bytes(b"an engine, tampered")
        verify_file(path, sha256, signature, key)
    with pytest.raises(EngineRefused, match="signature does not verify"):
        forged = hashlib.sha256(b"another").hexdigest()
        path.write_bytes(b"another")
        verify_file(path, forged, signature, key)
    with pytest.raises(EngineRefused, match="No signing key"):
        verify_file(path, forged, signature, None)


def test_engines_download_keeps_the_hubs_engine_and_refuses_it_tampered(
    hub, schema, version, device_class, tmp_path
):
    needs(schema, "engine_file")
    from django.core.files.base import ContentFile
    from django.core.files.storage import default_storage

    content = b"engine bytes"
    engine = stored_engine(version, device_class)
    sha256 = hashlib.sha256(content).hexdigest()
    engine.file = default_storage.save(f"engines/{engine.pk}.onnx", ContentFile(content))
    engine.sha256, engine.signature, engine.size = sha256, signing.sign(sha256), len(content)
    engine.save()

    downloads = tmp_path / "downloads"
    downloads.mkdir()
    kept = hub.engines.download(engine.pk, downloads / "kept.onnx", for_this_machine=False)
    with default_storage.open(engine.file.name, "wb") as stored:
        stored.write(b"engine bytes, changed")
    # The hub checks the stored bytes before it serves them: it refuses, and marks the
    # engine corrupt (the client's own sha256 and signature check is the test above).
    with pytest.raises(HubError) as refused:
        hub.engines.download(engine.pk, downloads / "tampered.onnx", for_this_machine=False)

    assert refused.value.status == 409 and "corrupt" in refused.value.message
    assert kept.read_bytes() == content
    assert sorted(p.name for p in downloads.iterdir()) == ["kept.onnx"]
    engine.refresh_from_db()
    assert engine.status == "corrupt"


# The command line.


def deployhub(*args, hub=None, env=None):
    """Run `deployhub args` in-process against hub (its URL and token from the environment)."""
    given = {"DEPLOYHUB_URL": hub.url, "DEPLOYHUB_TOKEN": hub.token} if hub else {}
    return CliRunner().invoke(cli, [str(a) for a in args], env={**given, **(env or {})})


def test_login_stores_the_hub_in_a_file_only_its_user_reads(home, hub):
    done = deployhub("login", "--url", hub.url, "--token", hub.token)

    assert done.exit_code == 0, done.output
    path = home / "config" / "deployhub" / "client.json"
    assert json.loads(path.read_text()) == {"url": hub.url, "token": hub.token}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert Hub().url == hub.url  # a later command finds it


def test_login_with_a_token_the_hub_refuses_stores_nothing_and_exits_3(home, live_server, db):
    done = deployhub("login", "--url", live_server.url, "--token", "dhu_made-up")

    assert done.exit_code == 3
    assert not config.config_path().exists()


def test_the_environment_overrides_the_stored_login(home, monkeypatch):
    config.save("http://stored", "dhu_stored")
    monkeypatch.setenv("DEPLOYHUB_TOKEN", "dhu_env")

    assert config.resolve() == ("http://stored", "dhu_env")


def test_every_command_has_help_with_an_example():
    def commands(group, prefix):
        for name, command in group.commands.items():
            yield f"{prefix} {name}", command
            if hasattr(command, "commands"):
                yield from commands(command, f"{prefix} {name}")

    for line, command in commands(cli, "deployhub"):
        done = deployhub(*line.split()[1:], "--help")
        assert done.exit_code == 0 and "Example:" in done.output, line
        assert "--json" in done.output or hasattr(command, "commands"), line


def test_classes_prints_a_table_or_json(hub, device_class):
    table = deployhub("classes", hub=hub)
    as_json = deployhub("classes", "--json", hub=hub)

    assert table.exit_code == 0 and device_class.slug in table.output
    assert [c["slug"] for c in json.loads(as_json.output)] == [device_class.slug]


def test_models_upload_to_a_model_by_id(hub, version):
    done = deployhub(
        "models",
        "upload",
        ASSETS / "digits_cnn_v1.onnx",
        "--model",
        version.model_id,
        "--json",
        hub=hub,
    )

    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["number"] == 2 == version.model.versions.count()


def test_auto_without_waiting_answers_the_run(
    hub, version, device_class, validation, online_device
):
    done = deployhub(
        "auto",
        f"{version.model_id}:1",
        "--class",
        device_class.slug,
        "--no-wait",
        "--json",
        hub=hub,
    )

    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["id"] == AutoRun.objects.get().pk


def test_jobs_watch_exits_0_when_the_job_succeeded_and_1_when_it_failed(hub, job):
    Job.objects.filter(pk=job.pk).update(state="succeeded")
    succeeded = deployhub("jobs", "watch", job.pk, hub=hub)
    Job.objects.filter(pk=job.pk).update(state="failed", error="out of memory")
    failed = deployhub("jobs", "watch", job.pk, "--json", hub=hub)

    assert succeeded.exit_code == 0 and "succeeded" in succeeded.output
    assert failed.exit_code == 1 and json.loads(failed.output)["error"] == "out of memory"


def test_jobs_log_and_cancel(hub, schema, job):
    needs(schema, "job_log", "job_cancel")
    Job.objects.filter(pk=job.pk).update(log="line one\nline two\n")

    log = deployhub("jobs", "log", job.pk, hub=hub)
    cancelled = deployhub("jobs", "cancel", job.pk, "--json", hub=hub)
    again = deployhub("jobs", "cancel", job.pk, hub=hub)

    assert log.exit_code == 0 and log.output == "line one\nline two\n"
    assert cancelled.exit_code == 0 and json.loads(cancelled.output)["state"] == "cancelled"
    assert again.exit_code == 1  # 409: it has ended


def test_jobs_submit_queues_a_benchmark(hub, schema, version, device_class):
    needs(schema, "jobs_submit")

    done = deployhub(
        "jobs",
        "submit",
        "benchmark",
        "--version",
        version.model_id,
        "--class",
        device_class.slug,
        "--json",
        hub=hub,
    )

    assert done.exit_code == 0, done.output
    job = Job.objects.get(kind=JobKind.BENCHMARK)
    assert json.loads(done.output)["job"]["id"] == job.pk


def test_releases_propose_and_submit(hub, version, device_class):
    engine = stored_engine(version, device_class)

    proposed = deployhub("releases", "propose", engine.pk, "--note", "fast", "--json", hub=hub)
    release = json.loads(proposed.output)

    assert proposed.exit_code == 0, proposed.output
    assert release["state"] == "draft" and release["note"] == "fast"


def test_results_as_a_table_json_and_csv(hub, version):
    table = deployhub("results", version.model.name, hub=hub)
    as_json = deployhub("results", version.model_id, "--json", hub=hub)
    as_csv = deployhub("results", version.model_id, "--csv", hub=hub)

    assert table.exit_code == 0 and "digits-cnn" in table.output
    assert json.loads(as_json.output)["model"]["name"] == "digits-cnn"
    assert as_csv.exit_code == 0 and as_csv.output.startswith("id,")


def test_exit_codes_say_what_went_wrong(hub, live_server, version, device_class):
    missing = deployhub("jobs", "watch", 987654, "--json", hub=hub)
    refused = deployhub(
        "classes", env={"DEPLOYHUB_URL": live_server.url, "DEPLOYHUB_TOKEN": "dhu_made-up"}
    )
    wrong = deployhub("auto", version.model_id, "--class", "nope", hub=hub)
    usage = deployhub("auto", version.model_id, hub=hub)
    unreachable = deployhub(
        "classes", env={"DEPLOYHUB_URL": "http://127.0.0.1:9", "DEPLOYHUB_TOKEN": "dhu_x"}
    )

    assert (missing.exit_code, json.loads(missing.output)["status"]) == (4, 404)
    assert refused.exit_code == 3
    assert wrong.exit_code == 2 and "nope" in wrong.output
    assert usage.exit_code == 2 and "--class" in usage.output
    assert unreachable.exit_code == 5
    assert not AutoRun.objects.exists()


# The client installed as a pipeline installs it.


@pytest.mark.e2e
def test_the_hubs_wheel_installs_the_client_into_a_fresh_venv_without_django(
    settings, tmp_path, db
):
    settings.VAR_DIR = tmp_path / "var"
    settings.VAR_DIR.mkdir()
    wheel = tmp_path / f"deployhub-{worker_version()}-py3-none-any.whl"
    response = Client().get(f"/downloads/{wheel.name}")
    wheel.write_bytes(b"".join(response.streaming_content))
    with zipfile.ZipFile(wheel) as opened:
        assert "deployhub_client/cli.py" in opened.namelist()
    venv = tmp_path / "pipeline-venv"
    python = venv / "bin" / "python"
    run([run_python(), "-m", "venv", venv], cwd=tmp_path)
    links = _dependency_links(tmp_path / "dependencies")
    (site_packages(python) / "dependencies.pth").write_text(f"{links}\n")

    requirement = f"deployhub[client] @ {wheel.as_uri()}"
    run([python, "-m", "pip", "install", "--no-index", "--no-cache-dir", requirement], tmp_path)
    shown = run([venv / "bin" / "deployhub", "--help"], cwd=tmp_path)
    django = subprocess.run([python, "-c", "import django"], cwd=tmp_path, env=clean_env())

    assert "Commands:" in shown and "auto" in shown
    assert django.returncode != 0  # the client ran without Django there
