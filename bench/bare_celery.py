"""A bare Celery task on DeployHub's broker settings: what dispatch costs without the hub.

`celery -A bench.bare_celery worker -P prefork -c 1 -Q bench-bare` runs it with the
settings every DeployHub process shares (JSON, acks_late, prefetch 1: workers/broker.py).
The task's first act is to push the time it started to a Redis list, which the bench
waits on (BLPOP), so neither side polls.
"""

import os
import time

from celery import Celery

from workers.broker import celery_config

QUEUE = "bench-bare"
STARTS = "bench:bare-starts"

app = Celery("bench-bare", fixups=[])
app.conf.update(celery_config(os.environ["CELERY_BROKER_URL"]))
_redis = None


def _client():
    global _redis
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])
    return _redis


@app.task(name="bench.bare")
def bare(sent_at):
    """Push when this task started (wall clock, seconds) beside when it was sent."""
    started = time.time()
    _client().rpush(STARTS, f"{sent_at} {started}")
