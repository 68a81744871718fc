"""``sless-api``: the API under gunicorn with uvicorn workers (the production server).

One event loop per worker holds thousands of slow invocations at once (a call waits on a socket, not
on a thread), so functions running up to the 900 s maximum do not pin workers.

Slow clients: with uvicorn workers gunicorn parses nothing itself, so its ``limit_request_line``,
``limit_request_fields`` and ``worker_connections`` do not apply; each worker's uvicorn runs
``sless_api.slowclients``'s protocol instead (head deadline, head size cap, connection cap per worker,
from ``SLESS_HEADER_TIMEOUT_SEC``, ``SLESS_MAX_HEADER_BYTES``, ``SLESS_MAX_CONNECTIONS``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication
from uvicorn_worker import UvicornWorker  # type: ignore[import-untyped]

from sless_api.config import ServerLimits
from sless_api.slowclients import guarded_protocol

# Keep-alive between requests for clients behind a load balancer (which keeps its own connections open).
KEEPALIVE_SEC = 75


class GuardedUvicornWorker(UvicornWorker):  # type: ignore[misc]
    """gunicorn's uvicorn worker, serving with the slow-client guard (limits read in the worker)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        limits = ServerLimits.from_env(keep_alive_default=KEEPALIVE_SEC)
        # uvicorn_worker's extension point, read by its __init__.
        self.CONFIG_KWARGS = {"loop": "auto", "http": guarded_protocol(limits)}
        super().__init__(*args, **kwargs)


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        from sless_api.app import create_app
        from sless_api.logsetup import configure_logging

        configure_logging()
        return create_app()


def _worker_exited(server: Any, worker: Any) -> None:
    """A dead worker's live gauges leave the multiprocess metrics folder (its counters stay summed)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]


def metrics_folder() -> str:
    """Where the workers' metrics meet: the operator's PROMETHEUS_MULTIPROC_DIR, else a fresh private folder
    (a folder left by an earlier run would add its counts to this one's)."""
    chosen = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix="sless-metrics-")
    for stale in Path(chosen).glob("*.db"):
        stale.unlink()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = chosen
    return chosen


def main() -> int:
    metrics_folder()  # before any worker imports prometheus_client
    max_timeout = int(os.environ.get("SLESS_MAX_TIMEOUT_SEC", "900"))
    limits = ServerLimits.from_env(keep_alive_default=KEEPALIVE_SEC)  # fail here, not in every worker
    options = {
        "bind": os.environ.get("SLESS_BIND", "127.0.0.1:8090"),
        "workers": int(os.environ.get("SLESS_WORKERS", "2")),
        "worker_class": "sless_api.serve.GuardedUvicornWorker",
        "timeout": max_timeout + 60,
        "graceful_timeout": 30,
        "keepalive": limits.keep_alive_sec,
        "accesslog": None,  # sless_api.accesslog writes one JSON line per request instead
        "child_exit": _worker_exited,
    }
    _Gunicorn(options).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
