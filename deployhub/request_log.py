"""The hub's log lines: a refused request (4xx) is one line, a server error keeps its traceback.

Django logs each PermissionDenied (403), and each request it could not parse
(400), as a warning carrying the exception, so the log writes a full traceback
for what is the client's mistake, not the hub's. This formatter writes such a
record as its message and the exception's type and text on one line.
"""

import logging


class OneLineClientErrors(logging.Formatter):
    """Format a 4xx request record without its traceback; every other record as usual."""

    def format(self, record):
        status = getattr(record, "status_code", None)
        if not record.exc_info or status is None or not 400 <= status < 500:
            return super().format(record)
        error = record.exc_info[1]
        reason = " ".join(str(error).split())
        line = logging.makeLogRecord(
            {**record.__dict__, "exc_info": None, "exc_text": None, "args": None}
        )
        line.msg = f"{record.getMessage()} ({type(error).__name__}{': ' if reason else ''}{reason})"
        return super().format(line)
