"""Release gates of an engine: parity, accuracy, golden pairs and performance, with reasons."""

import pytest

from deployhub.benchmarks.models import BenchmarkRun
from deployhub.core.gates import gates_open
from deployhub.devices.models import DeviceClass
from deployhub.engines.gates import release_gates
from deployhub.engines.models import Engine
from deployhub.evaluation.models import GoldenRun
from deployhub.jobs.models import JobKind
from deployhub.registry.models import GoldenSet
from tests.auto_builds import engine_of, job_of
from tests.benchmark_results import LATENCY, result
from tests.conftest import PASSWORD
from tests.gate_evidence import benchmarked, evaluated, passed_parity

pytestmark = pytest.mark.django_db


@pytest.fixture
def engine(version, device_class):
    device_class.frame_budget_ms = 20.0
    device_class.save()
    return engine_of(version, device_class, "fp32")


def statuses(engine):
    return {gate.name: gate.status for gate in release_gates(engine)}


def test_a_new_engine_has_every_gate_to_earn(engine):
    assert statuses(engine) == {
        "parity": "missing",
        "accuracy": "missing",
        "golden": "not-required",
        "performance": "missing",
    }
    assert not gates_open(release_gates(engine))


def test_an_engine_that_shows_everything_is_ready_to_propose(client, alice, engine):
    passed_parity(engine)
    evaluated(engine, agreement=0.999)
    benchmarked(engine, p99=15.0)

    assert gates_open(release_gates(engine))
    client.login(username="alice", password=PASSWORD)
    page = client.get(engine.get_absolute_url()).content.decode()
    assert "ready to propose" in page


def test_each_failure_closes_its_gate_with_the_reason(client, alice, engine):
    passed_parity(engine, passed=False)
    evaluated(engine, agreement=0.95)
    benchmarked(engine, p99=25.0)

    gates = {gate.name: gate for gate in release_gates(engine)}

    assert {name: gate.status for name, gate in gates.items() if name != "golden"} == {
        "parity": "failed",
        "accuracy": "failed",
        "performance": "failed",
    }
    assert "channels are swapped" in gates["parity"].reason
    assert "95.0%" in gates["accuracy"].reason
    assert "25" in gates["performance"].reason and "20" in gates["performance"].reason
    client.login(username="alice", password=PASSWORD)
    api = client.get(f"/api/v1/engines/{engine.pk}")
    assert api.status_code in (200, 401)  # the API answers personal tokens; the page says it too
    page = client.get(engine.get_absolute_url()).content.decode()
    assert "not ready" in page and "channels are swapped" in page


def test_golden_pairs_must_all_be_checked_and_reproduced(engine):
    version = engine.model_version
    golden = GoldenSet.objects.create(
        model_version=version, name="reference", file="golden/x.npz", sha256="0" * 64,
        size=1, format="npz", pairs=1, atol=1e-4, rtol=1e-3,
    )  # fmt: skip
    assert statuses(engine)["golden"] == "missing"

    GoldenRun.objects.create(
        job=job_of(version, engine.device_class, JobKind.EVALUATE, engine), engine=engine,
        golden_set=golden, passed=False, pairs=1, atol=1e-4, rtol=1e-3,
        outputs=[{"name": "logits", "passed": False}],
    )  # fmt: skip
    [gate] = [g for g in release_gates(engine) if g.name == "golden"]

    assert gate.status == "failed" and "logits" in gate.reason


def test_the_version_page_counts_each_engines_open_gates(client, alice, engine):
    client.login(username="alice", password=PASSWORD)
    before = client.get(engine.model_version.get_absolute_url()).content.decode()
    passed_parity(engine)
    evaluated(engine, agreement=0.999)
    benchmarked(engine, p99=15.0)

    after = client.get(engine.model_version.get_absolute_url()).content.decode()

    assert "1/4 gates" in before  # golden pairs: not required
    assert "4/4 gates" in after and "parity: passed." in after


def test_a_page_of_engines_loads_only_the_runs_its_gates_read_and_judges_the_same(
    engine, device_class
):
    other = DeviceClass.objects.create(team=device_class.team, slug="other", name="Other")
    evaluated(engine, agreement=0.5)  # fails; the newer one passes
    evaluated(engine, agreement=0.999)
    benchmarked(engine, p99=15.0)  # meets the 20 ms budget; the newer one misses it
    benchmarked(engine, p99=500.0)
    version = engine.model_version
    for p99 in (15.0, 16.0):  # on a class that trusts the engine's: not its gate
        job = job_of(version, other, JobKind.BENCHMARK, engine)
        BenchmarkRun.record(job, result(latency_ms={**LATENCY, "p50": p99 / 2, "p99": p99}))
    golden = GoldenSet.objects.create(
        model_version=version, name="cats", file="golden/cats.npz", sha256="1" * 64,
        size=1, format="npz", pairs=1, atol=1e-4, rtol=1e-3,
    )  # fmt: skip
    for passed in (False, True):
        GoldenRun.objects.create(
            job=job_of(version, device_class, JobKind.EVALUATE, engine), engine=engine,
            golden_set=golden, passed=passed, pairs=1, atol=1e-4, rtol=1e-3,
            outputs=[{"name": "logits", "passed": passed}],
        )  # fmt: skip

    [loaded] = Engine.objects.filter(pk=engine.pk).with_gate_runs()

    assert release_gates(loaded) == release_gates(Engine.objects.get(pk=engine.pk))
    assert statuses(loaded) == {
        "parity": "missing",
        "accuracy": "passed",
        "golden": "passed",
        "performance": "failed",
    }
    assert len(loaded.newest_accuracy) == 1 and len(loaded.newest_golden_runs) == 1
    assert sorted(
        (run.device_class.slug, run.latency_p99_ms) for run in loaded.newest_benchmarks
    ) == [
        (device_class.slug, 500.0),
        ("other", 16.0),
    ]
