"""Which addresses are not on the public internet, and which URL hosts name such an address by their text alone.

One rule for what an agent connects to (`rockbot.agent.egress`, checked where it connects) and what a Tool or an
Agent may name (the operator's checks, before anything runs): loopback, private (the cluster's Service and pod
ranges among them), link-local (the cloud metadata endpoint, 169.254.169.254) and other special-purpose addresses
are not public. Who may open which of them is the cluster administrator's call (the chart's
`agents.privateNetworks`), never a Tool or Agent author's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Names of the cloud metadata endpoint (GCE's; the others are reached by address).
_METADATA_NAMES = ("metadata", "metadata.google.internal")


def non_public_reason(address: IPAddress) -> str | None:
    """Why an address is not on the public internet (loopback, private, ...), or None if it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return non_public_reason(address.ipv4_mapped)
    for reason, flag in (
        ("an unspecified address", address.is_unspecified),
        ("a loopback address", address.is_loopback),
        ("a link-local address", address.is_link_local),
        ("a multicast address", address.is_multicast),
        ("a private address", address.is_private),
        ("a reserved address", address.is_reserved),
        ("a special-purpose address", not address.is_global),
    ):
        if flag:
            return reason
    return None


def literal_address(host: str) -> IPAddress | None:
    """The address a URL's host is written as (`10.0.0.1`, `[fd00::1]`), or None for a name."""
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def internal_name_reason(host: str) -> str | None:
    """Why a host name leads inside the node or the cluster whatever it resolves to today, or None."""
    name = host.rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return "a name of this machine (loopback)"
    if name in _METADATA_NAMES:
        return "the cloud metadata endpoint's name"
    if name.endswith((".svc", ".cluster.local")) or ".svc." in name:
        return "a name of the cluster's Services"
    if "." not in name:
        return "a one-label name (the cluster's DNS completes it to a Service of the pod's namespace)"
    return None


def within(network: IPNetwork, allowed: Iterable[IPNetwork]) -> bool:
    """Whether all of `network` lies in one of the `allowed` networks."""
    return any(network.version == other.version and network.subnet_of(other) for other in allowed)  # type: ignore[arg-type]
