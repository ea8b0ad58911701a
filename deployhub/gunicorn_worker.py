"""gunicorn's threaded worker for the hub: a URL too long for gunicorn is refused in JSON.

gunicorn refuses a request line over its limit_request_line (4,094 bytes: a long
query) before Django sees the request, with an HTML page; every /api/v1/ error is
the JSON body {"error": "..."} (api/errors.py). The path is not read at that point,
so the answer is JSON for every path. Every gunicorn command of the hub names this
worker class (`--worker-class deployhub.gunicorn_worker.HubWorker`).
"""

import json
import os

from gunicorn import util
from gunicorn.http.errors import LimitRequestLine
from gunicorn.workers.gthread import ThreadWorker

WORKER_CLASS = "deployhub.gunicorn_worker.HubWorker"


class HubWorker(ThreadWorker):
    """gunicorn's gthread worker, answering a request line over the limit as JSON."""

    def init_process(self):
        # How many asks for work (POST device/work) the process may hold open while
        # keeping threads for other calls: deployhub/jobs/waiting.py reads it.
        os.environ["DEPLOYHUB_SERVER_THREADS"] = str(self.cfg.threads)
        super().init_process()

    def handle_error(self, req, client, addr, exc):
        if not isinstance(exc, LimitRequestLine):
            return super().handle_error(req, client, addr, exc)
        self.log.warning("Invalid request from ip=%s: %s", (addr or ("",))[0], exc)
        try:
            util.write_nonblock(client, too_long(self.cfg.limit_request_line))
        except OSError:
            self.log.debug("Failed to send error message.")
        return None


def too_long(limit):
    """Return the whole 414 answer, as bytes."""
    error = (
        f"The URL is too long: the request line takes at most {limit:,} bytes. Send long "
        "values in the request's body (JSON or form fields), not in its query."
    )
    body = json.dumps({"error": error}).encode()
    head = (
        "HTTP/1.1 414 URI Too Long\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body
