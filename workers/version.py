"""Which worker this is, and which version of the device protocol (docs/protocol.md) it speaks.

Every call the worker makes says both in its User-Agent, `deployhub-worker/<version>
protocol/<n>`: the hub refuses a worker whose protocol it does not speak, naming what to
install, and marks workers older than itself on the fleet page.
"""

from importlib import metadata

# Raised when a change to docs/protocol.md would break a worker of the previous release.
# 2: work over HTTPS (POST device/work), enrolment (POST enrol).
PROTOCOL = 2
# The oldest protocol the hub still serves; older workers are refused with what to install.
OLDEST_PROTOCOL = 1
DISTRIBUTION = "deployhub"


def worker_version():
    """Return this installation's version of the deployhub distribution ("0.1.0")."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"


def user_agent():
    return f"deployhub-worker/{worker_version()} protocol/{PROTOCOL}"


def parse_user_agent(value):
    """Return (version, protocol) from a worker's User-Agent; (None, None) when it says none.

    A worker from before protocol 2 sends plain `deployhub-worker`: version unknown,
    protocol 1.
    """
    words = dict(part.split("/", 1) for part in (value or "").split() if part.count("/") == 1)
    if "deployhub-worker" not in (value or "").split("/")[0].split():
        return None, None
    protocol = words.get("protocol", "1")
    readable = protocol.isascii() and protocol.isdigit() and len(protocol) < 10  # not "²"
    return words.get("deployhub-worker"), int(protocol) if readable else None
