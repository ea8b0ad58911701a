"""Files that workers upload for a job, stored content-addressed."""

from pathlib import Path

from deployhub.core.store import placing
from deployhub.jobs.actions import JobConflict, check_holder
from deployhub.jobs.models import Artifact, Job, JobState
from deployhub.registry.uploads import received


def artifact_path(sha256):
    return f"artifacts/{sha256[:2]}/{sha256}"


def store_artifact(job, device, attempt, name, upload):
    """Store an uploaded artifact of the running attempt; refuse anyone else.

    The holder is checked before the file is placed: a refused upload never touches the
    stored file of the same bytes another attempt may hold. A file this call placed goes
    again when its row or the commit fails: no file is left without its row.
    """
    with received(upload) as (tmp_path, sha256, size):
        path = artifact_path(sha256)
        with placing(path) as put:
            job = Job.objects.select_for_update().get(pk=job.pk)
            check_holder(job, device, attempt)
            if job.state != JobState.RUNNING:
                raise JobConflict(f"The job is {job.state}.")
            put(tmp_path)
            return Artifact.objects.create(
                job=job,
                attempt=attempt,
                name=Path(name).name[:100],
                file=path,
                sha256=sha256,
                size=size,
            )
