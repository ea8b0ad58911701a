"""The version page reads its jobs table before every other part: a job that ends while the
page is drawn is either shown unfinished and watched (data-live: the page reloads when it
ends) or shown finished with what it added, never finished-but-missing."""

from dataclasses import replace

import pytest

from deployhub.jobs.actions import claim_job, complete_job, submit_job
from deployhub.jobs.models import JobKind
from deployhub.registry import pages
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def test_a_job_that_ends_while_any_other_part_is_read_is_watched(
    client, alice, demo_team, version, device_class, make_device, monkeypatch
):
    job = submit_job(
        team=demo_team,
        kind=JobKind.NOOP,
        device_class=device_class,
        user=alice,
        model_version=version,
    )
    device, _ = make_device()
    claim_job(job.pk, device, 1)
    sections = pages.version_sections
    providers = [part.provider for part in sections.parts() if part.provider is not None]
    jobs_part = next(p for p in providers if p.__module__ == "deployhub.jobs.pages")
    others = [p for p in providers if p is not jobs_part]

    def ends_the_job_first(provider):
        def read(version):
            complete_job(job.pk, device, 1, "succeeded")
            return provider(version)

        return read

    # Whichever other part reads first, the job ends just before it.
    first = ends_the_job_first(others[0])
    parts = [replace(p, provider=first) if p.provider is others[0] else p for p in sections._parts]
    monkeypatch.setattr(sections, "_parts", parts)
    client.login(username="alice", password=PASSWORD)
    page = client.get(version.get_absolute_url()).content.decode()

    assert f'<tr id="job-{job.pk}" data-live="/jobs/{job.pk}/status">' in page
