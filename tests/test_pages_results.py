"""Structured values read as key/value text on every page, never as a Python repr."""

import pytest

from deployhub.teams.templatetags.readable import keyvalues
from tests.benchmark_results import record_run, result
from tests.conftest import PASSWORD


def test_it_flattens_nested_keys_joins_lists_and_escapes():
    html = keyvalues({"precision": "int8", "q": {"ops": ["Conv", "<b>"], "on": True}})

    assert '<span class="k">precision</span> int8' in html
    assert '<span class="k">q.ops</span> Conv, &lt;b&gt;' in html
    assert '<span class="k">q.on</span> yes' in html
    assert keyvalues({}) == "defaults" and keyvalues(None, "") == ""


@pytest.mark.django_db
def test_the_job_page_shows_its_params_as_key_values(client, alice, version, device_class):
    run = record_run(version, device_class, result())
    run.job.params = {"scenario": "single-stream", "batch_sizes": [1, 8]}
    run.job.save()
    client.login(username="alice", password=PASSWORD)

    page = client.get(run.job.get_absolute_url()).content.decode()

    assert '<span class="k">batch_sizes</span> 1, 8' in page
    assert "{&#x27;" not in page and "[1, 8]" not in page
