"""A store that fails never takes away the file another store of the same bytes relies on
(files are named by their content: a double-submitted form, or two teams uploading one
model, name one file). Found by reading placed(): the store that placed the file took it
out again when its row failed, under the other store's committed row."""

import pytest

from tests.conftest import run_on_sqlite
from tests.store_race import race

EXPECTED = {
    "first": "failed",
    "second": "stored",
    "second_found_the_file": True,
    "its_row_names_a_file_there": True,
    "file_after_both": True,
}


@pytest.mark.django_db(transaction=True)  # each store's own transaction, as in the hub
@pytest.mark.parametrize("failing", ["block", "commit"])
def test_a_failed_store_leaves_the_file_another_store_saved_on_postgresql(failing):
    assert race(failing) == EXPECTED


def test_stores_at_once_keep_their_files_and_never_wait_on_each_other_on_sqlite(tmp_path):
    seen = run_on_sqlite("tests.store_race", tmp_path)
    assert seen.pop("inside_a_transaction") == {"inside": "stored", "upload": "stored"}
    assert seen.pop("alone_failing_at_commit_leaves_its_file") is False
    assert seen == {"block": EXPECTED, "commit": EXPECTED}


@pytest.mark.django_db(transaction=True)
def test_a_store_inside_a_transaction_and_an_upload_both_store_on_postgresql():
    from tests.store_race import inside_a_transaction

    assert inside_a_transaction() == {"inside": "stored", "upload": "stored"}


@pytest.mark.django_db(transaction=True)
def test_a_store_whose_commit_fails_leaves_no_file_on_postgresql():
    from tests.store_race import alone_failing_at_commit

    assert alone_failing_at_commit() is False
