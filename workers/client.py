"""HTTP client for the hub's device API (docs/protocol.md, API v1)."""

import hashlib
import os
import re
import time
from pathlib import Path

import requests

from workers.errors import JobError
from workers.kept import KeptConnections
from workers.version import user_agent

API_PREFIX = "/api/v1/"
# Retried, after the hub's Retry-After if it says one: a hub restarting or its database away
# (502-504) and a throttled address (429); any other status is final.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
CHUNK_BYTES = 1024 * 1024


class HubError(Exception):
    """The hub answered with an error status (or could not be reached)."""

    def __init__(self, status, message, request=None):
        where = f" to {request}" if request else ""
        super().__init__(f"the hub answered {status}{where}: {message}" if status else message)
        self.status = status
        self.message = message
        self.request = request


class Unauthorized(HubError):
    """The hub refused the device token (401) or the job is not this device's (403)."""


class Conflict(HubError):
    """The hub refused a stale attempt or a job that is no longer ours (409)."""


class HubUnreachable(HubError):
    """The hub could not be reached, even after retrying."""

    def __init__(self, message, request=None):
        super().__init__(None, message, request)


class HubUntrusted(HubUnreachable):
    """The hub's TLS certificate failed verification: asking again does not help until the
    worker is given the CA that signed it (REQUESTS_CA_BUNDLE) or the certificate is fixed."""


class InputMismatch(JobError):
    """A downloaded input does not have the size or sha256 the hub announced."""


class EngineRefused(JobError):
    """The hub will not serve an engine to this device (409): it was built for another one,
    was revoked, or its stored file no longer matches its sha256 (corrupt)."""


class HubClient:
    """Call the hub's device API with a device token (none only to enrol, which makes one)."""

    def __init__(self, base_url, token=None, timeout=30, retries=3, backoff=0.5):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.session = requests.Session()
        if token is not None:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.headers["User-Agent"] = user_agent()  # which worker, which protocol
        # The environment's proxy and CA bundle for the hub, read once: requests reads them
        # (and ~/.netrc, whose login would replace the device token) on every call, a third
        # of a claim's time in the worker.
        self.session.proxies = requests.utils.get_environ_proxies(self.base_url)
        self.session.verify = _ca_bundle() or True
        self.session.trust_env = False
        # Small JSON calls (claims, heartbeats, completions) go over a kept connection per
        # thread (workers/kept.py), unless a proxy stands between: then requests takes them.
        direct = requests.utils.select_proxy(self.base_url, self.session.proxies) is None
        self.kept = None
        if direct:
            sent = ("Authorization", "User-Agent")
            headers = {name: value for name, value in self.session.headers.items() if name in sent}
            self.kept = KeptConnections(self.base_url, timeout, headers, _ca_bundle())

    def whoami(self):
        """Return the hub's description of this device."""
        return self._json("GET", "device")

    def enrol(self, token, name, machine_id, fingerprint=None):
        """Register this machine with an enrolment token; return the hub's answer.

        {"device": <as whoami()>, "token": "dht_...", "created": bool}: the same
        machine enrolled again in the same class is the same device with a fresh
        token. Unauthorized for a refused (403) or unknown (401) enrolment token,
        Conflict when another machine of the class has the name (409).
        """
        body = _without_none(token=token, name=name, machine_id=machine_id, fingerprint=fingerprint)
        return self._json("POST", "enrol", json=body)

    def heartbeat(self, fingerprint=None, delivery=None):
        """Mark this device online, reporting its fingerprint and how it takes work when given."""
        body = _without_none(fingerprint=fingerprint, delivery=delivery)
        return self._json("POST", "device/heartbeat", json=body)

    def next_job(self, wait):
        """HTTPS mode: ask the hub for this device's next job, waiting up to `wait` seconds;
        return its answer ({"job": <the claimed job> or None, "state", "retry_after", ...}).

        Not retried here: the caller backs off with jitter, so a thousand devices that lost
        a restarting hub do not all come back in the same second.
        """
        return self._json(
            "POST", "device/work", json={"wait": wait}, timeout=wait + self.timeout, retry=False
        )

    def claim(self, job_id, attempt):
        """Claim one attempt of a job and return the job."""
        return self._json("POST", f"jobs/{job_id}/claim", json={"attempt": attempt})

    def job_heartbeat(self, job_id, attempt, progress=None, message=None, log=None):
        """Extend the job's lease, reporting progress; return the hub's answer."""
        body = _without_none(attempt=attempt, progress=progress, message=message, log=log)
        return self._json("POST", f"jobs/{job_id}/heartbeat", json=body)

    def download_input(self, job_id, name, dest_path, sha256, size):
        """Stream a job input to dest_path and verify its size and sha256."""
        return self._download(f"jobs/{job_id}/inputs/{name}", name, dest_path, sha256, size)

    def download_engine(self, engine_id, dest_path, sha256, size, name="engine"):
        """Stream an engine to dest_path and verify its size and sha256 (not its signature).

        The hub answers 409 when the engine was built for another toolchain or
        hardware, was revoked or is corrupt; EngineRefused carries its reason word for word.
        """
        try:
            return self._download(f"engines/{engine_id}/download", name, dest_path, sha256, size)
        except Conflict as refused:
            raise EngineRefused(refused.message) from refused

    def production(self, device_class, model=None):
        """Return the production engine(s) this device can run on its class (docs/protocol.md).

        With a model id, that model's only (409, as Conflict, when the device
        cannot run it); without, every model's, each entry saying whether it runs.
        """
        params = {} if model is None else {"model": model}
        return self._json("GET", f"device-classes/{device_class}/production", params=params)

    def _download(self, path, name, dest_path, sha256, size):
        """Stream a file to dest_path and verify its size and sha256; leave nothing if wrong."""
        dest_path = Path(dest_path)
        response = self._request("GET", path, stream=True)
        try:
            with response, dest_path.open("wb") as out:
                digest, written = _copy_with_limit(response, out, size, name)
            _check_download(name, written, digest, size, sha256)
        except BaseException:
            dest_path.unlink(missing_ok=True)
            raise
        return dest_path

    def upload_artifact(self, job_id, attempt, name, path):
        """Upload a file produced by the job; return the hub's record of it."""
        path = Path(path)
        with path.open("rb") as handle:
            return self._json(
                "POST",
                f"jobs/{job_id}/artifacts",
                data={"attempt": str(attempt), "name": name},
                files={"file": (path.name, handle)},
            )

    def complete(
        self, job_id, attempt, state, result=None, error=None, log=None, failure_category=None
    ):
        """Report the final state of a job attempt (a failed build with its category)."""
        body = _without_none(
            attempt=attempt,
            state=state,
            result=result,
            error=error,
            log=log,
            failure_category=failure_category,
        )
        return self._json("POST", f"jobs/{job_id}/complete", json=body)

    def _json(self, method, path, **kwargs):
        """Send a request and return its JSON body ({} when empty)."""
        response = self._request(method, path, **kwargs)
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError as error:
            snippet = response.text[:200]
            request = f"{method} {path}"
            raise HubError(response.status_code, f"not JSON: {snippet!r}", request) from error

    def _request(self, method, path, retry=True, **kwargs):
        """Send a request, retrying a few times while the hub is restarting."""
        retries = self.retries if retry else 0
        for attempt in range(retries + 1):
            last_try = attempt == retries
            _rewind_files(kwargs)
            try:
                response = self._send(method, path, **kwargs)
            except requests.ConnectionError as error:
                if (reason := _refused_certificate(error)) is not None:
                    raise HubUntrusted(self._untrusted(reason), f"{method} {path}") from error
                if last_try:
                    reason = _connection_reason(error)
                    message = f"cannot reach the hub at {self.base_url}: {reason}"
                    raise HubUnreachable(message, f"{method} {path}") from error
            else:
                if response.status_code not in RETRY_STATUSES or last_try:
                    return _raise_for_status(response, method, path)
                response.close()
                # The hub's Retry-After, up to as long as a request may take.
                wait = min(_retry_after(response), self.timeout)
                time.sleep(max(self.backoff * 2**attempt, wait))
                continue
            time.sleep(self.backoff * 2**attempt)

    def _untrusted(self, reason):
        """Say that the hub's certificate is refused, why, and what the operator sets."""
        bundle = self.session.verify if isinstance(self.session.verify, str) else None
        # types-requests leaves requests.certs.where out.
        checked = bundle or f"{requests.certs.where()} (certifi's CAs)"  # type: ignore[attr-defined]
        return (
            f"the hub at {self.base_url} has a certificate this worker does not trust "
            f"({reason}; checked against {checked}): if a private CA signed it, set "
            f"REQUESTS_CA_BUNDLE to that CA's certificate (a PEM file)"
        )

    def _send(self, method, path, timeout=None, **kwargs):
        """Send one request; turn a timeout into a readable HubUnreachable."""
        url = self.base_url + API_PREFIX + path
        timeout = timeout or self.timeout
        try:
            if self.kept is not None and kwargs.keys() <= {"json", "params"}:
                answer = self.kept.request(method, API_PREFIX + path, timeout=timeout, **kwargs)
                if not 300 <= answer.status_code < 400:
                    return answer
                if method != "GET" and answer.status_code not in (307, 308):
                    raise _moved(answer, f"{method} {path}")
                # requests follows the rest, as it did (a proxy's 308 to https, say).
            return self.session.request(method, url, timeout=timeout, **kwargs)
        except requests.Timeout as error:
            if isinstance(error, requests.ConnectionError):
                raise
            message = f"the hub at {self.base_url} did not answer within {timeout} s"
            raise HubUnreachable(message, f"{method} {path}") from error


def _moved(answer, request):
    """The error of a redirect that would turn a call into a GET (the hub's own, to https)."""
    where = answer.headers.get("Location") or "another address"
    message = f"the hub moved to {where}: point the worker there (--hub, DEPLOYHUB_HUB_URL)"
    return HubError(answer.status_code, message, request)


def _ca_bundle():
    """The CA bundle the environment names for requests, as requests reads it, or None."""
    return os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")


def _without_none(**fields):
    """Return the fields whose value is not None."""
    return {key: value for key, value in fields.items() if value is not None}


def _refused_certificate(error):
    """Why the hub's certificate failed verification ("unable to get local issuer
    certificate", a hostname mismatch...), or None for any other connection error."""
    if not isinstance(error, requests.exceptions.SSLError):
        return None
    match = re.search(r"certificate verify failed: ([^()]+)", str(error))
    return match.group(1).strip(" .") if match else None


def _connection_reason(error):
    """Return the OS-level reason of a connection error (e.g. connection refused)."""
    match = re.search(r"\[Errno -?\d+\][^'\")]+", str(error))
    return match.group(0).strip() if match else str(error)


def _retry_after(response):
    """The seconds the hub asked to wait (Retry-After), 0 when it did not say."""
    try:
        return max(0.0, float(response.headers.get("Retry-After", 0)))
    except ValueError:  # an HTTP date: not something the hub sends
        return 0.0


def _rewind_files(kwargs):
    """Seek files being uploaded back to the start, so a retry sends them whole."""
    for _, handle in kwargs.get("files", {}).values():
        handle.seek(0)


def _raise_for_status(response, method, path):
    """Return the response, or raise the HubError its status means."""
    status = response.status_code
    if status < 400:
        return response
    message = _error_text(response)
    response.close()
    error_class = {401: Unauthorized, 403: Unauthorized, 409: Conflict}.get(status, HubError)
    raise error_class(status, message, f"{method} {path}")


def _error_text(response):
    """Return the hub's `error` field, or a short piece of the body."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("error"):
        return str(body["error"])
    return response.text[:200].strip() or response.reason or "no reason given"


def _copy_with_limit(response, out, size, name):
    """Copy the response body to out; return (sha256 hex, bytes written)."""
    digest = hashlib.sha256()
    written = 0
    for chunk in response.iter_content(CHUNK_BYTES):
        written += len(chunk)
        if written > size:
            raise InputMismatch(f"input {name!r} is larger than the announced {size} bytes")
        digest.update(chunk)
        out.write(chunk)
    return digest.hexdigest(), written


def _check_download(name, written, digest, size, sha256):
    """Raise InputMismatch unless the download has the announced size and sha256."""
    if written != size:
        raise InputMismatch(f"input {name!r} has {written} bytes, the hub announced {size}")
    if digest != sha256.lower():
        raise InputMismatch(
            f"input {name!r} sha256 does not match: the file has {digest}, "
            f"the hub announced {sha256}"
        )
