"""What a worker does for each job kind: one module per kind, listed in known.py.

A kind's module names its KIND (workers/kinds.py) and gives `run(job_run, inputs)`,
which does the work of a claimed attempt and returns the result the hub stores, and,
when a job can be refused before its inputs are downloaded, `check(job_run)`, which
raises JobError. workers/runner.py does the rest of an attempt's life: claim,
heartbeat, download, upload and completion.
"""
