"""Callback URLs of asynchronous calls: checked before a call is stored, delivered once it has ended.

A callback URL makes the platform send a request to an address a tenant chose, which is a server-side request
forgery vector: unchecked, a tenant could make the platform POST into the network it runs in (the Kubernetes
API server, a cloud metadata service at 169.254.169.254, PostgreSQL, another tenant's pods). So the rule is deny
by default: http or https only, no credentials in the URL, and every address its host resolves to must be a
public one, unless it lies in a network the operator allowed (``SLESS_CALLBACK_ALLOWED_NETS``). The check runs
again when connecting (a resolver that drops refused addresses, and IP literals checked before the request), so
a name that resolved to a public address when the call was submitted and to a private one later (DNS rebinding)
reaches nothing. Redirects are never followed: a 3xx is a failed delivery.

IPv6 addresses that carry an IPv4 address are judged by it, since a packet to them ends up there: the
IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible ``::a.b.c.d`` and IPv4-translated ``::ffff:0:a.b.c.d`` forms
and the NAT64 well-known prefix ``64:ff9b::/96`` stand for their last 32 bits (a NAT64 gateway in the
platform's network translates ``64:ff9b::10.0.0.1`` to 10.0.0.1); the tunnel forms must pass both as IPv6
and by what they embed: 6to4 ``2002:AABB:CCDD::/48`` (its relay sends to AA.BB.CC.DD) and Teredo
``2001::/32`` (its server, bits 32-63, and its client, the last 32 bits inverted). The NAT64 local-use prefix
``64:ff9b:1::/48`` (RFC 8215) is refused whole unless an allowed network names it: the operator's
translator may embed the IPv4 address at any of RFC 6052's positions, so no position can be read reliably.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from sless_api.domain.errors import CallbackRefused

MAX_URL_LENGTH = 2048
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: IPv6 forms that stand for the IPv4 address in their last 32 bits: IPv4-compatible (RFC 4291, deprecated),
#: IPv4-translated (RFC 2765) and the NAT64 well-known prefix (RFC 6052). IPv4-mapped is Python's ipv4_mapped.
IPV4_IN_LAST_32_BITS = (ipaddress.IPv6Network("::/96"), ipaddress.IPv6Network("::ffff:0:0:0/96"),
                        ipaddress.IPv6Network("64:ff9b::/96"))
#: NAT64 for local use (RFC 8215): where it puts the IPv4 address is the operator's choice.
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")


def stands_for(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address that ADDRESS is another spelling of (mapped, compatible, translated, NAT64), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if any(address in net for net in IPV4_IN_LAST_32_BITS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def tunnelled_to(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses a tunnel address (6to4, Teredo) sends its packets through or to."""
    if address.sixtofour is not None:
        return (address.sixtofour,)
    if address.teredo is not None:
        return address.teredo  # (server, client): Python already inverts the client's bits
    return ()


@dataclass(frozen=True)
class CallbackPolicy:
    allowed_nets: tuple[IPNetwork, ...] = ()  # private networks the operator opened (e.g. an in-cluster receiver)
    timeout_sec: float = 10.0
    attempts: int = 3
    retry_sec: float = 1.0

    @staticmethod
    def parse_nets(text: str) -> tuple[IPNetwork, ...]:
        """``10.1.0.0/16, 127.0.0.1/32``: comma-separated networks, each a clear error when it is not one."""
        nets = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            try:
                nets.append(ipaddress.ip_network(part, strict=True))
            except ValueError as exc:
                raise ValueError(f"SLESS_CALLBACK_ALLOWED_NETS: {part!r} is not a network ({exc})") from None
        return tuple(nets)

    def allows(self, address: IPAddress) -> bool:
        """Whether a callback may go to ADDRESS: by the IPv4 address it carries, if it carries one."""
        if isinstance(address, ipaddress.IPv6Address):
            if address.scope_id is not None:  # fe80::1%eth0: the networks compare the address alone
                address = ipaddress.IPv6Address(int(address))
            ipv4 = stands_for(address)
            if ipv4 is not None:
                return self._allows_plain(ipv4)  # ::ffff:10.0.0.1 and 64:ff9b::10.0.0.1 are 10.0.0.1
            if address in NAT64_LOCAL_USE:
                return any(address in net for net in self.allowed_nets)
            if not all(self._allows_plain(ipv4) for ipv4 in tunnelled_to(address)):
                return False
        return self._allows_plain(address)

    def _allows_plain(self, address: IPAddress) -> bool:
        if any(address in net for net in self.allowed_nets):
            return True
        return address.is_global and not address.is_multicast


def _parse(url: str) -> tuple[str, int]:
    """The URL's host and port, or why it cannot be a callback."""
    if len(url) > MAX_URL_LENGTH:
        raise CallbackRefused(f"the callback URL is longer than {MAX_URL_LENGTH} characters")
    if not url.isascii() or any(c.isspace() or ord(c) < 32 for c in url):
        raise CallbackRefused("the callback URL must be plain ASCII without spaces or control characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise CallbackRefused("the callback URL must be http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise CallbackRefused("the callback URL must not carry credentials (user:password@)")
    if not parts.hostname:
        raise CallbackRefused("the callback URL has no host")
    try:
        port = parts.port
    except ValueError:
        raise CallbackRefused("the callback URL's port is not a number from 1 to 65535") from None
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    elif port == 0:
        raise CallbackRefused("the callback URL's port is not a number from 1 to 65535")
    return parts.hostname, port


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def check_url(url: str, policy: CallbackPolicy) -> str:
    """URL if a callback may go there now (blocking: it resolves the host); CallbackRefused says why not."""
    host, port = _parse(url)
    literal = _literal(host)
    if literal is not None:
        addresses: Sequence[IPAddress] = [literal]
    else:
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise CallbackRefused(f"the callback host {host!r} does not resolve ({exc})") from None
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in found]
    refused = sorted({str(a) for a in addresses if not policy.allows(a)})
    if refused:
        raise CallbackRefused(f"the callback host {host!r} is not a public address ({', '.join(refused)}); "
                              "private networks take the operator's SLESS_CALLBACK_ALLOWED_NETS")
    return url


class PolicyResolver(AbstractResolver):
    """Name resolution for deliveries: the addresses the policy refuses are dropped, so none is ever dialled."""

    def __init__(self, policy: CallbackPolicy) -> None:
        self.policy = policy
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        allowed = [r for r in found if self.policy.allows(ipaddress.ip_address(r["host"].split("%", 1)[0]))]
        if not allowed:
            raise OSError(f"{host} resolves to no address callbacks may reach")
        return allowed

    async def close(self) -> None:
        await self._inner.close()


class CallbackSender:
    """POSTs the outcome of ended calls to their callback URLs; one connection pool per API process."""

    def __init__(self, policy: CallbackPolicy) -> None:
        self.policy = policy
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(resolver=PolicyResolver(self.policy), limit=64)
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False,
                                                  timeout=aiohttp.ClientTimeout(total=self.policy.timeout_sec))
        return self._session

    async def deliver(self, url: str, payload: dict[str, Any], call_id: str, request_id: str) -> str:
        """Up to ``attempts`` POSTs until one answers 2xx; the outcome as the call's ``callback_state``."""
        host, _ = _parse(url)
        literal = _literal(host)
        if literal is not None and not self.policy.allows(literal):
            return f"failed: {host} is not an address callbacks may reach"
        headers = {"X-Sless-Call-Id": call_id, "X-Request-Id": request_id, "User-Agent": "sless-callback"}
        outcome = "failed: not attempted"
        for attempt in range(1, self.policy.attempts + 1):
            try:
                async with self._client().post(url, json=payload, headers=headers, allow_redirects=False) as resp:
                    await resp.read()
                    if 200 <= resp.status < 300:
                        return f"delivered: HTTP {resp.status}"
                    outcome = f"failed: HTTP {resp.status} after {attempt} attempt(s)"
                    if 300 <= resp.status < 400:
                        return outcome + " (redirects are not followed)"
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                outcome = f"failed: {type(exc).__name__}: {exc} after {attempt} attempt(s)"
            if attempt < self.policy.attempts:
                await asyncio.sleep(self.policy.retry_sec * attempt)
        return outcome

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def shown_url(url: str) -> str:
    """The callback URL as the tenant's call record shows it: without its query (it may hold a token)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"
