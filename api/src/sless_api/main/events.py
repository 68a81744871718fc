"""``sless-events``: the event dispatcher of the Kubernetes backend, as a process (a Deployment) of its own.

It runs the same :class:`~sless_api.services.events.dispatcher.Dispatcher` as `sless up`, wired by
:mod:`.kube`: event triggers from a watch, calls to the functions' Services through the invoker,
invocation records and the idempotency store in PostgreSQL. Several replicas may run: each consumes
every trigger's queue (the broker spreads the messages) and the shared store keeps one message id
from running twice (:mod:`.pgdedup`).

| variable | default | meaning |
|---|---|---|
| ``SLESS_RABBITMQ_URL`` | required | the broker |
| ``SLESS_DATABASE_URL`` | required | ``postgresql://...``: invocation log and idempotency store |
| ``KUBECONFIG`` | in-cluster | as the API (``SLESS_KUBE_*`` too) |
| ``SLESS_EVENTS_HOST`` | ``127.0.0.1`` | where ``/health`` and ``/ready`` listen (``0.0.0.0`` in a pod) |
| ``SLESS_EVENTS_PORT`` | ``8091`` | their port |
| ``SLESS_EVENT_*`` | | the dispatcher's knobs (events README) |
| ``SLESS_MAX_TIMEOUT_SEC``, ``SLESS_MAX_BODY_BYTES`` | | as the API |
| ``SLESS_PROXY_TIMEOUT_MARGIN_SEC``, ``SLESS_PROXY_STREAM_MAX_SEC`` | | as the API |
| ``SLESS_LOG_LEVEL``, ``SLESS_LOG_FORMAT`` | ``INFO``, ``json`` | as the API |
| ``SLESS_METRICS_TOKEN`` | unset: off | ``/metrics`` on the probe port answers this bearer token only |

``/health``: the process and its event loop answer. ``/ready``: connected to RabbitMQ and the trigger
list loaded (503 otherwise, and from SIGTERM on). SIGTERM (or SIGINT): stop consuming at once,
let calls in flight finish for up to ``SLESS_EVENT_DRAIN_SEC`` (messages waiting for a retry go back
to the queue with their attempts remembered), flush the invocation log, exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass

from sless_api import tracing
from sless_api.backends.kube.client import KubeClient
from sless_api.backends.kube.events import KubeEvents, event_router
from sless_api.backends.settings import KubeSettings
from sless_api.gateway.invoker import Invoker
from sless_api.logsetup import configure_logging
from sless_api.main.config import ApiConfig
from sless_api.services.events.config import EventsConfig
from sless_api.services.events.pgdedup import PostgresDedupStore
from sless_api.services.events.probes import Probes
from sless_api.stores.invocations import log_from_url
from sless_core.envconfig import ConfigError

log = logging.getLogger("sless.events.service")
EXIT_CONFIG = 2


@dataclass(frozen=True)
class ServiceSettings:
    """Where ``sless-events`` listens (its probes) and which broker and database it uses."""

    rabbitmq_url: str
    database_url: str
    host: str = "127.0.0.1"
    port: int = 8091

    @classmethod
    def from_config(cls, config: ApiConfig) -> ServiceSettings:
        """What this process needs beyond the API's config: a broker, and a database all replicas share."""
        if not config.rabbitmq_url:
            raise ConfigError("SLESS_RABBITMQ_URL is required: the broker whose queues event triggers name")
        database = config.database_url
        if database.split(":", 1)[0].lower() not in ("postgresql", "postgres"):
            raise ConfigError("SLESS_DATABASE_URL must be a postgresql:// URL: the invocation log and the "
                              "idempotency store that all dispatcher replicas share")
        return cls(rabbitmq_url=config.rabbitmq_url, database_url=database, host=config.probes.host,
                   port=config.probes.port)


async def serve(settings: ServiceSettings, config: ApiConfig, events_config: EventsConfig,
                kube_settings: KubeSettings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    invocations = log_from_url(settings.database_url)
    store = PostgresDedupStore(settings.database_url)
    try:
        kube = KubeClient(kube_settings)
    except Exception as exc:  # no kubeconfig, no service account
        log.error("cannot reach Kubernetes: %s: %s", type(exc).__name__, exc)
        invocations.close(1.0)
        store.close()
        return EXIT_CONFIG
    router, table = event_router(kube, kube_settings)
    invoker = Invoker(router, invocations, config.proxy_timeout_margin_sec, config.stream_max_sec)
    events = KubeEvents(router, table, invoker, events_config, store, config.max_body_bytes)
    probes = Probes(events, invocations, config.metrics_token)
    try:
        await probes.start(settings.host, settings.port)
        await events.start()
        log.info("sless-events: probes on %s:%d, consuming the queues of event triggers", settings.host,
                 settings.port)
        await stop.wait()
        log.info("stopping: no new messages; calls in flight finish (up to %.0fs)", events_config.drain_sec)
        probes.stopping = True
        await events.close()
    finally:
        await invoker.close()
        kube.close()
        await probes.stop()
        invocations.close(5.0)
        store.close()
    log.info("stopped: %s", dict(events.dispatcher.stats))
    return 0


def main() -> int:
    try:
        config = ApiConfig.from_env(os.environ)  # the one read of the environment
        settings = ServiceSettings.from_config(config)
    except ConfigError as exc:
        print(f"sless-events: configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    assert config.events is not None  # SLESS_RABBITMQ_URL is set
    configure_logging(config.logging)
    tracing.configure("sless-events", os.environ)
    try:
        return asyncio.run(serve(settings, config, config.events, config.kube))
    finally:
        tracing.shutdown()


if __name__ == "__main__":
    sys.exit(main())
