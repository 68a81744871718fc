"""Flask as the Fission and OpenFaaS Python environments serve a function, for the runtime benchmark.

Usage (with the peer virtualenv's interpreter, see venv.py): ``python flask_app.py bjoern|waitress PORT``.

- ``bjoern``: Fission's Python environment runs its Flask app with ``bjoern.run(app, host, port,
  reuse_port=True)`` (one process, libev event loop, WSGI in C).
- ``waitress``: OpenFaaS's python3-flask template runs ``waitress.serve(app, host=..., port=...)``
  (defaults: 4 worker threads).

The app mirrors those templates: a catch-all route that reads the request body, passes it to the user's
``handle`` and returns its string (Flask answers it as text/html). The handler is the same trivial one
the sless runtimes run.
"""

from __future__ import annotations

import sys

from flask import Flask, request  # type: ignore[import-not-found,import-untyped,unused-ignore]  # the peer venv's, not the project's

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def handle(req: bytes) -> str:
    """The trivial user function."""
    return "ok"


app = Flask(__name__)


def main_route(path: str = "") -> str:
    return handle(request.get_data())


app.add_url_rule("/", "main_route", main_route, defaults={"path": ""}, methods=METHODS)
app.add_url_rule("/<path:path>", "main_route", main_route, methods=METHODS)


def main(server: str, port: int) -> None:
    if server == "bjoern":
        import bjoern  # type: ignore[import-not-found,import-untyped,unused-ignore]

        bjoern.run(app, "127.0.0.1", port, reuse_port=True)
    elif server == "waitress":
        from waitress import serve  # type: ignore[import-not-found,import-untyped,unused-ignore]

        serve(app, host="127.0.0.1", port=port)
    else:
        raise SystemExit(f"unknown server {server!r}: bjoern or waitress")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
