"""Turn an uploaded file into a stored, validated ModelVersion, or nothing at all."""

import hashlib
import os
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import transaction

from deployhub.registry.inspect import InvalidModel, inspect_onnx
from deployhub.registry.models import ModelVersion, version_upload_path
from deployhub.teams.models import Event

CHUNK = 1024 * 1024


class DuplicateVersion(InvalidModel):
    """The same file is already a version of this model."""

    def __init__(self, version):
        self.version = version
        super().__init__(f"This file is already {version} (same sha256); nothing was stored.")


def spool(uploaded_file, max_bytes):
    """Copy an upload into the storage root's tmp folder, hashing as it goes."""
    digest = hashlib.sha256()
    size = 0
    fd, name = tempfile.mkstemp(dir=settings.FILE_UPLOAD_TEMP_DIR, suffix=".upload")
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in uploaded_file.chunks(CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise InvalidModel(f"The file is larger than the {max_bytes:,} byte limit.")
                digest.update(chunk)
                out.write(chunk)
    except BaseException:
        os.unlink(name)
        raise
    return Path(name), digest.hexdigest(), size


def place(tmp_path, name):
    """Move the spooled file to its content-addressed name; return True if it was new."""
    final = Path(default_storage.path(name))
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        tmp_path.unlink()
        return False
    os.replace(tmp_path, final)
    return True


def create_version(model, uploaded_file, user, notes="", preprocessing=None):
    """Validate and store an uploaded ONNX file as the model's next version."""
    tmp_path, sha256, size = spool(uploaded_file, settings.DEPLOYHUB_MAX_UPLOAD_BYTES)
    placed = None
    try:
        info = inspect_onnx(tmp_path)
        if existing := model.versions.filter(sha256=sha256).first():
            raise DuplicateVersion(existing)
        with transaction.atomic():
            version = ModelVersion(
                model=model,
                number=model.next_version_number(),
                sha256=sha256,
                size=size,
                original_filename=Path(uploaded_file.name or "").name[:255],
                notes=notes,
                preprocessing=preprocessing or {},
                created_by=user,
                **info,
            )
            version.file.name = version_upload_path(version, uploaded_file.name)
            placed = place(tmp_path, version.file.name) and version.file.name
            version.save()
            Event.record(model.team, user, "version.created", version, sha256=sha256)
        return version
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        if placed:
            default_storage.delete(placed)
        raise
