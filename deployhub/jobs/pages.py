"""The job page's parts that other apps draw, and what jobs adds to the version page.

A job's result belongs to the app that subscribed its kind, so that app draws it
on the job page: in its AppConfig.ready() it calls contribute(template, provider,
order=...), and the job page includes each template, in order, with the context
provider(job) returns (benchmarks: the run; evaluation: the golden run; engines:
the engine's flags and the auto run that compared it; parity: the parity run).
"""

_job_parts = []


def contribute(template, provider=None, *, order=50):
    """Draw template on every job page, with provider(job) -> dict added to its context."""
    if not any(part[1] == template for part in _job_parts):
        _job_parts.append((order, template, provider))
        _job_parts.sort(key=lambda part: part[0])


def job_context(job):
    """Return the context the contributed parts read, and the templates to include."""
    context = {"job_sections": [template for _, template, _ in _job_parts]}
    for _, _, provider in _job_parts:
        if provider is not None:
            context.update(provider(job))
    return context


def version_part(version):
    """The version page's jobs table (registered in apps.py).

    Read first (read_first in apps.py) and now, not when drawn: a job read unfinished is
    watched by the page, which reloads when it ends, and one read finished has its
    results in every part read after it (engines, results, gates).
    """
    return {"jobs": list(version.jobs.select_related("device_class", "device")[:20])}
