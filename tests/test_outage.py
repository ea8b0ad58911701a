"""Outages answer as outages: 503 while the database is down, 507 while storage is full.

The fault soak (scripts/soak.py, tests/test_soak_short.py) restarts a real PostgreSQL
and fills a real disk; these show the same answers one request at a time.
"""

import errno

import pytest
from django.db import InterfaceError, OperationalError, connection

from deployhub.registry.models import ModelVersion
from deployhub.registry.uploads import HashedUploadedFile
from tests.api_calls import onnx_upload, token_for


@pytest.fixture
def queries_raise(db):
    """Make every query of this thread's connection raise the error given; undone before
    the test database is (monkeypatch may be torn down after it)."""
    errors = []

    def refuse(*args, **kwargs):
        raise errors[-1]

    connection.cursor = refuse  # shadows the method on this connection only
    yield errors.append
    del connection.cursor


def test_it_answers_503_with_a_json_error_and_retry_after_while_the_database_is_down(
    client, queries_raise
):
    queries_raise(OperationalError("connection failed: Connection refused"))  # a restart

    for path in ("/api/v1/models", "/api/v1/device"):
        response = client.get(path, HTTP_AUTHORIZATION="Bearer dhu_anything")

        assert response.status_code == 503
        assert response["Content-Type"] == "application/json"
        assert response.json()["error"].startswith("The database is unavailable")
        assert response["Retry-After"] == "5"


def test_it_answers_503_for_a_connection_closed_under_it(client, queries_raise):
    queries_raise(InterfaceError("connection already closed"))

    response = client.get("/api/v1/models", HTTP_AUTHORIZATION="Bearer dhu_anything")

    assert response.status_code == 503


def test_it_leaves_other_errors_to_the_rest_of_the_hub(client, queries_raise):
    queries_raise(RuntimeError("a bug"))
    client.raise_request_exception = False

    response = client.get("/api/v1/models", HTTP_AUTHORIZATION="Bearer dhu_anything")

    assert response.status_code == 500


@pytest.fixture
def disk_fills_up(monkeypatch):
    """The disk fills up after the upload's first chunk reached its temporary file.

    The upload is kept referenced, as the error's traceback keeps it under gunicorn:
    its temporary file must go when the write fails, not when Python collects it.
    """
    real_receive = HashedUploadedFile.receive
    kept = []

    def receive(self, chunk):
        kept.append(self)
        real_receive(self, chunk)
        self.file.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(HashedUploadedFile, "receive", receive)
    return kept


@pytest.mark.django_db
def test_it_refuses_an_upload_onto_a_full_disk_with_507_and_keeps_nothing(
    client, alice, version, storage_root, disk_fills_up
):
    before = sorted(p.relative_to(storage_root) for p in storage_root.rglob("*") if p.is_file())

    response = client.post(
        f"/api/v1/models/{version.model.pk}/versions",
        {"file": onnx_upload("digits_cnn_v1.onnx")},
        **token_for(alice),
    )

    assert response.status_code == 507
    assert "storage is full" in response.json()["error"]
    assert ModelVersion.objects.count() == 1
    after = sorted(p.relative_to(storage_root) for p in storage_root.rglob("*") if p.is_file())
    assert after == before  # no half-written temporary file, no stored file
