"""Streamed responses through `sless up`'s `/fn`: chunks and Server-Sent Events pass as they are produced,
the invocation record counts the whole stream, idle time is limited and total time capped, and a client that
leaves mid-stream ends the function's stream."""

from __future__ import annotations

import asyncio
import http.client
import time
from pathlib import Path

import aiohttp
import pytest
import requests

from tests.support.platform import Tenant, running_sless
from tests.support.platform import invocation_record as record
from tests.support.streams import open_stream, read_until

pytestmark = pytest.mark.e2e

# A Node.js function whose streams wait at a gate another request opens (`/open`): one process serves both, so
# a chunk read before `/open` was sent while the handler was still running.
STREAMER = r"""
let opened = () => {};
let gate = new Promise((resolve) => { opened = resolve; });
let closedStreams = 0;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

exports.handle = async (event) => {
  const query = event._query || {};
  switch (event._path) {
    case '/open':
      opened();
      gate = new Promise((resolve) => { opened = resolve; });
      return { opened: true };
    case '/closed':
      return { closed: closedStreams };
    case '/sse': {
      const held = gate;
      return {
        statusCode: 200,
        headers: { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' },
        body: (async function* events() {
          yield 'data: one\n\n';
          await held;
          yield 'data: two\n\n';
        })(),
      };
    }
    case '/ticks':
      return (async function* ticks() {
        try {
          for (let i = 0; !query.n || i < Number(query.n); i++) {
            yield `tick ${i}\n`;
            await sleep(Number(query.ms || 50));
          }
        } finally {
          closedStreams += 1;
        }
      })();
    default:
      return { statusCode: 404, body: { error: 'no such case' } };
  }
};
"""


@pytest.fixture
def streamer(tenant: Tenant) -> Tenant:
    tenant.deploy("streamer", "nodejs20", {"handler.js": STREAMER}, timeout_sec=1)
    return tenant


def test_server_sent_events_pass_through_as_produced(streamer: Tenant) -> None:
    conn, resp = open_stream(streamer.fn_url("streamer", "/sse"), "sse-1")
    assert resp.status == 200
    assert resp.getheader("Content-Type") == "text/event-stream"
    assert resp.getheader("Cache-Control") == "no-cache"
    assert resp.getheader("Content-Length") is None and resp.getheader("Transfer-Encoding") == "chunked"
    assert resp.getheader("X-Sless-Handler-Ms") is None  # the platform's, removed as from every answer
    assert read_until(resp, b"\n\n") == b"data: one\n\n"  # the handler waits at its gate until /open
    first_at = time.monotonic()
    time.sleep(0.3)  # not a proof of anything: a hold the record's duration must include
    assert requests.get(streamer.fn_url("streamer", "/open"), timeout=30).json() == {"opened": True}
    held_for = time.monotonic() - first_at
    assert resp.read() == b"data: two\n\n"
    conn.close()
    rec = record(streamer, "streamer", "sse-1")
    assert rec["status"] == 200 and rec["error"] is None
    assert rec["response_bytes"] == len(b"data: one\n\ndata: two\n\n")
    assert rec["duration_ms"] >= held_for * 1000  # to the end of the stream, not to its head


def test_stream_timeout_is_idle_time_not_total_time(streamer: Tenant) -> None:
    started = time.monotonic()
    resp = requests.get(streamer.fn_url("streamer", "/ticks?n=6&ms=400"), timeout=60)
    elapsed = time.monotonic() - started
    assert resp.status_code == 200
    assert resp.text == "".join(f"tick {i}\n" for i in range(6))
    assert elapsed > 2.0  # twice the function's 1 s timeout in all, never idle for as long as it


def test_client_leaving_mid_stream_frees_the_call(streamer: Tenant) -> None:
    before = requests.get(streamer.fn_url("streamer", "/closed"), timeout=30).json()["closed"]
    conn, resp = open_stream(streamer.fn_url("streamer", "/ticks?ms=50"), "leaver-1")  # endless
    assert read_until(resp, b"tick 1\n").startswith(b"tick 0\n")
    conn.close()
    deadline = time.monotonic() + 15
    while requests.get(streamer.fn_url("streamer", "/closed"), timeout=30).json()["closed"] == before:
        assert time.monotonic() < deadline, "the function's stream kept running after its client left"
        time.sleep(0.1)
    rec = record(streamer, "streamer", "leaver-1")
    assert rec["status"] == 200 and "client disconnected" in rec["error"]
    assert rec["response_bytes"] > 0


def test_endless_stream_is_cut_at_the_total_cap(tmp_path: Path) -> None:
    with running_sless(tmp_path / "capped", {"SLESS_PROXY_STREAM_MAX_SEC": "3"}) as sp:
        tenant = Tenant(sp.url, "capped-streams")
        tenant.deploy("streamer", "nodejs20", {"handler.js": STREAMER}, timeout_sec=1)
        started = time.monotonic()
        conn, resp = open_stream(tenant.fn_url("streamer", "/ticks?ms=100"), "endless-1")  # busy, never idle
        assert resp.status == 200
        with pytest.raises(http.client.IncompleteRead):  # cut, never a clean end
            resp.read()
        conn.close()
        assert 3.0 <= time.monotonic() - started < 20
        assert "without completing response" not in sp.log_tail(400)  # a cut stream is no error of the server
        rec = record(tenant, "streamer", "endless-1")
        assert rec["status"] == 504 and "cut after 3s" in rec["error"]
        assert rec["response_bytes"] > 0
        deadline = time.monotonic() + 15
        while requests.get(tenant.fn_url("streamer", "/closed"), timeout=30).json()["closed"] == 0:
            assert time.monotonic() < deadline, "the function's stream kept running after the cut"
            time.sleep(0.1)
        # a WebSocket that is never idle is cut at the same cap
        tenant.deploy("wsecho", "python3.11", {"handler.py": WS_ECHO}, timeout_sec=1)
        kind, code, lasted = asyncio.run(chat(tenant.fn_url("wsecho").replace("http://", "ws://"), "chatty-1"))
        assert kind == aiohttp.WSMsgType.CLOSE and code == 1001 and 3.0 <= lasted < 20
        rec = record(tenant, "wsecho", "chatty-1")
        assert rec["status"] == 101 and "cut after 3s" in rec["error"]


WS_ECHO = "def handle(event):\n    return 'x'\n\ndef websocket(ws, event):\n    for m in ws:\n        ws.send(m)\n"


async def chat(url: str, request_id: str) -> tuple[aiohttp.WSMsgType, int | None, float]:
    """Send a message every 0.3 s (never idle) until the server closes; how, and after how long."""
    started = time.monotonic()
    async with aiohttp.ClientSession() as session, session.ws_connect(
            url, headers={"X-Request-Id": request_id}) as ws:
        while time.monotonic() - started < 30:
            await ws.send_str("still here")
            reply = await ws.receive(timeout=10)
            if reply.type != aiohttp.WSMsgType.TEXT:
                return reply.type, ws.close_code, time.monotonic() - started
            await asyncio.sleep(0.3)
    raise AssertionError("the connection was never cut")
