"""Where work waits: each class's queued jobs, the oldest one, and whether a device is
online to take them (the fleet page, a job's page, an auto run's page, /metrics)."""

from django.db.models import Count, Max, Min, Q
from django.utils import timezone

from deployhub.devices.models import online_filter
from deployhub.jobs.models import Job, JobState


def queue_figures(device_classes=None):
    """Return {class id: (queued jobs, the oldest one's created_at)} for classes with a backlog.

    One query (an index holds only queued jobs, by class); device_classes narrows it.
    """
    queued = Job.objects.filter(state=JobState.QUEUED)
    if device_classes is not None:
        queued = queued.filter(device_class__in=device_classes)
    rows = queued.values("device_class").annotate(waiting=Count("pk"), oldest=Min("created_at"))
    return {row["device_class"]: (row["waiting"], row["oldest"]) for row in rows.order_by()}


def fleet_part(team):
    """The fleet page's queues (contributed in apps.py): each class's queued jobs and the
    oldest one's submission, in two queries whatever the fleet."""
    classes = list(team.device_classes.all()) if team else []
    figures = queue_figures(classes)
    rows = []
    for device_class in classes:
        waiting, oldest = figures.get(device_class.pk, (0, None))
        rows.append({"device_class": device_class, "waiting": waiting, "oldest": oldest})
    return {"class_queues": rows}


def no_device_notice(device_class, now=None):
    """Say that no device of the class is online to take its queued jobs, or return "".

    "No device of class X online since <its devices' last heartbeat>; N jobs waiting."
    Revoked devices do not count. Two queries: its devices' heartbeats, then its queue.
    """
    now = now or timezone.now()
    online = online_filter(now)
    devices = device_class.devices.filter(revoked_at__isnull=True).aggregate(
        last=Max("last_heartbeat_at"),
        taking=Count("pk", filter=online & Q(draining=False)),
        draining=Count("pk", filter=online & Q(draining=True)),
    )
    if devices["taking"]:
        return ""
    waiting, _ = queue_figures([device_class]).get(device_class.pk, (0, None))
    if not waiting:
        return ""
    jobs = f"{waiting} job{'' if waiting == 1 else 's'} waiting"
    if devices["draining"]:
        return f"No device of class {device_class} takes jobs: those online are draining; {jobs}."
    since = "ever" if devices["last"] is None else f"{devices['last']:%Y-%m-%d %H:%M} UTC"
    return f"No device of class {device_class} online since {since}; {jobs}."
