"""Where outgoing webhooks may not go: the networks of settings.DEPLOYHUB_WEBHOOK_BLOCKED_NETWORKS.

A team admin picks a webhook's URL and the hub POSTs to it, so without a check an admin
could make the hub call what only the hub can reach: its own host's services on
loopback, a cloud's metadata service on link-local (169.254.169.254). Every address a
webhook's host resolves to is checked when it is sent, and the connection goes to the
address that was checked (a name that resolves elsewhere a moment later changes nothing).
"""

import ipaddress
import socket

from django.conf import settings

SETTING = "DEPLOYHUB_WEBHOOK_BLOCKED_NETWORKS"


class BlockedAddress(ValueError):
    """The host is, or resolves to, an address in a blocked network."""


def blocked_networks():
    return [ipaddress.ip_network(network) for network in getattr(settings, SETTING)]


def blocking_network(address):
    """Return the blocked network that holds the address (an ip_address), or None."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    for network in blocked_networks():
        if address.version == network.version and address in network:
            return network
    return None


def refusal(host, address, network):
    named = host if str(address) == host else f"{host} ({address})"
    return (
        f"{named} is in {network}, which webhooks may not reach: the hub's own host, "
        f"link-local addresses (a cloud's metadata service) and the other networks of "
        f"{SETTING} are closed to them."
    )


def check_literal_host(host):
    """Raise BlockedAddress for a host that names a blocked address itself (an IP address,
    or localhost); a host name is checked when the webhook is sent (checked_address)."""
    literal = "127.0.0.1" if host.lower().rstrip(".") == "localhost" else host
    try:
        address = ipaddress.ip_address(literal)
    except ValueError:
        return
    if network := blocking_network(address):
        raise BlockedAddress(refusal(host, address, network))


def checked_address(host, port):
    """Resolve the host; return its first address, to connect to, when none of its addresses
    is in a blocked network. Raise BlockedAddress otherwise, OSError when it does not resolve."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in found]
    for address in addresses:
        if network := blocking_network(address):
            raise BlockedAddress(refusal(host, address, network))
    return str(addresses[0])
