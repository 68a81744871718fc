"""The ASGI shapes the invoke path speaks (scope, receive, send), and what it reads of a connection's life."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def client_gone(receive: Receive) -> None:
    """Return once the client has disconnected (its request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
