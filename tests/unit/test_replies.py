"""The portable writer of `/fn` answers (`replies.AsgiReply`), used under any ASGI server but uvicorn's httptools
protocol: the ASGI messages it sends, and when it is chosen. (`CycleReply` is checked on the wire, in
tests/e2e/test_proxy_wire.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

from sless_api.gateway.replies import AsgiReply, reply_for


class Recorder:
    """An ASGI ``send`` that keeps what it is given (what a server would write)."""

    def __init__(self) -> None:
        self.messages: list[MutableMapping[str, Any]] = []

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.messages.append(message)


def test_an_answer_is_a_start_and_body_messages_with_its_count() -> None:
    recorder = Recorder()
    reply = reply_for(recorder.send, "GET")
    assert isinstance(reply, AsgiReply) and reply.status == 0

    async def write() -> None:
        await reply.start(200, [(b"content-length", b"5")], b"ab", more=True)
        await reply.more(b"cde", more=False)

    asyncio.run(write())
    assert recorder.messages == [
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]},
        {"type": "http.response.body", "body": b"ab", "more_body": True},
        {"type": "http.response.body", "body": b"cde", "more_body": False},
    ]
    assert (reply.status, reply.sent) == (200, 5)


def test_abort_uses_the_servers_abort_when_it_has_one() -> None:
    aborted: list[bool] = []
    reply_for(Recorder().send, "GET", lambda: aborted.append(True)).abort()
    reply_for(Recorder().send, "GET").abort()  # none given: returning with the answer unfinished is all there is
    assert aborted == [True]
