"""A model's results JSON is kept between reads while nothing in it changes, and every change
a user can make to what it shows is in the next read (benchmarks/exports.py)."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from deployhub.benchmarks.exports import model_results, model_results_body
from deployhub.benchmarks.models import BenchmarkRun
from deployhub.devices.models import Device
from deployhub.evaluation.models import AccuracyRun
from deployhub.registry.models import Dataset, Model
from deployhub.teams.models import Team
from tests.api_calls import token_for
from tests.conftest import PASSWORD
from tests.figure_results import seed_classes, seed_engines, seed_runs

pytestmark = pytest.mark.django_db
User = get_user_model()


@pytest.fixture
def model(demo_team, alice):
    model = Model.objects.create(team=demo_team, name="kept", created_by=alice)
    version = model.versions.create(number=1, file="models/1.onnx", sha256="1" * 64, size=1)
    seed_runs(seed_engines([version], seed_classes(demo_team, prefix="kept")), 60, 12)
    return model


@pytest.fixture
def signed_in(client, alice):
    client.login(username="alice", password=PASSWORD)
    return client


def served(client, model):
    """The results JSON as a browser gets it, and the SQL its request ran."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(f"/models/{model.pk}/results.json")
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"] == "application/json"
    return json.loads(response.content), [query["sql"] for query in queries]


def built(model):
    """The results JSON made now from the database, without the cache."""
    return json.loads(json.dumps(model_results(Model.objects.get(pk=model.pk)), default=str))


def test_an_unchanged_models_results_are_read_once_and_the_api_gives_the_same(
    signed_in, model, alice
):
    first, first_sql = served(signed_in, model)
    second, second_sql = served(signed_in, model)

    assert second == first == built(model)
    assert len(first["benchmarks"]) == 60 and len(first["accuracy"]) == 12
    assert any("latency_p50_ms" in sql for sql in first_sql)  # built: every run read
    assert not any("latency_p50_ms" in sql for sql in second_sql)  # kept: no run read
    api = Client().get(f"/api/v1/models/{model.pk}/results", **token_for(alice))
    assert api.status_code == 200 and json.loads(api.content) == first
    assert api["Content-Type"] == "application/json"


def add_run(model):
    engine = model.versions.get().engines.order_by("pk").first()
    seed_runs([engine], 1, 0, seed=99)


def delete_newest_run(model):
    BenchmarkRun.objects.filter(model_version__model=model).order_by("-pk").first().delete()


def replace_newest_run(model):
    """A run deleted and another added: as many runs as before."""
    delete_newest_run(model)
    add_run(model)


def tighten_a_budget(model):
    device_class = model.versions.get().engines.order_by("pk").first().device_class
    device_class.frame_budget_ms = 0.5  # every run of the class now misses it
    device_class.save()


def rename_a_runs_device(model):
    run = BenchmarkRun.objects.filter(model_version__model=model).order_by("pk").first()
    device = Device(device_class=run.device_class, name="bench-box")
    device.issue_token()
    device.save()
    BenchmarkRun.objects.filter(pk=run.pk).update(device=device)  # as the run was stored
    return device


def rename_a_dataset(model):
    dataset = Dataset.objects.create(
        model=model, kind="validation", name="val-a", file="d.npz", size=1, samples=1
    )
    AccuracyRun.objects.filter(engine__model_version__model=model).update(dataset=dataset)
    return dataset


def rename_the_model(model):
    model.name = "kept-renamed"
    model.save()


def change_an_engines_precision(model):
    engine = model.versions.get().engines.order_by("pk").first()
    engine.build_config = {"precision": "fp16"}
    engine.save()


CHANGES = [
    add_run,
    delete_newest_run,
    replace_newest_run,
    tighten_a_budget,
    rename_the_model,
    change_an_engines_precision,
]


@pytest.mark.parametrize("change", CHANGES, ids=lambda change: change.__name__)
def test_a_change_to_what_the_results_show_is_in_the_next_read(signed_in, model, change):
    before, _ = served(signed_in, model)

    change(model)
    after, _ = served(signed_in, model)

    assert after == built(model)
    assert after != before


@pytest.mark.parametrize(
    "rename, attribute",
    [(rename_a_runs_device, "device"), (rename_a_dataset, "dataset")],
    ids=["device", "dataset"],
)
def test_renaming_a_device_or_a_dataset_is_in_the_next_read(signed_in, model, rename, attribute):
    named = rename(model)
    before, _ = served(signed_in, model)
    assert named.name in json.dumps(before)

    named.name = f"{named.name}-renamed"
    named.save()
    after, _ = served(signed_in, model)

    assert after == built(model)
    assert f"{named.name}" in json.dumps(after) and after != before


def test_a_budget_edit_is_in_the_next_read_after_the_model_moved_to_another_team(model):
    """The classes a model's runs were measured on, not its team's, decide their gates."""
    model.team = Team.objects.create(name="Elsewhere", slug="elsewhere")
    model.save()
    cached = kept(model)

    tighten_a_budget(model)
    after = kept(model)

    assert after == built(model) != cached


def kept(model):
    """The results JSON as its views serve it (for a model no signed-in user's team holds)."""
    return json.loads(model_results_body(Model.objects.get(pk=model.pk)))


def test_a_body_built_while_a_change_commits_is_not_kept_for_the_key_read_before_it(
    signed_in, model, monkeypatch
):
    """Kept under the key read before the change, it would come back once the change is
    undone, and the key with it."""
    from deployhub.benchmarks import exports

    device_class = model.versions.get().engines.order_by("pk").first().device_class
    budget = device_class.frame_budget_ms
    build = exports.model_results

    def built_while_a_budget_changes(model):
        tighten_a_budget(model)
        return build(model)

    monkeypatch.setattr(exports, "model_results", built_while_a_budget_changes)
    served(signed_in, model)
    monkeypatch.setattr(exports, "model_results", build)
    device_class.refresh_from_db()
    device_class.frame_budget_ms = budget  # undone: the key is the first read's again
    device_class.save()

    again, _ = served(signed_in, model)

    assert again == built(model)


def test_staff_cannot_edit_or_make_up_a_run_in_the_admin(client, model):
    """Runs are evidence; the results JSON is kept while they are only added and deleted."""
    staff = User.objects.create_superuser("root", "root@example.com", PASSWORD)
    client.force_login(staff)
    run = BenchmarkRun.objects.filter(model_version__model=model).first()
    change = f"/admin/benchmarks/benchmarkrun/{run.pk}/change/"

    assert client.get(change).status_code == 200  # it can be read
    client.post(change, {"latency_p99_ms": "0.001", "stable": "on"})
    assert client.get("/admin/benchmarks/benchmarkrun/add/").status_code == 403

    run.refresh_from_db()
    assert run.latency_p99_ms != 0.001
