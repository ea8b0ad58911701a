"""Two stores of the same bytes at once, the first of which fails after placing the file, in
its block or at its commit: the second must still find its file (content-addressed names:
both name one file).

tests/test_store_race.py runs it on PostgreSQL (the test's database) and on SQLite, as
`make run` has it: `python -m tests.store_race` in a process whose DATABASE_URL names a fresh
SQLite file migrates it, races, and prints JSON.
"""

import json
import sys
import tempfile
import threading
from pathlib import Path
from unittest import mock

NAME = "datasets/ra/race-0123456789abcdef.npz"
WAIT = 5  # seconds a thread waits for the other at most


def source(text):
    """A file of this text in the storage root, as an upload's temporary file is."""
    from django.core.files.storage import default_storage

    handle = tempfile.NamedTemporaryFile(delete=False, dir=default_storage.location)
    handle.write(text.encode())
    handle.close()
    return Path(handle.name)


def race(failing="block"):
    """Store NAME twice at once; the first store places it, then fails in its block, or at
    its commit (failing="commit": a row breaking a foreign key, checked at commit). Return
    what was seen."""
    from django.core.files.storage import default_storage
    from django.db import IntegrityError, connection

    from deployhub.core.store import placed
    from deployhub.devices.models import DeviceClass
    from deployhub.jobs.models import Artifact, Job, JobKind
    from deployhub.teams.models import Event, Team

    default_storage.delete(NAME)
    team, _ = Team.objects.get_or_create(slug="store-race", defaults={"name": "Store race"})
    device_class, _ = DeviceClass.objects.get_or_create(team=team, slug="race", name="Race")
    job = Job.objects.create(team=team, kind=JobKind.NOOP, device_class=device_class)
    first_placed, second_started = threading.Event(), threading.Event()
    seen = {}

    def first():
        try:
            with placed(source("same bytes"), NAME):
                first_placed.set()
                second_started.wait(WAIT)
                # The second store is on its way (or waits for this one): now this one's
                # row fails (a double-submitted form's unique name, say).
                threading.Event().wait(0.3)
                if failing == "block":
                    raise RuntimeError("this store's row failed")
                Event.objects.create(
                    team_id=2**40, actor="race", verb="race", target_type="race", target_id=1
                )
        except (RuntimeError, IntegrityError):
            seen["first"] = "failed"
        finally:
            connection.close()

    def second():
        first_placed.wait(WAIT)
        second_started.set()
        try:
            with placed(source("same bytes"), NAME):
                seen["second_found_the_file"] = default_storage.exists(NAME)
                artifact = Artifact.objects.create(
                    job=job, attempt=1, name="race", file=NAME, sha256="0" * 64, size=10
                )
            seen["second"] = "stored"
            seen["its_row_names_a_file_there"] = default_storage.exists(artifact.file.name)
        finally:
            connection.close()

    def slow_delete(name, delete=default_storage.delete):
        threading.Event().wait(0.3)  # a bucket's delete: the other store may get in meanwhile
        delete(name)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    with mock.patch.object(default_storage, "delete", slow_delete):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(3 * WAIT)
    seen["file_after_both"] = default_storage.exists(NAME)
    default_storage.delete(NAME)
    Artifact.objects.filter(job=job).delete()
    return seen


def alone_failing_at_commit():
    """One store whose commit refuses its rows (a foreign key, checked at commit): return
    whether its file is still there (no row names it)."""
    from django.core.files.storage import default_storage
    from django.db import IntegrityError

    from deployhub.core.store import placed
    from deployhub.teams.models import Event

    try:
        with placed(source("alone"), NAME):
            Event.objects.create(team_id=2**40, actor="a", verb="v", target_type="t", target_id=1)
    except IntegrityError:
        pass
    return default_storage.exists(NAME)


def inside_a_transaction():
    """A store inside a caller's transaction (an export saved as its job completes) while
    another upload stores: both are saved. Had the upload held its name lock while it
    waited for SQLite's write lock, the caller's store would have waited for that lock, and
    the upload would have failed after SQLite's 20 s ("database is locked")."""
    from django.core.files.storage import default_storage
    from django.db import DatabaseError, connection, transaction

    from deployhub.core.store import placed
    from deployhub.teams.models import Team

    names = ["models/ra/race-outer.onnx", "datasets/ra/race-upload.npz"]
    in_transaction = threading.Event()
    seen = {}

    def store(key, name):
        try:
            with placed(source(name), name):
                pass
            seen[key] = "stored"
        except DatabaseError as error:
            seen[key] = f"failed: {error}"

    def caller():
        try:
            with transaction.atomic():
                Team.objects.filter(pk=0).update(name="x")  # the caller's writes: the lock
                in_transaction.set()
                threading.Event().wait(0.3)  # the upload is on its way meanwhile
                store("inside", names[0])
        finally:
            connection.close()

    def upload():
        in_transaction.wait(WAIT)
        try:
            store("upload", names[1])
        finally:
            connection.close()

    threads = [threading.Thread(target=caller), threading.Thread(target=upload)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for name in names:
        default_storage.delete(name)
    return seen


if __name__ == "__main__":
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    seen = {failing: race(failing) for failing in ("block", "commit")}
    seen["inside_a_transaction"] = inside_a_transaction()
    seen["alone_failing_at_commit_leaves_its_file"] = alone_failing_at_commit()
    json.dump(seen, sys.stdout)
