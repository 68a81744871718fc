"""``sless-scaler``: KEDA's external push scaler for functions, fed by the load reports of the API processes.

KEDA's ScaledObject of a scaled function names it in an ``external-push`` trigger (metadata ``scalerAddress``:
this service, ``function``: the function's name, ``target``: calls in flight per pod, default 10). The API and
event processes report their calls per function (in flight, and waiting for a replica) every second while they
have any, and at once when a call starts waiting for a function at zero replicas; the scaler sums the live
reports and pushes "active" to KEDA's stream the moment one arrives (:mod:`sless_api.services.scaling`).

| variable | default | meaning |
|---|---|---|
| ``SLESS_SCALER_LISTEN`` | ``0.0.0.0:9090`` | ``host:port`` of the gRPC server (KEDA, reports, health) |
| ``SLESS_SCALER_TOKEN_FILE`` | | a file holding the bearer token reports must carry (a mounted Secret) |
| ``SLESS_SCALER_TOKEN`` | | the token itself, when no file is given; one of the two is required (16+ characters) |
| ``SLESS_SCALER_REPORT_TTL_SEC`` | ``5`` | how long a report counts when it names no ttl of its own |
| ``SLESS_SCALER_MAX_TTL_SEC`` | ``60`` | the longest ttl a report may ask for |
| ``SLESS_SCALER_MAX_REPORTERS`` | ``1000`` | live reporting processes kept at most (past it: RESOURCE_EXHAUSTED) |
| ``SLESS_SCALER_MAX_FUNCTIONS`` | ``5000`` | functions in one report at most |
| ``SLESS_SCALER_MAX_STREAMS`` | ``10000`` | ``StreamIsActive`` streams open at once at most (one per scaled function) |
| ``SLESS_SCALER_KEEPALIVE_SEC`` | ``5`` | ``StreamIsActive`` resends the current state this often |
| ``SLESS_SCALER_GRACE_SEC`` | ``5`` | on SIGTERM, how long calls in progress may finish |
| ``SLESS_LOG_LEVEL``, ``SLESS_LOG_FORMAT`` | ``INFO``, ``auto`` | as the API (JSON lines in a pod) |

Health: the standard gRPC health service (``grpc.health.v1.Health``, service ``""``) on the same port, for the
kubelet's native ``grpc`` probe: no second port or HTTP server, and the answer comes from the very server KEDA
talks to. It says NOT_SERVING from SIGTERM on. SIGTERM (or SIGINT): the streams end (KEDA reconnects), calls in
progress get ``SLESS_SCALER_GRACE_SEC``, exit 0. Exit 2 on a configuration error, 1 when the port is taken.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from sless_api.logsetup import LogSettings, configure_logging
from sless_api.services.scaling.config import ScalerConfig
from sless_api.services.scaling.server import ScalerServer
from sless_core.envconfig import ConfigError

log = logging.getLogger("sless.scaler.service")
EXIT_CONFIG = 2
EXIT_LISTEN = 1


async def serve(config: ScalerConfig) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = ScalerServer(config)
    try:
        port = await server.start()
    except (OSError, RuntimeError) as exc:
        log.error("cannot listen on %s: %s", config.listen, exc)
        return EXIT_LISTEN
    host = config.listen.rpartition(":")[0]
    log.info("sless-scaler: KEDA external push scaler, load reports and gRPC health on %s:%d", host, port,
             extra={"listen": f"{host}:{port}"})
    await stop.wait()
    log.info("stopping: streams end, calls in progress get %.0fs", config.grace_sec)
    await server.stop()
    log.info("stopped", extra={"reporters": server.state.loads.reporters})
    return 0


def main() -> int:
    try:
        logging_settings = LogSettings.from_env(os.environ)
        config = ScalerConfig.from_env(os.environ)
    except ConfigError as exc:
        print(f"sless-scaler: configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(logging_settings)
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
