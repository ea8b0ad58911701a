"""Exceptions shared by the job runner and the code it calls, and how a failure reads."""

# A job's error is one line, its message's lines joined: ONNX Runtime names the offending
# indices and sizes on the lines after "...for the following indices".
ERROR_MAX_CHARS = 2000


class Cancelled(Exception):
    """The job was cancelled while it ran; stop the work and report it."""


class JobError(ValueError):
    """The job cannot run as asked; the message is meant for the person who queued it."""


def one_line(text):
    """Return text's non-empty lines joined into one, shortened to ERROR_MAX_CHARS."""
    lines = (line.strip() for line in str(text).splitlines())
    return " ".join(line for line in lines if line)[:ERROR_MAX_CHARS]
