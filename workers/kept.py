"""The worker's small JSON calls to the hub over a kept connection per thread (http.client).

A claim, a heartbeat or a completion is a few hundred bytes each way. requests spent
0.5 ms of the worker's CPU before such a call's first byte left (preparing, merging
settings, urllib3's checks), against 0.1 ms here: a tenth of a job's whole dispatch.
Files still go through requests (streamed downloads, multipart uploads), and so does
every call when a proxy stands between the worker and the hub (workers/client.py).

Errors are requests' own (ConnectionError, Timeout), so the client retries and reports
them as it does for requests' calls.
"""

import http.client
import os
import ssl
import threading
from json import dumps, loads
from urllib.parse import urlencode, urlsplit

import requests
from urllib3.util.wait import wait_for_read


class Answer:
    """A response read whole: what workers/client.py reads of a requests.Response."""

    def __init__(self, response, content):
        self.status_code = response.status
        self.reason = response.reason
        self.headers = response.headers  # looked up case-insensitively
        self.content = content

    @property
    def text(self):
        return self.content.decode("utf-8", errors="replace")

    def json(self):
        return loads(self.content)

    def close(self):
        pass


class KeptConnections:
    """One kept connection to the hub per thread, opened again when the hub closed it."""

    def __init__(self, base_url, timeout, headers, ca_bundle=None):
        parts = urlsplit(base_url)
        self.https = parts.scheme == "https"
        # http.client reads a port from a host without one: an IPv6 address's last group.
        self.host, self.port = parts.hostname, parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.headers = dict(headers)
        self.context = _tls_context(ca_bundle) if self.https else None
        self._local = threading.local()

    def request(self, method, path, json=None, params=None, timeout=None):
        """Send one call and return its Answer; raise requests.ConnectionError or Timeout.

        timeout, when given, is this call's (an ask for work the hub holds open).
        """
        target = self.prefix + path + (f"?{urlencode(params)}" if params else "")
        headers = dict(self.headers)
        body = None
        if json is not None:
            try:
                body = dumps(json, allow_nan=False).encode()  # as requests: NaN is not JSON
            except ValueError as error:
                raise requests.exceptions.InvalidJSONError(str(error)) from error
            headers["Content-Type"] = "application/json"
        connection = self._connection()
        connection.timeout = timeout or self.timeout
        if connection.sock is not None:
            connection.sock.settimeout(connection.timeout)
        stage = "connecting" if connection.sock is None else "sending"
        try:
            if stage == "connecting":
                connection.connect()
                stage = "sending"
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            stage = "answered"
            content = response.read()
        except BaseException as error:
            connection.close()  # never reused with half a call on it
            mapped = _as_requests_error(error, stage)
            if mapped is error:
                raise
            raise mapped from error
        if response.will_close:
            connection.close()
        return Answer(response, content)

    def _connection(self):
        connection = getattr(self._local, "connection", None)
        if connection is not None and _dropped(connection):
            connection.close()  # http.client opens it again on the next request
        if connection is None:
            if self.https:
                connection = http.client.HTTPSConnection(
                    self.host, self.port, timeout=self.timeout, context=self.context
                )
            else:
                connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._local.connection = connection
        return connection


def _as_requests_error(error, stage):
    """The error requests raised for this one, which the client retries and words alike.

    Once the hub has answered, the call was acted on: an answer cut short (a reset, a
    short body) is not a connection error, which the client would send again.
    """
    if not isinstance(error, (OSError, http.client.HTTPException)):
        return error  # KeyboardInterrupt and the like, as they are
    if stage == "answered":
        return requests.exceptions.ChunkedEncodingError(f"{type(error).__name__}: {error}")
    if isinstance(error, ssl.SSLError):  # requests' own: the client tells a refused certificate
        return requests.exceptions.SSLError(f"{type(error).__name__}: {error}")
    if isinstance(error, TimeoutError):
        timeout = requests.ConnectTimeout if stage == "connecting" else requests.Timeout
        return timeout(str(error))  # the first is a connection error: retried
    return requests.ConnectionError(f"{type(error).__name__}: {error}")


def _dropped(connection):
    """Tell whether the hub closed the kept connection (it is readable while idle)."""
    if connection.sock is None:
        return False
    try:
        return wait_for_read(connection.sock, timeout=0)
    except OSError:
        return True


def _tls_context(ca_bundle):
    """Verify the hub as requests does: the bundle the environment names, else certifi's."""
    where = ca_bundle or requests.certs.where()
    if not os.path.exists(where):
        raise OSError(f"Could not find a suitable TLS CA certificate bundle, invalid path: {where}")
    if os.path.isdir(where):
        return ssl.create_default_context(capath=where)
    return ssl.create_default_context(cafile=where)
