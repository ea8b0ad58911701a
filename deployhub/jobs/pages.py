"""The job page's parts that other apps draw, and what jobs adds to the version page.

A job's result belongs to the app that subscribed its kind, so that app draws it
on the job page: in its AppConfig.ready() it calls job_sections.contribute(template,
provider, order=...), and the job page includes each template, in order, with the
context provider(job) returns (benchmarks: the run; evaluation: the golden run;
engines: the engine's flags and the auto run that compared it; parity: the parity run).
"""

from deployhub.core.sections import Sections

job_sections = Sections("job_sections")


def version_part(version):
    """The version page's jobs table (registered in apps.py).

    Read first (read_first in apps.py) and now, not when drawn: a job read unfinished is
    watched by the page, which reloads when it ends, and one read finished has its
    results in every part read after it (engines, results, gates).
    """
    return {"jobs": list(version.jobs.select_related("device_class", "device")[:20])}


def device_part(device):
    """The device page's recent jobs (registered in apps.py)."""
    return {"jobs": device.jobs.select_related("model_version__model", "device_class")[:10]}


def class_part(device_class):
    """The device class page's recent jobs (registered in apps.py)."""
    return {"jobs": device_class.jobs.select_related("model_version__model")[:10]}
