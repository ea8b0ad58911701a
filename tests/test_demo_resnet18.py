"""The ResNet-18 sample: one click adds a ResNet-18-shaped model that says it is random."""

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from django.core.management import call_command
from django.core.management.base import CommandError

from deployhub.demo import resnet18
from deployhub.demo.samples import RESNET18_NAME
from deployhub.registry.models import Model
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return resnet18.write_resnet18_onnx(tmp_path_factory.mktemp("resnet18") / "resnet18.onnx")


def test_it_has_resnet18s_shape_and_keeps_batchnorm_for_the_compiler(model_file):
    model = onnx.load(str(model_file))
    ops = [node.op_type for node in model.graph.node]
    weights = sum(int(np.prod(t.dims)) for t in model.graph.initializer if "running" not in t.name)

    assert ops.count("Conv") == 20 and ops.count("BatchNormalization") == 20
    assert ops.count("Add") == 8  # one residual connection per BasicBlock
    assert 11_600_000 < weights < 11_750_000  # torchvision's resnet18: 11.69 M parameters
    assert "random weights" in model.doc_string


def test_onnx_runtime_and_pytorch_eager_compute_the_same_logits(model_file):
    from scripts.make_resnet18 import eager_model

    images = resnet18.random_images(2, 7)
    session = onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    ours = session.run(None, {"image": images})[0]
    with torch.no_grad():
        eager = eager_model(resnet18.resnet18_weights()).eval()(torch.from_numpy(images)).numpy()

    assert ours.shape == (2, 1000)
    assert np.abs(ours - eager).max() < 1e-3 * max(1.0, np.abs(eager).max())


def test_batchnorm_statistics_keep_activations_at_a_sane_scale(model_file):
    session = onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"image": resnet18.random_images(4, 11)})[0]

    assert np.isfinite(logits).all()
    assert 0.05 < logits.std() < 20


def test_its_head_is_decisive_on_its_labelled_samples_as_a_trained_model_is(model_file):
    images, labels = resnet18.labelled_samples(per_class=3)
    session = onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"image": images})[0]
    ranked = np.sort(logits, axis=1)

    assert (logits.argmax(axis=1) == labels).all()
    assert len(set(labels.tolist())) == resnet18.PROTOTYPES
    # The winner leads by far more than rounding moves a logit: INT8 keeps the same top-1.
    assert np.median((ranked[:, -1] - ranked[:, -2]) / logits.std(axis=1)) > 3


def test_an_engineer_adds_the_sample_in_one_click(client, alice):
    client.login(username="alice", password=PASSWORD)

    answer = client.post("/models/samples/resnet18", follow=True)

    model = Model.objects.get(name=RESNET18_NAME)
    version = model.latest_version()
    assert answer.redirect_chain[-1][0] == model.get_absolute_url()
    assert version.inputs[0]["shape"] == ["N", 3, 224, 224]
    datasets = {d.kind: d for d in model.datasets.all()}
    assert datasets["validation"].has_labels and datasets["validation"].samples == 100
    assert datasets["calibration"].samples == 100
    page = client.get(version.get_absolute_url()).content.decode()
    assert "RANDOM WEIGHTS" in page and "for latency only" in page


def test_a_second_click_says_the_team_has_it_and_adds_nothing(client, alice):
    client.login(username="alice", password=PASSWORD)
    client.post("/models/samples/resnet18")

    answer = client.post("/models/samples/resnet18", follow=True)

    assert "has the resnet18-random sample already" in answer.content.decode()
    assert Model.objects.filter(name=RESNET18_NAME).count() == 1


def test_a_viewer_cannot_add_it(client, vera):
    client.login(username="vera", password=PASSWORD)

    assert client.post("/models/samples/resnet18").status_code == 403
    assert not Model.objects.filter(name=RESNET18_NAME).exists()


def test_the_command_adds_it_and_names_a_missing_team(alice):
    call_command(
        "add_sample", "resnet18", "--team", alice.memberships.first().team.slug, "--user", "alice"
    )
    assert Model.objects.filter(name=RESNET18_NAME).exists()
    with pytest.raises(CommandError, match="no team 'nope'"):
        call_command("add_sample", "resnet18", "--team", "nope", "--user", "alice")
