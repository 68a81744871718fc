"""Event triggers: RabbitMQ queues consumed by a dispatcher that calls functions (see README.md here)."""

from sless_api.services.events.config import EventsConfig
from sless_api.services.events.dedup import DedupStore, SqliteDedupStore
from sless_api.services.events.dispatcher import Dispatcher
from sless_api.services.events.model import CallResult, EventTarget, broker_queue, dead_letter_queue

__all__ = ["CallResult", "DedupStore", "Dispatcher", "EventTarget", "EventsConfig", "SqliteDedupStore",
           "broker_queue", "dead_letter_queue"]
