"""A noop job: no work, so that it measures the hub-broker-worker pipeline itself."""

from workers import kinds

KIND = kinds.NOOP


def run(job_run, inputs):
    """Do nothing: a noop job measures the hub-broker-worker pipeline itself."""
    return {}
