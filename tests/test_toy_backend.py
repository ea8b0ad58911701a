"""A backend written in one file (tests/toy_backend.py) and registered shows up everywhere."""

import pytest
from django.core.files import File

from deployhub.engines import auto
from deployhub.engines.forms import CompileForm
from deployhub.engines.preflight import preflight_grid
from deployhub.registry.uploads import create_dataset
from tests.conftest import ASSETS
from tests.toy_backend import ToyBackend
from workers import fingerprint, selftest
from workers.backends.known import BACKENDS


@pytest.fixture
def toy(monkeypatch):
    """Register the toy backend for one test, as known.py registers the others."""
    monkeypatch.setitem(BACKENDS, ToyBackend.name, ToyBackend)
    monkeypatch.setattr(fingerprint, "_capabilities_in_child", lambda: {})
    return ToyBackend


def test_its_fingerprint_reports_the_toys_runtime(toy):
    assert fingerprint.collect()["numpy"]["version"]


def test_preflight_and_auto_mode_take_its_builds(toy, version, device_class, make_device, alice):
    device, _ = make_device()
    device.fingerprint = fingerprint.collect()
    device.save()
    with open(ASSETS / "validation.npz", "rb") as handle:
        dataset = File(handle, name="validation.npz")
        create_dataset(version, dataset, alice, kind="validation", name="validation")

    rows = {(b, p): verdict for b, p, verdict in preflight_grid(version, device_class)}
    run = auto.start(version, device_class, alice)

    assert rows[("toy", "fp32")].verdict == "ok", rows[("toy", "fp32")].fails
    [build] = run.builds.filter(backend="toy")
    assert build.precision == "fp32" and build.build_config == {"scale": 1.0}


def test_the_compile_form_offers_it_with_its_default_config(toy, demo_team):
    form = CompileForm(team=demo_team)

    assert ("toy", "toy") in form.fields["backend"].choices
    assert '"toy": {"scale": 1.0}' in form.fields["backend"].widget.attrs["data-defaults"]


def test_selftest_builds_loads_and_runs_it(toy):
    document = selftest.run(selftest.backends_named(["toy"]), fingerprint={})

    assert document["backends"]["toy"]["ok"], document["backends"]["toy"]
