"""A webhook's URL, read by one strict parser: the settings page accepts only what the sender
reads the same way, so the host that was checked is the host that is connected to.

Python's urlsplit reads almost anything: in `http://%00/` the host is "%00", a port
of 0 is a port, and in `http://evil.example\\@example.com/` the host is example.com,
where a browser reads evil.example. Here a URL holds RFC 3986's characters only, its
host is a DNS name or an IP address, its port from 1 to 65535; the rest is refused.
"""

import ipaddress
import re
from typing import NamedTuple
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
NOT_A_WEBHOOK_URL = (
    "Enter an http:// or https:// URL with a host, e.g. https://ci.example.com/hook."
)
# RFC 3986's characters: unreserved and reserved ones, and % only before two hex digits.
URL_TEXT = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})+")
# [userinfo@]host[:port], with one @ at most and a port of digits; the host is read below.
AUTHORITY = re.compile(r"(?:[^@]*@)?(?P<host>\[[^\]]*\]|[^@\[\]:]+)(?::(?P<port>[0-9]*))?")
# A DNS label; underscores too, as in a Docker Compose service name.
LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_\-]{0,61}[A-Za-z0-9_])?")


class WebhookUrl(NamedTuple):
    """A webhook URL's parts as the sender uses them."""

    scheme: str
    host: str  # an IPv6 address without its brackets
    port: int  # the scheme's own when the URL names none
    target: str  # the path and query of the request


def read_webhook_url(url):
    """Return the parts of an http or https URL; raise ValueError saying what is wrong."""
    if not URL_TEXT.fullmatch(url):
        raise ValueError(_bad_characters(url) if url else NOT_A_WEBHOOK_URL)
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed [ of an IPv6 address
        raise ValueError(NOT_A_WEBHOOK_URL) from None
    authority = AUTHORITY.fullmatch(parts.netloc)
    if parts.scheme not in DEFAULT_PORTS or not parts.netloc or not authority:
        raise ValueError(NOT_A_WEBHOOK_URL)
    host = _host(authority["host"])
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return WebhookUrl(parts.scheme, host, _port(authority["port"], parts.scheme), target)


def _bad_characters(url):
    bad = sorted(set(URL_TEXT.sub("", url)))
    shown = " ".join(repr(c) for c in bad[:5])
    return (
        f"A URL cannot hold {shown}: percent-encode it (%20 for a space), and write an "
        "international host name in its xn-- form."
    )


def _host(host):
    """Return the host as it is connected to; raise ValueError for one that names nothing."""
    if host.startswith("["):
        try:
            address = ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            address = None
        if address is None or address.scope_id:  # a zone (%25eth0) is the hub's own business
            raise ValueError(f"{host[:100]} is not an IPv6 address.")
        return str(address)
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if len(host) > 254 or not all(LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{host[:100]!r} is not a host name or an IP address.")
    return host.lower()


def _port(port, scheme):
    if not port:  # none, or "host:" with nothing after it
        return DEFAULT_PORTS[scheme]
    if len(port) > 5 or not 1 <= int(port) <= 65535:
        raise ValueError(f"A port is from 1 to 65535, not {port[:10]}.")
    return int(port)
