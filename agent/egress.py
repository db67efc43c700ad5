"""Which addresses a model-directed fetch may connect to, enforced where aiohttp connects.

A URL the model chose (or a page it read told it to choose) must not reach the pod's own
network: loopback, cluster services on private ranges, the cloud metadata endpoint on
169.254.169.254. Checking the URL's text is not enough (a public name can resolve to, or be
re-bound to, a private address; a redirect can point anywhere), so the check sits in the
connector: the resolver refuses a host name if any address it resolves to is not allowed, and
the socket factory refuses every address right before the socket connects, which covers literal
IPs (aiohttp does not resolve them) and every redirect hop. What is checked is what is connected.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from rockbot.addresses import IPNetwork, non_public_reason


class AddressRefused(OSError):
    """The destination is an address this agent may not fetch from (raised before any connection)."""

    def __init__(self, *, address: str, reason: str):
        super().__init__(f"{address} is {reason}")
        self.address = address
        self.reason = reason


class EgressPolicy:
    """Public addresses are allowed; a non-public one only inside an explicitly allowed network."""

    def __init__(self, *, allowed_networks: Sequence[IPNetwork] = ()):
        self.allowed_networks = tuple(allowed_networks)

    def check(self, host: str) -> None:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # drop an IPv6 scope id
        reason = non_public_reason(address)
        if reason is not None and not any(address in network for network in self.allowed_networks):
            raise AddressRefused(address=str(address), reason=reason)

    def connector(self) -> aiohttp.TCPConnector:
        return aiohttp.TCPConnector(resolver=_CheckingResolver(policy=self), socket_factory=self._socket)

    def _socket(self, addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        self.check(sockaddr[0])
        return socket.socket(family=family, type=type_, proto=proto)


class _CheckingResolver(AbstractResolver):
    """The default resolver, refusing a name when any of its addresses is refused (no partial answers)."""

    def __init__(self, *, policy: EgressPolicy):
        self.policy = policy
        self.resolver = aiohttp.DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        resolved = await self.resolver.resolve(host, port, family)
        for entry in resolved:
            self.policy.check(entry["host"])
        return resolved

    async def close(self) -> None:
        await self.resolver.close()
