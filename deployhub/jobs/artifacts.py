"""Files that workers upload for a job, stored content-addressed."""

from pathlib import Path

from django.db import transaction

from deployhub.jobs.actions import JobConflict, check_holder
from deployhub.jobs.models import Artifact, Job, JobState
from deployhub.registry.uploads import placed, received


def artifact_path(sha256):
    return f"artifacts/{sha256[:2]}/{sha256}"


def store_artifact(job, device, attempt, name, upload):
    """Store an uploaded artifact of the running attempt; refuse anyone else.

    The file goes in place before its row is saved, and out again when the save or its
    commit fails (registry.uploads.placed): no file is left without its row.
    """
    with received(upload) as (tmp_path, sha256, size):
        path = artifact_path(sha256)
        with placed(tmp_path, path), transaction.atomic():
            job = Job.objects.select_for_update(of=("self",)).get(pk=job.pk)
            check_holder(job, device, attempt)
            if job.state != JobState.RUNNING:
                raise JobConflict(f"The job is {job.state}.")
            return Artifact.objects.create(
                job=job,
                attempt=attempt,
                name=Path(name).name[:100],
                file=path,
                sha256=sha256,
                size=size,
            )
