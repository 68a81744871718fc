"""``sless-api``: the API under gunicorn with uvicorn workers (the production server).

One event loop per worker holds thousands of slow invocations at once (a call waits on a socket, not
on a thread), so functions running up to the 900 s maximum do not pin workers.

Slow clients: with uvicorn workers gunicorn parses nothing itself, so its ``limit_request_line``,
``limit_request_fields`` and ``worker_connections`` do not apply; each worker's uvicorn runs
``sless_api.gateway.slowclients``'s protocol instead (head deadline, head size cap, connection cap per worker,
from ``SLESS_HEADER_TIMEOUT_SEC``, ``SLESS_MAX_HEADER_BYTES``, ``SLESS_MAX_CONNECTIONS``).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gunicorn.app.base import BaseApplication
from uvicorn_worker import UvicornWorker  # type: ignore[import-untyped]

from sless_core.envconfig import ConfigError

if TYPE_CHECKING:  # imported in main(), once the metrics folder is set: the config's imports load prometheus_client
    from sless_api.main.config import ApiConfig

# Keep-alive between requests for clients behind a load balancer (which keeps its own connections open).
KEEPALIVE_SEC = 75
#: What a stopping worker needs after its calls in flight: the async runner's drain (10 s) and the invocation
#: log's flush (5 s), and some slack. The chart's terminationGracePeriodSeconds allows for it.
SHUTDOWN_AFTER_DRAIN_SEC = 20


class GuardedUvicornWorker(UvicornWorker):  # type: ignore[misc]
    """gunicorn's uvicorn worker, serving with the slow-client guard (the limits of the master's config)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # gunicorn's arbiter makes a worker as (age, ppid, sockets, app, timeout, cfg, log): the app is ours.
        from sless_api.gateway.slowclients import guarded_protocol

        app = args[3] if len(args) > 3 else kwargs["app"]
        # uvicorn_worker's extension point, read by its __init__.
        self.CONFIG_KWARGS = {"loop": "auto", "http": guarded_protocol(app.config.server)}
        super().__init__(*args, **kwargs)


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, options: dict[str, Any], config: ApiConfig) -> None:
        self.options = options
        self.config = config  # parsed once in the master; every forked worker serves with it
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        from sless_api.logsetup import configure_logging
        from sless_api.main.app import create_app

        configure_logging(self.config.logging)
        return create_app(self.config)


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
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    folder = metrics_folder()  # before anything imports prometheus_client (it reads the folder at import)
    from sless_api.main.config import ApiConfig

    try:  # the one read of the environment: a bad value stops the master, not every worker
        config = ApiConfig.from_env(os.environ, keep_alive_default=KEEPALIVE_SEC)
    except ConfigError as exc:
        if not given:
            shutil.rmtree(folder, ignore_errors=True)
        print(f"sless-api: {exc}", file=sys.stderr)
        return 2
    options = gunicorn_options(config)
    _Gunicorn(options, config).run()
    return 0


def gunicorn_options(config: ApiConfig) -> dict[str, Any]:
    """gunicorn's settings. On SIGTERM a worker stops accepting and its calls in flight may run to their end:
    the graceful timeout is the longest a call or stream may last (``ApiConfig.drain_sec``) plus the shutdown
    after it, not gunicorn's 30 s default, which cut longer calls at every rollout of the API."""
    return {
        "bind": config.serve.bind,
        "workers": config.serve.workers,
        "worker_class": "sless_api.main.serve.GuardedUvicornWorker",
        "timeout": config.max_timeout_sec + 60,
        "graceful_timeout": math.ceil(config.drain_sec) + SHUTDOWN_AFTER_DRAIN_SEC,
        "keepalive": config.server.keep_alive_sec,
        "accesslog": None,  # sless_api.gateway.accesslog writes one JSON line per request instead
        "child_exit": _worker_exited,
    }


if __name__ == "__main__":
    sys.exit(main())
