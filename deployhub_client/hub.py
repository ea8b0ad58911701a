"""The connection to a hub: its URL and a personal (or pipeline) token, one way to call an
operation of API v1 (docs/api.md), and one way to read its paged lists.

Every error the hub answers becomes a HubError with the status and the hub's own
{"error": ...} message, so a script can tell "not found" from "not allowed".
"""

from collections.abc import Iterator
from typing import Any

import requests

from deployhub_client import config

API_PREFIX = "/api/v1/"
PAGE_SIZE = 100
TIMEOUT_SECONDS = 60


class HubError(Exception):
    """The hub refused a call (status 4xx/5xx) or could not be reached (status 0)."""

    def __init__(self, status: int, message: str, body: Any = None):
        super().__init__(f"{status}: {message}" if status else message)
        self.status, self.message, self.body = status, message, body


def api_base(url: str) -> str:
    """The hub's API v1 root from its address, with or without /api/v1 already on it."""
    url = url.rstrip("/")
    if url.endswith(API_PREFIX.rstrip("/")):
        url = url[: -len(API_PREFIX.rstrip("/"))]
    return url + API_PREFIX


class Hub:
    """One hub: Hub("https://hub.example", "dhu_..."), or Hub() to read DEPLOYHUB_URL and
    DEPLOYHUB_TOKEN, else the file `deployhub login` wrote (deployhub_client.config)."""

    def __init__(self, url: str | None = None, token: str | None = None):
        url, token = config.resolve(url, token)
        if not url:
            raise HubError(0, "No hub: run `deployhub login` or set DEPLOYHUB_URL.")
        if not token:
            raise HubError(401, "No token: run `deployhub login` or set DEPLOYHUB_TOKEN.")
        self.url, self.token = url.rstrip("/"), token
        self.base = api_base(url)
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def __repr__(self) -> str:
        return f"Hub({self.url!r})"

    def send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """Send one request to an API v1 path ("jobs/12"); answer the response when it is a
        success, raise HubError with the hub's status and message otherwise."""
        kwargs.setdefault("timeout", TIMEOUT_SECONDS)
        try:
            response = self.session.request(method, self.base + path.lstrip("/"), **kwargs)
        except requests.RequestException as exc:
            raise HubError(0, f"Could not reach {self.url}: {exc}") from exc
        if response.status_code >= 400:
            raise error_of(response)
        return response

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call an API v1 path and answer its JSON body (None when it has none); keyword
        arguments are requests' (json=, params=, data=, files=)."""
        response = self.send(method, path, **kwargs)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise HubError(response.status_code, "The hub's answer is not JSON.") from exc

    def pages(self, path: str, params: dict | None = None, size: int = PAGE_SIZE) -> Iterator:
        """Every item of a paged list ({"items": [...], "count": N}), asking page by page."""
        offset = 0
        while True:
            asked = {**(params or {}), "limit": size, "offset": offset}
            page = self.request("GET", path, params=asked)
            yield from page["items"]
            offset += len(page["items"])
            if not page["items"] or offset >= page["count"]:
                return


def error_of(response: requests.Response) -> HubError:
    """The HubError for a refused call: the hub's {"error": ...} text, or the status's reason."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        message = body["error"]
    else:
        message = response.reason or f"HTTP {response.status_code}"
    return HubError(response.status_code, message, body)
