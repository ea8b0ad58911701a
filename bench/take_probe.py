"""Take jobs for one device on command, timing each take: half of bench_fleet_backlog.

`python -m bench.take_probe <device id> <user id>` runs Django on the database
DATABASE_URL names. For each line read on stdin it queues one no-op job in the device's
class (untimed: the class's backlog stays as it was, one in and one out), then times
jobs.actions.take_next_job for the device, and prints one line of JSON: {"ms": ...,
"queries": ..., "job": ...}. Its first takes (WARMUP) count their queries with Django's
CaptureQueriesContext; the others are timed without it, which adds its own cost.

The bench runs two at once, one on a database with an empty queue and one on a copy
holding 10,000 queued jobs, and asks them in turn: the two are timed side by side.
"""

import json
import os
import sys
import time

WARMUP = 10


def main(device_id, user_id):
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "deployhub.settings")
    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from deployhub.devices.models import Device
    from deployhub.jobs.actions import submit_job, take_next_job
    from deployhub.jobs.models import JobKind

    device = Device.objects.select_related("device_class__team").get(pk=device_id)
    user = get_user_model().objects.get(pk=user_id)
    team, device_class = device.device_class.team, device.device_class
    for number, _ in enumerate(sys.stdin):
        submit_job(team=team, kind=JobKind.NOOP, device_class=device_class, user=user)
        queries = None
        if number < WARMUP:
            with CaptureQueriesContext(connection) as captured:
                job = take_next_job(device)
            queries = len(captured)
            elapsed = None
        else:
            started = time.perf_counter()
            job = take_next_job(device)
            elapsed = time.perf_counter() - started
        answer = {
            "ms": None if elapsed is None else elapsed * 1000,
            "queries": queries,
            "job": None if job is None else job.pk,
        }
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
