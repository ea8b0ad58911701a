"""Run a device worker that reports when each job's task started and its claim was answered.

`python -m bench.timed_worker <redis url> run --hub ...` is `python -m workers run ...`
with three timestamps added around the claim (wall clock, the hub's clock on this
machine): the task's start, the claim's request, and its answer. After each job it pushes them,
with the job id, to a Redis list the bench waits on (BLPOP), so the bench never polls
the database while a job is on its way. Nothing else of the worker changes.
"""

import json
import sys
import time

import workers.app  # noqa: F401  (keeps Django out, then imports Celery and the runner)
from workers import runner
from workers.cli import main
from workers.client import HubClient

TIMINGS = "bench:dispatch"


def timed(redis_url):
    """Wrap runner.run_job and HubClient.claim to record the task's start and the claim's answer."""
    import redis

    client = redis.Redis.from_url(redis_url)
    run_job, claim = runner.run_job, HubClient.claim
    stamps = {}

    def timed_run_job(hub, job_id, attempt, *args, **kwargs):
        stamps.clear()
        stamps.update(job=job_id, task_started=time.time())
        try:
            return run_job(hub, job_id, attempt, *args, **kwargs)
        finally:
            client.rpush(TIMINGS, json.dumps(stamps))

    def timed_claim(hub, job_id, attempt):
        stamps["claim_sent"] = time.time()
        answer = claim(hub, job_id, attempt)
        stamps["claim_answered"] = time.time()
        return answer

    runner.run_job, HubClient.claim = timed_run_job, timed_claim


if __name__ == "__main__":
    timed(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
