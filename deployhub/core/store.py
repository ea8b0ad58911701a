"""The content-addressed store: files kept under the name of their bytes, with the rows naming them.

A file goes into the store in the transaction that saves the rows naming it (placing,
placed), so neither stays without the other; a page or a job reads it back through
local_copy, on disk or from a bucket. Every app that keeps files (registry, jobs, parity,
engines, conversions) stores them here. Neutral: it imports no app.
"""

import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.core.files import File
from django.core.files.storage import FileSystemStorage, default_storage
from django.db import DatabaseError, connection, transaction
from django.db.models import FileField

CHUNK = 1024 * 1024


@contextmanager
def workspace():
    """Yield a scratch folder inside the storage root, removed afterwards."""
    folder = Path(tempfile.mkdtemp(dir=settings.FILE_UPLOAD_TEMP_DIR, prefix="work-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def place(path, name, move=True):
    """Put a file at its content-addressed storage name; return True if it was new."""
    if default_storage.exists(name):
        return False
    if not isinstance(default_storage, FileSystemStorage):  # a bucket: upload, then drop ours
        with open(path, "rb") as handle:
            default_storage.save(name, File(handle, name=Path(name).name))
        return True
    final = Path(default_storage.path(name))
    final.parent.mkdir(parents=True, exist_ok=True)
    if not move:  # a copy is whole under its name, or not there: later stores trust exists()
        fd, part = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.")
        os.close(fd)
        try:
            shutil.copyfile(path, part)
        except BaseException:
            os.unlink(part)
            raise
        path = part
    os.replace(path, final)
    return True


@contextmanager
def placing(name):
    """A transaction that stores a file under its content-addressed name and saves the rows
    naming it: yields put(path, move=True), which places the file (when not stored already).

    A file this placed goes again when the block fails, or when the commit does and no row
    names the file (a commit whose answer was lost may have saved them). Another store of
    the same name (the same bytes: a double-submitted form, two teams' one model) never
    counts on a file that is about to go: each holds the name until its transaction ends,
    and a file goes only while the name is held (PostgreSQL locks the name; SQLite's
    IMMEDIATE transactions take turns).
    """
    new = False

    def put(path, move=True):
        nonlocal new
        new = place(path, name, move=move)

    try:
        with transaction.atomic():
            _hold(name)  # in the transaction: a caller's transaction comes first, always
            try:
                yield put
            except BaseException:
                if new:
                    default_storage.delete(name)
                    new = False
                raise
    except BaseException:
        if new:  # the commit failed
            _take_out_unless_named(name)
        raise


@contextmanager
def placed(path, name, move=True):
    """Place a file and save the rows naming it in the with-block, in one transaction
    (placing): if anything fails, neither stays."""
    with placing(name) as put:
        put(path, move=move)
        yield


def _hold(name):
    """Hold a storage name against another store of it until the transaction ends: on
    PostgreSQL a lock on the name, across processes and hosts (a transaction's, as
    PgBouncer's transaction pooling allows). SQLite's transactions take turns already."""
    if connection.vendor != "postgresql":
        return
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def _take_out_unless_named(name):
    """Delete a stored file that no row names, holding its name; where the database cannot
    say (it is not back), the file stays: a file without a row, never a row without its file."""
    try:
        with transaction.atomic():
            _hold(name)
            if not _named(name):
                default_storage.delete(name)
    except DatabaseError:
        pass


def _named(name):
    """Whether any row of any model names this stored file."""
    return any(
        model._base_manager.filter(**{field.name: name}).exists()
        for model in apps.get_models()
        for field in model._meta.concrete_fields
        if isinstance(field, FileField)
    )


@contextmanager
def local_copy(name):
    """Yield a local path of a stored file: the file itself on disk, else a temporary copy."""
    if isinstance(default_storage, FileSystemStorage):
        yield Path(default_storage.path(name))
        return
    with workspace() as work, default_storage.open(name, "rb") as source:
        path = work / Path(name).name
        with open(path, "wb") as out:
            shutil.copyfileobj(source, out, CHUNK)
        yield path
