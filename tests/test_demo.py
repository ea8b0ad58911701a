"""The demo data `make run` loads, and the assets it is made from."""

import json

import numpy as np
import onnx
from django.core.management import call_command

from deployhub.devices.models import Device, DeviceClass
from deployhub.parity.models import ParityRun
from deployhub.registry.models import Dataset, Model, ModelVersion
from deployhub.teams.models import Membership, Role
from tests.conftest import ASSETS


def counts():
    return (
        Model.objects.count(),
        ModelVersion.objects.count(),
        DeviceClass.objects.count(),
        Device.objects.count(),
        Membership.objects.count(),
        Dataset.objects.count(),
        ParityRun.objects.count(),
    )


def test_seed_demo_loads_the_cast_the_class_and_the_model(db):
    call_command("seed_demo")
    roles = {m.user.username: (m.team.slug, m.role) for m in Membership.objects.all()}
    assert roles == {
        "alice": ("demo", Role.ADMIN),
        "bob": ("demo", Role.REVIEWER),
        "charlie": ("acme", Role.ADMIN),
    }
    local = DeviceClass.objects.get(slug="local-cpu")
    assert local.queue == "dc.local-cpu" and local.team.slug == "demo"
    assert local.devices.filter(name="local-worker").exists()
    model = Model.objects.get(name="digits-cnn")
    assert [v.number for v in model.versions.order_by("number")] == [1, 2]
    assert model.versions.get(number=2).preprocessing["color_order"] == "RGB"
    datasets = {d.kind: d for d in model.datasets.all()}
    assert datasets["validation"].samples == 300 and datasets["validation"].has_labels
    assert datasets["calibration"].samples == 100
    parity = model.versions.get(number=2).parity_runs.get()
    assert parity.samples == 8 and parity.job.device_class == local


def test_seed_demo_is_idempotent(db):
    call_command("seed_demo")
    before = counts()
    call_command("seed_demo")
    assert counts() == before


def test_the_demo_assets_are_small_and_consistent():
    total = sum(p.stat().st_size for p in ASSETS.rglob("*") if p.is_file())
    assert total < 10 * 1024 * 1024
    manifest = json.loads((ASSETS / "manifest.json").read_text())
    for entry in manifest["versions"]:
        model = onnx.load(ASSETS / entry["file"])
        ops = {node.op_type for node in model.graph.node}
        assert {"Conv", "BatchNormalization", "Relu"} <= ops
    validation = np.load(ASSETS / "validation.npz", allow_pickle=False)
    assert validation["inputs"].shape[1:] == (3, 32, 32)
    assert len(validation["inputs"]) == len(validation["labels"])
    samples = np.load(ASSETS / "samples" / "tensors.npz", allow_pickle=False)
    assert all((ASSETS / "samples" / name).exists() for name in samples["names"])
