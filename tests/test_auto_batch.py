"""Auto mode measures at a batch the version's input-shape contract allows, and says so."""

import io

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.benchmarks.batches import BatchRefused, check_batch
from deployhub.engines import auto
from deployhub.engines.models import AutoBuild, AutoRun
from deployhub.registry.uploads import create_dataset
from tests.auto_builds import measured_build
from tests.conftest import PASSWORD, stored_engine
from tests.io_models import FLOAT, INT64, io_version

pytestmark = pytest.mark.django_db


def ranged(low, opt, high):
    """A contract for an image [N, 3, 4, 4] whose batch runs from low to high."""
    batch = {"min": low, "opt": opt, "max": high}
    return {"inputs": {"image": {"shape": ["batch", 3, 4, 4], "batch": batch, "dynamic": {}}}}


def image_version(team, user, batch="N", contract=None):
    return io_version(team, user, [("image", FLOAT, [batch, 3, 4, 4])], contract=contract)


def test_a_realtime_class_is_measured_at_batch_1_when_the_contract_allows_it(
    alice, demo_team, device_class
):
    version = image_version(demo_team, alice, contract=ranged(1, 8, 16))

    params = auto.benchmark_params(version, device_class)

    assert params["batch_size"] == 1 and "batch_note" not in params


def test_a_realtime_class_is_measured_at_the_batch_the_contract_fixes(
    alice, demo_team, device_class
):
    version = image_version(demo_team, alice, batch=2)

    params = auto.benchmark_params(version, device_class)

    assert params["scenario"] == "single-stream" and params["batch_size"] == 2
    assert params["batch_note"] == "measured at batch 2: the contract fixes it"
    check_batch(version, params["batch_size"])  # what the benchmark API accepts
    with pytest.raises(BatchRefused):
        check_batch(version, 1)


def test_a_realtime_class_takes_the_smallest_batch_of_a_range_without_1(
    alice, demo_team, device_class
):
    version = image_version(demo_team, alice, contract=ranged(4, 8, 16))

    realtime = auto.benchmark_params(version, device_class)
    device_class.serving_pattern = "batch"
    batch = auto.benchmark_params(version, device_class)

    assert realtime["batch_size"] == 4
    assert realtime["batch_note"] == "measured at batch 4: the contract allows 4 to 16"
    assert batch["batch_size"] == 8 and "batch_note" not in batch  # the batch class rule stays


def npz(**arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return SimpleUploadedFile("val.npz", buffer.getvalue())


def test_the_builds_row_says_why_it_was_measured_at_another_batch(
    client, alice, demo_team, device_class
):
    version = image_version(demo_team, alice, batch=2)
    samples = np.zeros((6, 3, 4, 4), np.float32)
    dataset = create_dataset(
        version, npz(inputs=samples, labels=np.arange(6)), alice, kind="validation", name="val"
    )
    run = AutoRun.objects.create(
        model_version=version, device_class=device_class, dataset=dataset, created_by=alice
    )
    engine = stored_engine(version, device_class)
    AutoBuild.objects.create(auto_run=run, backend="onnxruntime", precision="fp32", engine=engine)

    auto.advance(run)

    [build] = run.builds.all()
    assert build.benchmark_job.params["batch_size"] == 2
    client.login(username="alice", password=PASSWORD)
    page = client.get(f"/auto/{run.pk}/").content.decode()
    assert "measured at batch 2: the contract fixes it" in page


def test_per_image_figures_divide_the_latency_by_the_batch(alice, demo_team, device_class):
    version = image_version(demo_team, alice, batch=2)
    run = AutoRun.objects.create(model_version=version, device_class=device_class)
    measured = measured_build(run, "fp32", p50=6.0, p99=6.0, batch=2)

    assert auto.ms_per_image(measured) == pytest.approx(3.0)


def test_it_refuses_a_contract_that_allows_no_batch_every_input_takes(
    alice, demo_team, device_class
):
    inputs = [("image", FLOAT, [2, 3, 4, 4]), ("tokens", INT64, [3, 5])]
    version = io_version(demo_team, alice, inputs)

    with pytest.raises(auto.AutoRefused, match="allows no batch size that every input takes"):
        auto.start(version, device_class, alice)
    assert not AutoRun.objects.exists()
    with pytest.raises(BatchRefused, match="no batch size that every input takes"):
        check_batch(version, 2)
