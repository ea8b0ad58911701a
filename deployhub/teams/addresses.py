"""Where outgoing webhooks may not go: settings.DEPLOYHUB_WEBHOOK_BLOCKED_NETWORKS, less
settings.DEPLOYHUB_WEBHOOK_OPEN_NETWORKS.

A team admin picks a webhook's URL and the hub POSTs to it, so without a check an admin
could make the hub call what only the hub can reach: its own host's services on
loopback, a cloud's metadata service on link-local (169.254.169.254). Every address a
webhook's host resolves to is checked when it is sent, with any IPv4 address an IPv6 one
carries (mapped, 6to4, Teredo, NAT64), and the connection goes only to the addresses that
were checked: a name that resolves elsewhere a moment later changes nothing.
"""

import ipaddress
import socket

from django.conf import settings

SETTING = "DEPLOYHUB_WEBHOOK_BLOCKED_NETWORKS"
NAT64 = ipaddress.ip_network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


class BlockedAddress(ValueError):
    """The host is, or resolves to, an address in a blocked network."""


def _networks(name):
    return [ipaddress.ip_network(network) for network in getattr(settings, name)]


def carried(address):
    """The address and each IPv4 address an IPv6 one carries: a gateway on the way (NAT64,
    6to4, Teredo) would deliver to that one."""
    found = [address]
    if isinstance(address, ipaddress.IPv6Address):
        found += [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
        if address in NAT64 or (address in IPV4_COMPATIBLE and int(address) > 1):
            found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [each for each in found if each is not None]


def blocking_network(address):
    """Return the blocked network that holds the address (an ip_address) or one it carries,
    unless an open network holds that one; None when no blocked network does."""
    blocked, opened = _networks(SETTING), _networks("DEPLOYHUB_WEBHOOK_OPEN_NETWORKS")
    for each in carried(address):
        if any(each.version == network.version and each in network for network in opened):
            continue
        for network in blocked:
            if each.version == network.version and each in network:
                return network
    return None


def refusal(host, address, network):
    named = host if str(address) == host else f"{host} ({address})"
    return (
        f"{named} is in {network}, which webhooks may not reach: the hub's own host, "
        f"cloud metadata services and the networks of {SETTING} are closed to them "
        f"(DEPLOYHUB_WEBHOOK_OPEN_NETWORKS opens one)."
    )


LOCALHOST = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


def literal_addresses(host):
    """The addresses a host names by itself (an IP address in any form the resolver takes,
    such as 127.1 or 2130706433, or localhost, both of its), or none for a name."""
    host = host.rstrip(".")
    if host.lower() == "localhost":
        return LOCALHOST
    try:
        return (ipaddress.ip_address(host.split("%")[0]),)
    except ValueError:
        pass
    try:
        return (ipaddress.IPv4Address(socket.inet_aton(host)),)
    except (OSError, ValueError):
        return ()


def check_literal_host(host):
    """Raise BlockedAddress for a host that names a blocked address by itself; a host name's
    addresses are checked when the webhook is sent (checked_addresses)."""
    for address in literal_addresses(host):
        if network := blocking_network(address):
            raise BlockedAddress(refusal(host, address, network))


def checked_addresses(host, port):
    """Resolve the host; return its addresses (as the resolver gave them, to connect to in
    turn) when none is in a blocked network. Raise BlockedAddress when one is, OSError
    when the host does not resolve."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    targets = list(dict.fromkeys(info[4][0] for info in found))
    if not targets:
        raise OSError(f"{host} resolves to no address")
    for target in targets:
        address = ipaddress.ip_address(target.split("%")[0])
        if network := blocking_network(address):
            raise BlockedAddress(refusal(host, address, network))
    return targets
