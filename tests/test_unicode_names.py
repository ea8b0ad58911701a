"""Names people really use: uploads named in any script are kept for display and downloads.

Storage names are generated (models/<sha256>...), so gerät.onnx or モデル.onnx
is harmless: the upload is accepted, the page shows the name escaped, and the
download names itself with RFC 6266's two parameters, an ASCII `filename` and
the real name as `filename*=UTF-8''...`, which decodes back to the original.
"""

from urllib.parse import unquote

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils.http import parse_header_parameters

from deployhub.core.downloads import content_disposition
from deployhub.registry.models import Dataset, Model, ModelVersion
from tests.api_calls import token_for
from tests.conftest import ASSETS, PASSWORD

DEMO = (ASSETS / "digits_cnn_v2.onnx").read_bytes()
NAMES = ["gerät.onnx", "モデル.onnx"]


def upload_on_page(client, alice, filename):
    client.login(username="alice", password=PASSWORD)
    file = SimpleUploadedFile(filename, DEMO)
    response = client.post("/models/", {"name": f"m-{len(filename)}", "notes": "", "file": file})
    assert response.status_code == 302, response.content.decode()[:2000]
    return ModelVersion.objects.get(original_filename=filename)


def upload_by_api(client, alice, filename):
    file = SimpleUploadedFile(filename, DEMO)
    response = client.post("/api/v1/models", {"name": "m", "file": file}, **token_for(alice))
    assert response.status_code == 201, response.json()
    return ModelVersion.objects.get(pk=response.json()["version"]["id"])


def decoded_filename(header):
    """Read the name as an RFC 6266 recipient does: filename* (UTF-8) over filename."""
    disposition, params = parse_header_parameters(header)
    assert disposition == "attachment"
    return params["filename"]


def parameters(header):
    """Return the header's parameters as {name: raw value}."""
    parts = [part.strip() for part in header.split(";")[1:]]
    return dict(part.split("=", 1) for part in parts)


@pytest.mark.parametrize("upload", [upload_on_page, upload_by_api], ids=["page", "api"])
@pytest.mark.parametrize("filename", NAMES)
def test_it_accepts_a_name_in_any_script_and_downloads_under_it(
    client, alice, storage_root, upload, filename
):
    version = upload(client, alice, filename)

    assert version.original_filename == filename
    assert version.file.name == f"models/{version.sha256[:2]}/{version.sha256}.onnx"
    client.login(username="alice", password=PASSWORD)
    page = client.get(version.get_absolute_url()).content.decode()
    assert f'<code id="original-filename">{filename}</code>' in page
    response = client.get(f"/versions/{version.pk}/download")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == DEMO
    header = response["Content-Disposition"]
    params = parameters(header)
    assert header.startswith("attachment; ")
    assert params["filename"].strip('"').isascii() and params["filename"].endswith('.onnx"')
    assert params["filename*"].startswith("UTF-8''")
    assert unquote(params["filename*"].removeprefix("UTF-8''")) == filename
    assert decoded_filename(header) == filename


def test_the_page_shows_a_name_with_markup_as_text(client, alice):
    # Django keeps only what follows the last '/' of a multipart name: no '/' in this one.
    filename = "<img src=x onerror=alert(1)>.onnx"
    version = upload_by_api(client, alice, filename)
    assert version.original_filename == filename

    client.login(username="alice", password=PASSWORD)
    page = client.get(version.get_absolute_url()).content.decode()
    assert "&lt;img src=x onerror=alert(1)&gt;.onnx" in page
    assert "<img src=x" not in page
    header = client.get(f"/versions/{version.pk}/download")["Content-Disposition"]
    assert decoded_filename(header) == filename


def test_a_plain_name_keeps_its_one_parameter(client, alice):
    version = upload_by_api(client, alice, "digits.onnx")
    client.login(username="alice", password=PASSWORD)
    response = client.get(f"/versions/{version.pk}/download")
    assert response["Content-Disposition"] == 'attachment; filename="digits.onnx"'


def test_only_the_versions_team_downloads_it(client, alice, charlie, version):
    client.login(username="charlie", password=PASSWORD)
    assert client.get(f"/versions/{version.pk}/download").status_code == 404


def test_datasets_take_names_in_any_script_too(client, alice, version):
    response = client.post(
        f"/api/v1/versions/{version.pk}/datasets",
        {
            "kind": "calibration",
            "name": "cal",
            "file": SimpleUploadedFile(
                "Kalibrierung-März.npz", (ASSETS / "calibration.npz").read_bytes()
            ),
        },
        **token_for(alice),
    )
    assert response.status_code == 201, response.json()
    assert Dataset.objects.get().original_filename == "Kalibrierung-März.npz"


def test_exports_of_a_model_named_in_another_script_keep_its_name(client, alice, demo_team):
    model = Model.objects.create(team=demo_team, name="Gerät", created_by=alice)
    client.login(username="alice", password=PASSWORD)
    response = client.get(f"/models/{model.pk}/benchmarks.csv")
    header = response["Content-Disposition"]
    assert parameters(header)["filename"] == '"gerat-benchmarks.csv"'
    assert decoded_filename(header) == "gerät-benchmarks.csv"


@pytest.mark.parametrize(
    "name, fallback",
    [
        ("モデル.onnx", "download.onnx"),
        ('a"b\\c.onnx', "a_b_c.onnx"),
        ("x\r\nSet-Cookie: a=b.onnx", "x_Set-Cookie: a=b.onnx"),
    ],
)
def test_the_header_never_carries_quotes_or_line_breaks_raw(name, fallback):
    header = content_disposition(name)
    assert parameters(header)["filename"] == f'"{fallback}"'
    assert "\r" not in header and "\n" not in header and header.isascii()
    assert decoded_filename(header) == name


def test_the_device_download_of_a_model_names_it_the_same_way(alice, demo_team):
    # The job input a device downloads is named after the model: any script goes there too.
    model = Model.objects.create(team=demo_team, name="モデル", created_by=alice)
    from deployhub.registry.uploads import create_version

    version = create_version(model, SimpleUploadedFile("m.onnx", DEMO), alice)
    header = content_disposition(version.download_name)
    assert decoded_filename(header) == "モデル-v1.onnx"
    assert header.isascii() and parameters(header)["filename"] == '"_-v1.onnx"'
