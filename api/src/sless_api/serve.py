"""``sless-api``: the API under gunicorn with uvicorn workers (the production server).

One event loop per worker holds thousands of slow invocations at once (a call waits on a socket, not
on a thread), so functions running up to the 900 s maximum do not pin workers.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from gunicorn.app.base import BaseApplication


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        from sless_api.app import create_app

        return create_app()


def main() -> int:
    max_timeout = int(os.environ.get("SLESS_MAX_TIMEOUT_SEC", "900"))
    options = {
        "bind": os.environ.get("SLESS_BIND", "127.0.0.1:8090"),
        "workers": int(os.environ.get("SLESS_WORKERS", "2")),
        "worker_class": "uvicorn_worker.UvicornWorker",
        "timeout": max_timeout + 60,
        "graceful_timeout": 30,
        "keepalive": 75,
        "accesslog": None,
    }
    _Gunicorn(options).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
