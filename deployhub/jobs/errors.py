"""Why a job protocol request was refused; the API maps each to its HTTP status."""


class JobConflict(Exception):
    """The request does not fit the job's current state or attempt (HTTP 409)."""


class StaleAttempt(JobConflict):
    """The call names an attempt that is not the job's current one (HTTP 409)."""


class WrongDevice(Exception):
    """The device is not allowed to act on this job (HTTP 403)."""


class ResultRejected(Exception):
    """A worker's result is well-formed but unusable: the job fails with this message."""
