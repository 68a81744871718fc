"""Streamed responses of the Python runtime (runtimes/README.md, "Streaming").

A handler streams by returning, as its result or as the ``body`` of a response description, a generator, an
async generator, or any other iterator / async iterator: each chunk (``str`` as UTF-8, or bytes) is sent the
moment it is produced, with ``Transfer-Encoding: chunked``.

Why the chunks are produced apart from the connection's thread: the timeout of a stream is the longest wait for
its next chunk, and Python cannot interrupt a thread stuck in ``next()``. A synchronous iterator therefore runs
in a producer thread of its own, one chunk at a time on request (it never runs ahead of the client); an async
one runs on the runtime's shared event loop, where a stalled ``__anext__`` is cancelled. The connection's
thread waits for each chunk with the timeout and writes it.

Kept apart from server.py on purpose: the server only hands a response with a ``stream`` to ``send_stream``.
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import sless_runtime as rt

#: What the producer thread answers when the iterator is exhausted.
_END = object()


class StreamCut(OSError):
    """The stream failed or stalled after its head was sent: the connection must close without the final chunk
    (an OSError, so the server's "client gone" path closes it)."""


class Idle(Exception):
    """No chunk came within the timeout."""


def chunk_bytes(chunk: Any) -> bytes:
    """One chunk as bytes: ``str`` (UTF-8) or bytes-like; anything else cannot be sent."""
    if isinstance(chunk, str):
        return chunk.encode("utf-8", "surrogatepass")
    if isinstance(chunk, (bytes, bytearray, memoryview)):
        return bytes(chunk)
    raise rt.InvalidResponse(f"a stream chunk must be str or bytes, got {type(chunk).__name__}")


class _Producer:
    """Produces a stream's chunks on request, each wait bounded by ``timeout``."""

    def __init__(self, stream: Any, context: contextvars.Context, loop: Callable[[], Any]) -> None:
        self.context = context
        self.is_async = hasattr(type(stream), "__anext__") or hasattr(type(stream), "__aiter__")
        self.stream = stream.__aiter__() if self.is_async and not hasattr(type(stream), "__anext__") else stream
        self.loop: Any = loop() if self.is_async else None
        self.requests: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self.answers: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None

    def next(self, timeout: float) -> Any:
        """The next chunk (any type), ``_END`` at the end; raises Idle, or what the iterator raised."""
        if self.is_async:
            import asyncio

            future = self.context.run(asyncio.run_coroutine_threadsafe, _anext(self.stream), self.loop)
            try:
                return future.result(timeout)
            except TimeoutError:
                future.cancel()
                raise Idle() from None
        if self.thread is None:
            self.thread = threading.Thread(target=self.context.run, args=(self._work,), name="sless-stream",
                                           daemon=True)
            self.thread.start()
        self.requests.put(True)
        try:
            ok, value = self.answers.get(timeout=timeout)
        except queue.Empty:
            raise Idle() from None
        if not ok:
            raise value
        return value

    def _work(self) -> None:
        """The producer thread: one ``next()`` per request; a False request closes the iterator and ends."""
        iterator = self.stream
        while self.requests.get():
            try:
                self.answers.put((True, next(iterator)))
            except StopIteration:
                self.answers.put((True, _END))
                return
            except BaseException as exc:  # the handler's failure, reported by the writer
                self.answers.put((False, exc))
                return
        close = getattr(iterator, "close", None)
        if close is not None:
            try:
                close()
            except Exception as exc:  # logged; the stream is over anyway
                rt.log_exception("stream failed while closing", exc)

    def close(self) -> None:
        """End the stream early (client gone, timeout, failure): a generator's ``finally`` runs."""
        if self.is_async:
            import asyncio

            aclose = getattr(self.stream, "aclose", None)
            if aclose is not None:
                future = self.context.run(asyncio.run_coroutine_threadsafe, _quiet(aclose()), self.loop)
                future.add_done_callback(lambda _: None)
        elif self.thread is not None:
            self.requests.put(False)  # taken once a stalled next() returns


async def _anext(stream: Any) -> Any:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return _END


async def _quiet(awaitable: Any) -> None:
    try:
        await awaitable
    except Exception as exc:  # logged; the stream is over anyway
        rt.log_exception("stream failed while closing", exc)


def _head(resp: rt.Response, first: Any, keep_alive: bool, http10: bool, date_header: bytes, waited_ms: float,
          status_line: Callable[[int], bytes]) -> bytes:
    headers = []
    has_type = False
    for name, value in resp.headers:
        lower = name.lower()
        # the handler's time runs until the head, as in the other runtimes
        shown = f"{float(value) + waited_ms:.3f}" if lower == rt.HANDLER_MS_HEADER.lower() else value
        has_type = has_type or lower == "content-type"
        headers.append(f"{name}: {shown}\r\n".encode("latin-1"))
    if not has_type:
        kind = "application/octet-stream" if isinstance(first, (bytes, bytearray, memoryview)) else rt.TEXT_TYPE
        headers.append(f"Content-Type: {kind}\r\n".encode("latin-1"))
    if not http10:
        headers.append(b"Transfer-Encoding: chunked\r\n")
    headers.append(date_header)
    if not keep_alive:
        headers.append(b"Connection: close\r\n")
    return status_line(resp.status) + b"".join(headers) + b"\r\n"


def send_stream(send: Callable[[bytes], None], resp: rt.Response, keep_alive: bool, head_only: bool, http10: bool,
                date_header: bytes, status_line: Callable[[int], bytes], loop: Callable[[], Any],
                timeout: float, failed: Callable[[rt.Response], bytes],
                take_output: Callable[[], str | None]) -> bool:
    """Write a streamed response with ``send``; True when the connection may serve another request.

    The head goes out with the first chunk, with X-Sless-Output when ``take_output`` gives it (the lines the
    call wrote until then: the handler's, and the stream's own before its first chunk). Before the first
    chunk, an idle timeout answers 504 and a failure 500 (``failed`` serializes those complete
    answers). After it, both raise StreamCut: the caller closes the connection without the final chunk, so the
    client sees a cut response, never a clean end. A client that is gone raises OSError from ``send``. Either
    way the iterator is closed (a generator's ``finally`` runs).
    """
    producer = _Producer(resp.stream, resp.context or contextvars.copy_context(), loop)
    finished = False
    began = time.perf_counter()
    try:
        try:
            first = producer.next(timeout)
            data = b"" if first is _END else chunk_bytes(first)
        except Idle:
            message = rt.timeout_message(timeout)
            rt.log(f"stream: {message}")
            send(failed(rt.error_response(504, message, "Timeout")))
            return keep_alive
        except BaseException as exc:  # the handler's failure
            rt.log_exception("stream failed", exc)
            send(failed(rt.exception_response(exc)))
            return keep_alive
        bodyless = head_only or resp.status in (204, 304)
        keep = keep_alive and not http10  # HTTP/1.0 has no chunks: the end of the body is the connection's
        output = take_output()
        if output is not None:
            resp.headers.append((rt.OUTPUT_HEADER, output))
        send(_head(resp, first, keep, http10, date_header, (time.perf_counter() - began) * 1000, status_line))
        if bodyless:
            return keep_alive
        while first is not _END:
            if data:
                send(data if http10 else b"%x\r\n%b\r\n" % (len(data), data))
            try:
                first = producer.next(timeout)
                data = b"" if first is _END else chunk_bytes(first)
            except Idle:
                rt.log(f"stream idle: {rt.timeout_message(timeout)}: cut")
                raise StreamCut("stream idle") from None
            except BaseException as exc:  # the handler's failure
                rt.log_exception("stream failed after its head: cut", exc)
                raise StreamCut("stream failed") from None
        if not http10:
            send(b"0\r\n\r\n")
        finished = True
        return keep
    finally:
        if not finished:
            producer.close()


def collect_streams(result: Any) -> Any:
    """A result with its streams read to the end (the one-shot runner's result is one value): a stream becomes
    the text of its chunks joined (bytes read as UTF-8), in a bare result as in a response description's body."""
    if rt.is_stream(result):
        return _join(result)
    status = result.get("statusCode") if isinstance(result, dict) else None
    if isinstance(status, int) and not isinstance(status, bool) and rt.is_stream(result.get("body")):
        return {**result, "body": _join(result["body"])}
    return result


def _join(stream: Any) -> str:
    kind = type(stream)
    if hasattr(kind, "__anext__") or hasattr(kind, "__aiter__"):
        import asyncio

        async def gather() -> list[bytes]:
            return [chunk_bytes(chunk) async for chunk in stream]

        parts = asyncio.run(gather())
    else:
        parts = [chunk_bytes(chunk) for chunk in stream]
    return b"".join(parts).decode("utf-8", "replace")
