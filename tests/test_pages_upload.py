"""The upload form: an example and a schema by the spec and the contract, every error at once."""

import json
import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.registry.models import Model
from tests.conftest import ASSETS, PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def logged_in(client, alice):
    client.login(username="alice", password=PASSWORD)
    return client


def onnx_upload():
    return SimpleUploadedFile("digits.onnx", (ASSETS / "digits_cnn_v2.onnx").read_bytes())


def errors_of(page, field):
    found = re.search(rf'data-errors-for="{field}"\s+id="errors-{field}">(.*?)</div>', page, re.S)
    return found.group(1) if found else ""


def test_it_offers_an_example_and_the_allowed_values_next_to_each_json_field(logged_in):
    page = logged_in.get("/models/").content.decode()

    assert 'id="schema-preprocessing"' in page and 'id="schema-contract"' in page
    assert "NCHW | NHWC" in page and "RGB | BGR | GRAY" in page and "bilinear" in page
    assert 'data-fill-example="id_preprocessing"' in page
    assert "&quot;interpolation&quot;: &quot;bilinear&quot;" in page  # example placeholder
    assert "{&quot;sizes&quot;: [1, 8]}" in page


def test_an_empty_error_slot_holds_nothing_at_all_so_the_page_hides_it(logged_in):
    """The stylesheet hides .form-errors and .field-errors while they are :empty; a newline
    left inside one by the template's layout would show an empty red box on every form."""
    page = logged_in.get("/models/").content.decode()

    slots = re.findall(r'<div class="(?:form|field)-errors"[^>]*>(.*?)</div>', page, re.S)
    assert len(slots) > 3 and slots == [""] * len(slots)


def test_it_reports_every_error_at_once_next_to_its_field(logged_in, alice, demo_team):
    Model.objects.create(team=demo_team, name="taken", created_by=alice)
    spec = {"color_order": "XYZ", "std": [1, 0, 1], "crop": 3}

    response = logged_in.post("/models/", {"name": "taken", "preprocessing": json.dumps(spec)})

    page = response.content.decode()
    assert response.status_code == 400
    assert "already has a model named" in errors_of(page, "name")
    assert "required" in errors_of(page, "file")
    spec_errors = errors_of(page, "preprocessing")
    assert "color_order: &#x27;XYZ&#x27; is not one of RGB, BGR, GRAY." in spec_errors
    assert "std: contains 0" in spec_errors and "crop: unknown field" in spec_errors
    assert Model.objects.count() == 1


def test_it_puts_a_contract_that_does_not_fit_the_model_under_the_contract(logged_in):
    contract = {"inputs": {"pixels": {"shape": ["batch", 3, 32, 32], "batch": {"sizes": [1]}}}}
    body = {"name": "digits", "file": onnx_upload(), "contract": json.dumps(contract)}

    page = logged_in.post("/models/", body).content.decode()

    assert "no entry for the model input &#x27;image&#x27;" in errors_of(page, "contract")
    assert errors_of(page, "file").strip() == ""
    assert not Model.objects.filter(name="digits").exists()


def test_a_valid_spec_still_uploads(logged_in):
    spec = {"color_order": "BGR", "scale": 0.5, "layout": "NHWC"}
    body = {"name": "digits", "file": onnx_upload(), "preprocessing": json.dumps(spec)}

    response = logged_in.post("/models/", body)

    assert response.status_code == 302
    version = Model.objects.get(name="digits").latest_version()
    assert version.preprocessing["color_order"] == "BGR"
