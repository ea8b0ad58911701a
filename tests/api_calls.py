"""The API called as its clients call it: a person with a personal token, a device with its own."""

import json

from django.core.files.uploadedfile import SimpleUploadedFile

from deployhub.teams.models import ApiToken
from tests.conftest import ASSETS


def token_for(user, scope="full"):
    """Issue user a personal API token (full, or "pipeline"); return the headers that send it."""
    record = ApiToken(user=user, name="test", scope=scope)
    token = record.issue()
    record.save()
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def onnx_upload(name="digits_cnn_v2.onnx"):
    """A demo model as an uploaded file."""
    return SimpleUploadedFile(name, (ASSETS / name).read_bytes())


def call(client, token, path, body=None, method="post"):
    """Call /api/v1/<path> with a token (a device's or a person's; None sends none)."""
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    if method == "get":
        return client.get(f"/api/v1/{path}", **headers)
    return client.post(
        f"/api/v1/{path}", json.dumps(body or {}), content_type="application/json", **headers
    )
