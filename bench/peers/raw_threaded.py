"""Second Python ceiling: the sless runtime's I/O model (one thread per connection, blocking sockets) bare.

Usage: ``python raw_threaded.py PORT`` (listens on 127.0.0.1, standard library only).

The same fixed answer as ``raw_asyncio.py``, served the way ``runtimes/python3.11/server.py`` serves:
an accept loop, a thread per connection, ``recv`` into a buffer, one ``sendall`` per response, TCP_NODELAY.
The gap between this row and the sless row is what the runtime spends on parsing, the event, the handler
call and the response encoding; the gap between this row and ``raw_asyncio`` is the I/O model itself.
"""

from __future__ import annotations

import socket
import sys
import threading

from peer_http import body_length, response, wants_close


def serve_connection(sock: socket.socket) -> None:
    buf = b""
    try:
        while True:
            end = buf.find(b"\r\n\r\n")
            while end < 0:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
                end = buf.find(b"\r\n\r\n")
            head = buf[:end].lower()
            buf = buf[end + 4:]
            length = body_length(head)
            while len(buf) < length:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
            buf = buf[length:]
            close = wants_close(head)
            sock.sendall(response(close))
            if close:
                return
    except OSError:
        pass
    finally:
        sock.close()


def main(port: int) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(1024)
    while True:
        sock, _ = listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve_connection, args=(sock,), daemon=True).start()


if __name__ == "__main__":
    main(int(sys.argv[1]))
