"""A model's results JSON is kept between reads while nothing in it changes, and every change
a user can make to what it shows is in the next read (benchmarks/exports.py)."""

import json

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from deployhub.benchmarks.exports import model_results
from deployhub.benchmarks.models import BenchmarkRun
from deployhub.devices.models import Device
from deployhub.evaluation.models import AccuracyRun
from deployhub.registry.models import Dataset, Model
from tests.api_calls import token_for
from tests.conftest import PASSWORD
from tests.figure_results import seed_classes, seed_engines, seed_runs

pytestmark = pytest.mark.django_db


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


def add_run(model):
    engine = model.versions.get().engines.order_by("pk").first()
    seed_runs([engine], 1, 0, seed=99)


def delete_newest_run(model):
    BenchmarkRun.objects.filter(model_version__model=model).order_by("-pk").first().delete()


def replace_newest_run(model):
    """SQLite gives a deleted newest row's id to the next one: the key must still change."""
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
