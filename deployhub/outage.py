"""Answer an outage as one: 503 while the database is down, 507 while storage is full.

A restarting PostgreSQL makes every view raise OperationalError or InterfaceError,
and a full disk makes an upload raise OSError(ENOSPC). Neither is a bug in the
request: without this the hub answers 500 with a traceback in its log, and a worker
or a script cannot tell "try again" from "broken". Here the caller gets
{"error": "..."} (with Retry-After on a 503: device workers retry those) and the log
one line. Late in MIDDLEWARE, so its process_exception sees a view's error first.
Neutral: imports no app.
"""

import errno
import logging

from django.db import InterfaceError, OperationalError
from django.http import JsonResponse

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
DATABASE_DOWN = "The database is unavailable; nothing was changed. Try again in a few seconds."
STORAGE_FULL = "The hub's storage is full: nothing was stored. Try again once space has been freed."


class OutageMiddleware:
    """Turn a database outage into a 503 and a full disk into a 507, as JSON."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        return outage_response(request, exception)


def outage_response(request, exception):
    """Return the JSON answer for an outage, or None for any other error."""
    if isinstance(exception, (OperationalError, InterfaceError)):
        logger.warning(
            "503 for %s %s: database unavailable: %s",
            request.method,
            request.path,
            _one_line(exception),
        )
        response = JsonResponse({"error": DATABASE_DOWN}, status=503)
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return _logged(response)
    if isinstance(exception, OSError) and exception.errno in DISK_FULL:
        logger.warning(
            "507 for %s %s: storage full: %s", request.method, request.path, _one_line(exception)
        )
        return _logged(JsonResponse({"error": STORAGE_FULL}, status=507))
    return None


def _logged(response):
    """Mark the answer logged: Django would add a line of its own without the reason."""
    response._has_been_logged = True  # django.utils.log.log_response reads this
    return response


def _one_line(exception):
    return " ".join(str(exception).split())[:300]
