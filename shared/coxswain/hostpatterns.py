"""What the egress proxy lets a granted command reach: host patterns and address ranges.

Pure functions (no I/O), shared by the config's validation and the proxy
(:mod:`cox_runner.workspace.egress`), and unit-tested on their own.

Names: ``[sandbox] allow_hosts`` / ``deny_hosts`` hold patterns. ``pypi.org`` matches that name
only; ``*.pythonhosted.org`` matches every name under it (``files.pythonhosted.org``,
``a.b.pythonhosted.org``), not ``pythonhosted.org`` itself; an IP literal matches itself. Names
are compared lowercased, without a trailing dot. A deny match wins; a non-empty allow list
refuses every name it does not match.

Addresses: judged after the proxy resolved the name (and the proxy connects to the address it
judged). Refused: everything that is not globally reachable by IANA's special-purpose registries
(loopback, RFC 1918, CGNAT 100.64/10, link-local 169.254/16 and fe80::/10 where cloud metadata
lives, ULA fc00::/7, unspecified, documentation, benchmarking 198.18/15, reserved, ...) and
multicast; an IPv6 address that carries an IPv4 one (IPv4-mapped, IPv4-compatible, NAT64
64:ff9b::/96, 6to4 2002::/16) is judged by the IPv4 address it carries. ``[sandbox]
allow_networks`` lets chosen non-public ranges through (an internal mirror), except the
:data:`NEVER` ones.
"""

from __future__ import annotations

import ipaddress
import re

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
NAME_RE = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
PATTERN_RE = re.compile(rf"^(?:\*\.)?{_LABEL}(?:\.{_LABEL})*$")
MAX_NAME = 253

NEVER: tuple[tuple[IPNetwork, str], ...] = tuple((ipaddress.ip_network(n), why) for n, why in (
    ("127.0.0.0/8", "a loopback address"),
    ("::1/128", "a loopback address"),
    ("169.254.0.0/16", "a link-local address (cloud metadata lives there)"),
    ("fe80::/10", "a link-local address"),
    ("0.0.0.0/8", "an unspecified address"),
    ("::/128", "an unspecified address"),
    ("224.0.0.0/4", "a multicast address"),
    ("ff00::/8", "a multicast address"),
    ("255.255.255.255/32", "the broadcast address"),
))
"""Never reachable, whatever ``allow_networks`` says."""

NAMED: tuple[tuple[IPNetwork, str], ...] = tuple((ipaddress.ip_network(n), why) for n, why in (
    ("10.0.0.0/8", "a private address"),
    ("172.16.0.0/12", "a private address"),
    ("192.168.0.0/16", "a private address"),
    ("100.64.0.0/10", "a shared (CGNAT) address"),
    ("fc00::/7", "a unique local (private) address"),
    ("198.18.0.0/15", "a benchmarking address (not publicly routable)"),
    ("192.0.2.0/24", "a documentation address"),
    ("198.51.100.0/24", "a documentation address"),
    ("203.0.113.0/24", "a documentation address"),
    ("2001:db8::/32", "a documentation address"),
    ("240.0.0.0/4", "a reserved address"),
))
"""Names for the common refusals (the rest: "not a public address")."""

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_COMPAT = ipaddress.ip_network("::/96")


def normalize_host(host: str) -> str | None:
    """``host`` as the rules compare it (lowercased, no trailing dot, an IPv6 literal without
    brackets), or None when it is neither a host name nor an IP literal."""
    h = host.strip()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    try:
        return str(ipaddress.ip_address(h))
    except ValueError:
        pass
    h = h.lower()
    if h.endswith("."):
        h = h[:-1]
    if not h or len(h) > MAX_NAME or not NAME_RE.match(h):
        return None
    return h


def normalize_pattern(pattern: str) -> str:
    """A pattern of ``allow_hosts``/``deny_hosts`` as stored; raises ValueError when malformed."""
    p = pattern.strip().lower()
    if p.endswith("."):
        p = p[:-1]
    try:
        return str(ipaddress.ip_address(p.strip("[]")))
    except ValueError:
        pass
    if len(p) > MAX_NAME or not PATTERN_RE.match(p):
        raise ValueError(f"{pattern!r} is not a host pattern (a name like pypi.org, *.pythonhosted.org "
                         "for every name under one, or an IP address)")
    return p


def matches(host: str, pattern: str) -> bool:
    """Does the normalized ``host`` match the normalized ``pattern``?"""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def host_refusal(host: str, allow: list[str], deny: list[str]) -> str | None:
    """Why ``host`` (normalized) is refused by the patterns, or None when they let it through."""
    for p in deny:
        if matches(host, p):
            return f"{host} matches deny_hosts {p!r}"
    if allow and not any(matches(host, p) for p in allow):
        return f"{host} is not in allow_hosts"
    return None


def check_network(network: str) -> str:
    """A range of ``allow_networks`` as stored; raises ValueError when malformed or when it
    overlaps a range that is never reachable."""
    try:
        net = ipaddress.ip_network(network.strip(), strict=False)
    except ValueError:
        raise ValueError(f"{network!r} is not an address range (CIDR, like 10.20.0.0/16)") from None
    for never, why in NEVER:
        if net.version == never.version and net.overlaps(never):
            raise ValueError(f"allow_networks may not open {net} ({why} is never reachable from a command)")
    if net.version == 6:
        for carrier in (ipaddress.ip_network("::ffff:0:0/96"), _NAT64, _COMPAT, ipaddress.ip_network("2002::/16")):
            if net.overlaps(carrier):
                raise ValueError(f"allow_networks may not open {net} (it carries IPv4 addresses: name the "
                                 "IPv4 range instead)")
    return str(net)


def embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, compatible, NAT64, 6to4), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64 or (ip in _COMPAT and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    return None


def address_refusal(address: str | IPAddress, allow_networks: list[str] | tuple[str, ...] = ()) -> str | None:
    """Why a command may not reach ``address``, or None when it may."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_v4(ip)
        if inner is not None:
            why = address_refusal(inner, allow_networks)
            return f"{why} (carried in {ip})" if why else None
    for net, why in NEVER:
        if ip.version == net.version and ip in net:
            return why
    for n in allow_networks:
        net = ipaddress.ip_network(n)
        if ip.version == net.version and ip in net:
            return None
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_global:
        return None
    for net, why in NAMED:
        if ip.version == net.version and ip in net:
            return why
    return "not a public address"
