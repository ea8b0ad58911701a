"""Pages compose one way (deployhub/core/sections.py): parts drawn by order, in their slot, their
providers read with the page's object; and a job kind's subscription, not the page's
script, says whether a page watching one of its jobs reloads when it ends."""

import pytest

from deployhub.core.sections import Sections
from deployhub.jobs.actions import submit_job
from deployhub.jobs.models import JobKind
from tests.conftest import PASSWORD


def test_parts_are_drawn_by_order_then_as_contributed_and_read_with_the_page_object():
    page = Sections("page_sections")
    page.contribute("b/_late.html", lambda obj: {"late": obj}, order=60)
    page.contribute("a/_first.html", order=10)
    page.contribute("c/_also_50.html", lambda obj: {"also": obj * 2})
    page.contribute("d/_then_50.html")

    context = page.context(21)

    assert context["page_sections"] == [
        "a/_first.html",
        "c/_also_50.html",
        "d/_then_50.html",
        "b/_late.html",
    ]
    assert context["late"] == 21 and context["also"] == 42


def test_a_template_contributed_twice_is_drawn_once():
    page = Sections("page_sections")
    page.contribute("a/_part.html")
    page.contribute("a/_part.html")

    assert page.context(None)["page_sections"] == ["a/_part.html"]


def test_a_page_with_slots_draws_each_part_in_its_slot_and_reads_read_first_first():
    page = Sections("sections", slots=("top", "end"))
    read = []

    def reads(name):
        return lambda obj: read.append(name) or {}

    page.contribute("a/_top.html", reads("top"), slot="top")
    page.contribute("b/_end.html", reads("end"), slot="end", read_first=True)

    context = page.context(None)

    assert context["sections"] == {"top": ["a/_top.html"], "end": ["b/_end.html"]}
    assert read == ["end", "top"]


@pytest.mark.parametrize("slot", [None, "middle"])
def test_a_part_for_no_slot_of_a_page_with_slots_is_refused(slot):
    page = Sections("sections", slots=("top", "end"))

    with pytest.raises(ValueError, match="slots"):
        page.contribute("a/_part.html", slot=slot)
    assert page.context(None)["sections"] == {"top": [], "end": []}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kind", "reloads"),
    [(JobKind.COMPILE, True), (JobKind.PARITY, True), (JobKind.BENCHMARK, False)],
)
def test_a_jobs_status_says_whether_the_page_watching_it_reloads(
    client, alice, demo_team, version, device_class, kind, reloads
):
    job = submit_job(
        team=demo_team, kind=kind, device_class=device_class, user=alice, model_version=version
    )
    client.login(username="alice", password=PASSWORD)

    status = client.get(f"/jobs/{job.pk}/status").json()

    assert status["reloads_page"] is reloads


@pytest.mark.django_db
def test_the_device_class_page_ends_with_its_recent_jobs(
    client, alice, demo_team, version, device_class
):
    job = submit_job(
        team=demo_team,
        kind=JobKind.NOOP,
        device_class=device_class,
        user=alice,
        model_version=version,
    )
    client.login(username="alice", password=PASSWORD)

    page = client.get(device_class.get_absolute_url()).content.decode()

    recent = page.index("<h2>Recent jobs</h2>")
    assert page.index(f'<tr id="job-{job.pk}" data-live="/jobs/{job.pk}/status">') > recent
    assert page.index('id="fingerprint-timeline"') < recent
