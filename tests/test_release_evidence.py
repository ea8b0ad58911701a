"""The evidence pack of a release: each item from its stored run, kept on review, refreshed."""

import copy
import json

import pytest

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.devices.models import ServingPattern
from deployhub.engines.actions import key_for
from deployhub.engines.models import EngineStatus
from deployhub.jobs.models import Job, JobKind
from deployhub.releases import actions, evidence
from deployhub.releases.models import Release
from deployhub.teams.models import Role
from tests.api_calls import call, token_for
from tests.auto_builds import engine_of, job_of
from tests.benchmark_results import result
from tests.compile_jobs import FINGERPRINT
from tests.conftest import PASSWORD, make_user, stored_engine
from tests.gate_evidence import benchmarked, evaluated, passed_parity, ready_engine

pytestmark = pytest.mark.django_db


@pytest.fixture
def erin(demo_team):
    """Erin builds: engineer in the demo team."""
    return make_user("erin", demo_team, Role.ENGINEER)


@pytest.fixture
def online(make_device, client):
    """Return a function that brings a device of the class online with a fingerprint."""

    def bring(name, fingerprint=FINGERPRINT):
        device, token = make_device(name)
        call(client, token, "device/heartbeat", {"fingerprint": fingerprint})
        device.refresh_from_db()
        return device

    return bring


def built_for(engine, fingerprint=FINGERPRINT):
    """Make the engine's compatibility key the one a device with this fingerprint has."""
    engine.compat_key, engine.compat_fields = key_for(
        engine.backend, engine.build_config, fingerprint
    )
    engine.save()
    return engine


def other_ort(version="1.31.0"):
    changed = copy.deepcopy(FINGERPRINT)
    changed["onnxruntime"]["version"] = version
    return changed


def submitted(engine, author):
    return actions.submit(actions.propose(engine, author, "candidate"), author)


def by_key(pack, section):
    return {entry["key"]: entry for entry in pack[section]}


def test_it_keeps_the_evidence_when_the_release_enters_review(version, device_class, erin):
    release = actions.propose(ready_engine(version, device_class), erin)
    assert release.evidence == {} and release.evidence_at is None

    submitted_release = actions.submit(release, erin)

    release = Release.objects.get(pk=submitted_release.pk)
    assert release.evidence_at is not None
    pack = release.evidence
    assert json.loads(json.dumps(pack)) == pack
    gates = by_key(pack, "gates")
    assert [gate["status"] for gate in gates.values()] == [
        "passed",
        "passed",
        "not-required",
        "passed",
    ]
    assert gates["gate:performance"]["link"].startswith("/jobs/")


def test_it_says_a_failing_or_missing_gate_with_its_run(version, device_class, erin):
    engine = engine_of(version, device_class, "fp32")
    passed_parity(engine, passed=False)
    evaluated(engine, agreement=0.5)

    gates = by_key(evidence.collect(actions.propose(engine, erin)), "gates")

    assert gates["gate:parity"]["status"] == "failed"
    assert gates["gate:accuracy"]["status"] == "failed"
    assert gates["gate:accuracy"]["link"] == engine.accuracy.get().job.get_absolute_url()
    assert gates["gate:performance"]["status"] == "missing"
    assert gates["gate:performance"]["link"] == engine.get_absolute_url()


def test_it_checks_every_online_device_of_the_class(version, device_class, erin, online):
    engine = built_for(ready_engine(version, device_class))
    same = online("same")
    older = online("older", other_ort())
    release = actions.propose(engine, erin)

    pack = evidence.collect(release)

    devices = by_key(pack, "devices")
    assert devices[f"device:{same.pk}"]["status"] == "passed"
    behind = devices[f"device:{older.pk}"]
    assert behind["status"] == "failed" and "1.32.0 ≠ 1.31.0" in behind["sentence"]
    assert behind["details"]["differences"] == {"onnxruntime": ["1.32.0", "1.31.0"]}
    assert behind["details"]["rebuild"] is None and behind["details"]["queued_job"] is None
    assert "No compatible rebuild" in behind["sentence"]
    assert pack["compatibility"]["status"] == "failed"
    assert behind["link"] == f"/devices/{older.pk}/"


def test_it_finds_a_rebuild_that_exists_or_is_queued(version, device_class, erin, online):
    engine = built_for(ready_engine(version, device_class))
    older = online("older", other_ort())
    release = actions.propose(engine, erin)
    queued = Job.objects.create(
        team=version.team,
        kind=JobKind.COMPILE,
        device_class=device_class,
        model_version=version,
        state="queued",
        params={"backend": engine.backend, "build_config": engine.build_config},
    )

    behind = by_key(evidence.collect(release), "devices")[f"device:{older.pk}"]
    assert (
        behind["details"]["queued_job"] == queued.pk and "A rebuild is queued" in behind["sentence"]
    )

    rebuild = stored_engine(version, device_class, engine.build_config, digest=engine.config_digest)
    built_for(rebuild, other_ort())
    behind = by_key(evidence.collect(release), "devices")[f"device:{older.pk}"]
    assert behind["details"]["rebuild"] == rebuild.pk
    assert behind["details"]["rebuild_link"] == rebuild.get_absolute_url()


def test_with_no_device_online_compatibility_is_missing(version, device_class, erin):
    pack = evidence.collect(actions.propose(ready_engine(version, device_class), erin))

    assert pack["devices"] == [] and pack["compatibility"]["status"] == "missing"


def test_it_holds_peak_memory_against_the_class_limit(version, device_class, erin):
    release = actions.propose(ready_engine(version, device_class), erin)
    assert evidence.collect(release)["memory"]["status"] == "not-required"

    device_class.memory_limit_mb = 100
    device_class.save()
    memory = evidence.collect(release)["memory"]
    assert memory["status"] == "passed" and memory["details"] == {"peak_mb": 80.0, "limit_mb": 100}

    device_class.memory_limit_mb = 50
    device_class.save()
    memory = evidence.collect(release)["memory"]
    assert memory["status"] == "failed" and "over the class's limit of 50 MB" in memory["sentence"]


def test_it_wants_a_stable_benchmark(version, device_class, erin):
    engine = ready_engine(version, device_class)
    release = actions.propose(engine, erin)
    assert evidence.collect(release)["stability"]["status"] == "passed"

    unstable = result(stability={"stable": False, "reasons": ["CV 30.0% is above 10%"]})
    BenchmarkRun.record(job_of(version, device_class, JobKind.BENCHMARK, engine), unstable)
    stability = evidence.collect(release)["stability"]
    assert stability["status"] == "failed" and "CV 30.0% is above 10%" in stability["sentence"]

    fresh = engine_of(version, device_class, "int8")
    assert evidence.collect(actions.propose(fresh, erin))["stability"]["status"] == "missing"


def test_without_production_there_is_nothing_to_compare(version, device_class, erin):
    pack = evidence.collect(actions.propose(ready_engine(version, device_class), erin))

    assert pack["production"]["status"] == "not-required"
    assert "details" not in pack["production"]


def test_it_compares_the_candidate_with_production(version, device_class, erin, bob):
    first = ready_engine(version, device_class)
    first.tool_versions = {"onnxruntime": "1.31.0"}
    first.save()
    production = submitted(first, erin)
    actions.review(production, bob, "approve")
    actions.promote(production, bob)
    second = engine_of(version, device_class, "int8")
    second.tool_versions = {"onnxruntime": "1.32.0"}
    second.save()
    passed_parity(second)
    evaluated(second, agreement=0.99)
    benchmarked(second, p99=12.0)

    candidate = submitted(second, erin)

    compared = candidate.evidence["production"]
    assert compared["status"] == "passed" and compared["link"] == production.get_absolute_url()
    deltas = compared["details"]["deltas"]
    assert deltas["p99_ms"] == {"candidate": 12.0, "production": 15.0, "delta": -3.0}
    assert deltas["peak_memory_mb"]["delta"] == 0
    assert deltas["accuracy"]["metric"] == "top1_agreement"
    assert deltas["accuracy"]["delta"] == pytest.approx(-0.9)
    assert compared["details"]["toolchain"] == {"onnxruntime": ["1.31.0", "1.32.0"]}
    assert "p99 -3.00 ms" in compared["sentence"] and "1.31.0 ≠ 1.32.0" in compared["sentence"]

    actions.review(candidate, bob, "approve")
    actions.promote(candidate, bob)
    refreshed = actions.refresh_evidence(candidate, erin).evidence["production"]
    assert refreshed["details"]["release"] == production.pk  # the one it replaced


def test_the_comparison_uses_top1_when_both_have_labels(version, device_class, erin, bob):
    production = submitted(ready_engine(version, device_class), erin)
    actions.review(production, bob, "approve")
    actions.promote(production, bob)
    second = ready_engine(version, device_class, "int8")
    for engine, top1 in ((production.engine, 0.91), (second, 0.90)):
        engine.accuracy.update(top1=top1, reference_top1=0.91)

    accuracy = evidence.comparison_item(actions.propose(second, erin))["details"]["deltas"]
    assert accuracy["accuracy"]["metric"] == "top1"
    assert accuracy["accuracy"]["delta"] == pytest.approx(-1.0)


def test_a_missing_run_leaves_the_comparison_incomplete(version, device_class, erin, bob):
    production = submitted(ready_engine(version, device_class), erin)
    actions.review(production, bob, "approve")
    actions.promote(production, bob)

    compared = evidence.comparison_item(
        actions.propose(engine_of(version, device_class, "int8"), erin)
    )

    assert compared["status"] == "missing" and "p99 unmeasured" in compared["sentence"]


def test_the_checklist_is_in_order_and_ticked_from_its_evidence(
    version, device_class, erin, bob, online
):
    online("a")
    release = submitted(built_for(ready_engine(version, device_class)), erin)

    steps = release.evidence["checklist"]
    assert [step["key"] for step in steps] == [
        "step:budget",
        "step:preflight",
        "step:parity",
        "step:build",
        "step:on-target",
        "step:reviews",
    ]
    assert [step["status"] for step in steps] == ["passed"] * 5 + ["missing"]

    actions.review(release, bob, "approve")
    release.refresh_from_db()
    assert release.evidence["checklist"][-1]["status"] == "passed"


def test_a_checklist_step_fails_when_its_evidence_does(version, device_class, erin, online):
    online("no-ort", {**FINGERPRINT, "onnxruntime": None})
    engine = ready_engine(version, device_class)
    device_class.serving_pattern, device_class.throughput_target_ips = ServingPattern.BATCH, None
    device_class.memory_limit_mb = 10
    device_class.save()
    engine.status = EngineStatus.STALE
    engine.save()

    release = Release.objects.create(
        engine=engine, model=version.model, device_class=device_class, created_by=erin
    )
    steps = {step["key"]: step for step in evidence.collect(release)["checklist"]}

    assert steps["step:budget"]["status"] == "failed"
    assert steps["step:preflight"]["status"] == "failed"
    assert "onnxruntime" in steps["step:preflight"]["sentence"]
    assert steps["step:build"]["status"] == "failed"
    assert steps["step:on-target"]["status"] == "failed"


def test_preflight_is_missing_before_any_device_reports(version, device_class, erin):
    steps = evidence.collect(actions.propose(ready_engine(version, device_class), erin))
    assert steps["checklist"][1]["status"] == "missing"


def test_the_page_shows_the_checklist_then_each_item(client, version, device_class, erin):
    release = submitted(ready_engine(version, device_class), erin)
    client.login(username="erin", password=PASSWORD)

    page = client.get(release.get_absolute_url()).content.decode()

    assert 'id="evidence"' in page and "computed at" in page and 'id="refresh-evidence"' in page
    checklist = page.index('id="evidence-checklist"')
    assert checklist < page.index('data-evidence="gate:parity"')
    assert 'data-step="step:reviews" data-status="missing"' in page
    assert 'data-evidence="memory" data-status="not-required"' in page
    assert page.index('data-evidence="stability"') < page.index('data-evidence="production"')


def test_refresh_recomputes_the_evidence(client, version, device_class, erin, vera):
    release = submitted(ready_engine(version, device_class), erin)
    before = release.evidence_at
    device_class.memory_limit_mb = 50
    device_class.save()

    client.login(username="vera", password=PASSWORD)
    assert client.post(f"/releases/{release.pk}/evidence").status_code == 403
    client.login(username="erin", password=PASSWORD)
    response = client.post(f"/releases/{release.pk}/evidence")

    assert response["Location"] == release.get_absolute_url()
    release.refresh_from_db()
    assert release.evidence_at > before and release.evidence["memory"]["status"] == "failed"


def test_the_api_returns_the_evidence_and_refreshes_it(client, version, device_class, erin, vera):
    release = submitted(ready_engine(version, device_class), erin)

    answer = client.get(f"/api/v1/releases/{release.pk}", **token_for(erin)).json()
    assert answer["evidence"]["checklist"][0]["key"] == "step:budget"
    assert answer["evidence_at"] == release.evidence_at.isoformat()

    device_class.memory_limit_mb = 50
    device_class.save()
    refused = refresh_by_api(client, vera, release)
    assert refused.status_code == 403
    refreshed = refresh_by_api(client, erin, release)
    assert refreshed.status_code == 200
    assert json.loads(refreshed.content)["evidence"]["memory"]["status"] == "failed"


def refresh_by_api(client, user, release):
    """POST /api/v1/releases/<id>/evidence, as a token's holder."""
    return client.post(
        f"/api/v1/releases/{release.pk}/evidence",
        "{}",
        content_type="application/json",
        **token_for(user),
    )
