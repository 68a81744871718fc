"""A stand-in for S3's presigned GET on loopback, for the code fetchers' tests (``contextfetch`` and the
runtimes' own): a real HTTP server answering 403 without the right signature and 404 for a missing object."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager

GOOD_SIGNATURE = "X-Amz-Signature=good"


class Objects(http.server.BaseHTTPRequestHandler):
    """Serves ``objects`` (path -> bytes) to a request whose query holds ``GOOD_SIGNATURE``."""

    objects: dict[str, bytes] = {}

    def do_GET(self) -> None:
        if GOOD_SIGNATURE not in self.path:
            self.send_error(403)
            return
        data = self.objects.get(self.path.split("?", 1)[0])
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving() -> Iterator[str]:
    """The server's base URL while it runs in a thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Objects)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
