"""Two versions of one model saved at the same moment get the next two numbers (make bench's
load found the second upload answered 500: both had taken the same number)."""

import threading

import pytest
from django.db import connection

from deployhub.registry.models import Model, ModelVersion
from deployhub.registry.uploads import save_version

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_numbers_versions_saved_at_once_one_after_the_other(alice, demo_team, monkeypatch):
    model = Model.objects.create(team=demo_team, name="raced", created_by=alice)
    both_numbered = threading.Barrier(2, timeout=2)
    numbered = Model.next_version_number

    def next_number_then_wait(self):
        number = numbered(self)
        try:  # without a lock, both uploads reach here with the same number
            both_numbered.wait()
        except threading.BrokenBarrierError:
            pass  # the other upload waits for this one's commit: as it should
        return number

    monkeypatch.setattr(Model, "next_version_number", next_number_then_wait)
    saved, failed = [], []

    def upload(digit):
        version = ModelVersion(model=model, sha256=digit * 64, size=1, created_by=alice)
        try:
            saved.append(save_version(version, None).number)
        except Exception as error:  # noqa: BLE001  (what the upload view would answer 500 to)
            failed.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=upload, args=(digit,)) for digit in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert not failed and sorted(saved) == [1, 2]
