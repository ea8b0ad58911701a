"""Where outgoing webhooks may not go, by three rules (settings.py, "Networks webhooks never
reach"), each named when it refuses an address:

1. always refused: loopback (the hub's own host), cloud metadata services, link-local and
   the other kinds of settings.WEBHOOK_ALWAYS_CLOSED. DEPLOYHUB_WEBHOOK_OPEN_NETWORKS opens
   none of them, except loopback in the embedded run (a receiver on the developer's machine);
2. private networks (settings.WEBHOOK_PRIVATE_NETWORKS) unless DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE;
3. the operator's DEPLOYHUB_WEBHOOK_BLOCKED_NETWORKS.
DEPLOYHUB_WEBHOOK_OPEN_NETWORKS opens a network inside rules 2 and 3.

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
OPEN_SETTING = "DEPLOYHUB_WEBHOOK_OPEN_NETWORKS"
PRIVATE_SETTING = "DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE"
NAT64 = ipaddress.ip_network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
LOOPBACK_UNLESS = (
    f"; in the embedded run {OPEN_SETTING}=127.0.0.1/32,::1/128 opens it for a receiver on the "
    "same machine, in production nothing does"
)


class BlockedAddress(ValueError):
    """The host is, or resolves to, an address a rule refuses; the message names the rule."""


def _networks(names):
    return [ipaddress.ip_network(network) for network in names]


def _within(address, networks):
    """The first of the networks that holds the address, or None."""
    for network in networks:
        if address.version == network.version and address in network:
            return network
    return None


def carried(address):
    """The address and each IPv4 address an IPv6 one carries: a gateway on the way (NAT64,
    6to4, Teredo) would deliver to that one."""
    found = [address]
    if isinstance(address, ipaddress.IPv6Address):
        found += [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
        if address in NAT64 or (address in IPV4_COMPATIBLE and int(address) > 1):
            found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [each for each in found if each is not None]


def _always_refused(address, opened):
    """Rule 1's sentence for an address (not one it carries) of an always-closed kind, or
    None: loopback opens in the embedded run only, the other kinds never."""
    if address.is_loopback and not settings.PRODUCTION and _within(address, opened):
        return None  # a receiver on the developer's own machine
    for kind, networks in settings.WEBHOOK_ALWAYS_CLOSED.items():
        if network := _within(address, _networks(networks)):
            unless = LOOPBACK_UNLESS if address.is_loopback else ", whatever the settings"
            return f"is {kind} ({network}), which webhooks never reach{unless}."
    return None


def _refused_by_setting(address, opened):
    """The sentence of rule 2 or 3 for an address, or None."""
    if _within(address, opened):
        return None
    private = _within(address, _networks(settings.WEBHOOK_PRIVATE_NETWORKS))
    if private and not settings.DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE:
        return (
            f"is in the private network {private}, which webhooks reach only when "
            f"{PRIVATE_SETTING} is on (it is off: production's default) or {OPEN_SETTING} opens it."
        )
    if network := _within(address, _networks(getattr(settings, SETTING))):
        return f"is in {network}, which {SETTING} closes to webhooks ({OPEN_SETTING} opens one)."
    return None


def refusal_of(address):
    """Return (the address refused: this one or one it carries, a sentence naming the rule
    and the network) when webhooks may not reach the address (an ip_address), else None."""
    opened = _networks(getattr(settings, OPEN_SETTING))
    for each in carried(address):
        if why := _always_refused(each, opened) or _refused_by_setting(each, opened):
            return each, why
    return None


def refusal(host, address, why):
    """The refusal's message, for the settings page and the delivery log."""
    carrier, sentence = why
    named = host if str(address) == host else f"{host} ({address})"
    if carrier != address:
        named = f"{named}, which carries {carrier},"
    return f"Refused: {named} {sentence}"


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
        if why := refusal_of(address):
            raise BlockedAddress(refusal(host, address, why))


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
        if why := refusal_of(address):
            raise BlockedAddress(refusal(host, address, why))
    return targets


def rules_in_force():
    """The rules as this hub applies them, in words for the settings page."""
    always = ", ".join(kind.split(",")[0] for kind in settings.WEBHOOK_ALWAYS_CLOSED)
    private = ", ".join(settings.WEBHOOK_PRIVATE_NETWORKS)
    allowed = "allowed" if settings.DEPLOYHUB_WEBHOOK_ALLOW_PRIVATE else "refused"
    added = [n for n in getattr(settings, SETTING) if n not in settings.WEBHOOK_CLOSED_NETWORKS]
    rules = [
        f"Always refused: {always} addresses.",
        f"Private networks ({private}): {allowed} ({PRIVATE_SETTING}).",
    ]
    if added:
        rules.append(f"Closed by the operator ({SETTING}): {', '.join(added)}.")
    if opened := getattr(settings, OPEN_SETTING):
        rules.append(f"Opened by the operator ({OPEN_SETTING}): {', '.join(opened)}.")
    return rules
