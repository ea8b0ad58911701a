"""Versions are immutable; a new spec or contract is a new version, with lineage and a diff."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.registry.models import ModelVersion
from tests.conftest import ASSETS, PASSWORD
from tests.parity_packs import SPEC


def test_a_stored_version_cannot_change_except_notes_and_tags(version):
    version.notes, version.tags = "reviewed", ["candidate"]
    version.save()
    version.opset = 11
    with pytest.raises(ValueError, match="immutable: opset"):
        version.save()
    assert ModelVersion.objects.get(pk=version.pk).opset == 17


def test_it_edits_notes_and_tags_from_the_page(client, alice, version):
    client.login(username="alice", password=PASSWORD)
    client.post(
        f"/versions/{version.pk}/notes", {"notes": "good on CPU", "tags": "prod, cpu, prod"}
    )
    version.refresh_from_db()
    assert version.notes == "good on CPU" and version.tags == ["cpu", "prod"]


def test_a_new_spec_makes_a_child_version_of_the_same_file(client, alice, version):
    client.login(username="alice", password=PASSWORD)
    spec = {**SPEC, "color_order": "BGR"}
    response = client.post(
        f"/versions/{version.pk}/derive",
        {
            "preprocessing": __import__("json").dumps(spec),
            "contract": "",
            "notes": "the camera gives BGR",
        },
    )
    child = ModelVersion.objects.get(number=2)
    assert response["Location"] == child.get_absolute_url()
    assert child.parent == version and child.sha256 == version.sha256
    assert child.file.name == version.file.name and child.preprocessing["color_order"] == "BGR"
    page = client.get(child.get_absolute_url()).content.decode()
    assert "preprocessing color_order" in page and "BGR" in page  # the diff against v1
    assert f'href="{version.get_absolute_url()}"' in page  # lineage


def test_it_refuses_a_derived_version_that_changes_nothing(client, alice, version):
    client.login(username="alice", password=PASSWORD)
    response = client.post(f"/versions/{version.pk}/derive", {"preprocessing": "", "contract": ""})
    assert response.status_code == 400
    assert "Nothing changed" in response.content.decode()
    assert ModelVersion.objects.count() == 1


def test_the_version_page_shows_validation_contract_and_spec_code(
    client, alice, model_file, demo_team
):
    from deployhub.registry.models import Model
    from deployhub.registry.uploads import create_version

    model = Model.objects.create(team=demo_team, name="m")
    with open(model_file, "rb") as handle:
        version = create_version(
            model, SimpleUploadedFile("m.onnx", handle.read()), alice, preprocessing=SPEC
        )
    client.login(username="alice", password=PASSWORD)
    page = client.get(version.get_absolute_url()).content.decode()
    assert "onnx.checker" in page and "BatchNormalization" in page
    assert f"{version.graph['parameters']} parameters" in page
    assert "def preprocess(" in page and "0.485" in page
    assert 'id="contract"' in page and "[batch, 3, 32, 32]" in page


def test_the_diff_lists_operator_and_parameter_changes(client, alice, version):
    client.login(username="alice", password=PASSWORD)
    narrow = SimpleUploadedFile("v1.onnx", (ASSETS / "digits_cnn_v1.onnx").read_bytes())
    client.post(f"/models/{version.model.pk}/", {"file": narrow, "notes": "narrow"})
    new = ModelVersion.objects.get(number=2)
    page = client.get(new.get_absolute_url()).content.decode()
    assert "parameters" in page and str(version.graph["parameters"]) in page
    assert str(new.graph["parameters"]) in page


def test_a_model_with_open_height_and_width_needs_a_contract_and_is_warned_about(
    alice, demo_team, tmp_path
):
    import json

    from onnx import TensorProto, helper

    from deployhub.registry.inspect import InvalidModel
    from deployhub.registry.models import Model
    from deployhub.registry.uploads import create_version

    shape = ["N", 3, "H", "W"]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    model = Model.objects.create(team=demo_team, name="dynamic")
    with pytest.raises(InvalidModel, match="upload it with an input-shape contract"):
        create_version(model, SimpleUploadedFile("d.onnx", data), alice)
    ranges = {"min": 64, "opt": 224, "max": 512}
    contract = {
        "inputs": {
            "x": {
                "shape": ["batch", 3, "H", "W"],
                "batch": {"sizes": [1, 8]},
                "dynamic": {"2": ranges, "3": ranges},
            }
        }
    }
    version = create_version(
        model, SimpleUploadedFile("d.onnx", data), alice, contract=json.loads(json.dumps(contract))
    )
    assert any("dynamic height/width" in w for w in version.warnings)
