"""The Kubernetes dispatcher's view of a Trigger object: what it consumes and how it delivers."""

from __future__ import annotations

from typing import Any

from sless_api.backends.kube.events import event_trigger_view


def trigger(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "sless.dev/v1alpha1", "kind": "Trigger",
            "metadata": {"name": "on-orders", "namespace": "sless-0123456789abcdef"}, "spec": spec}


def test_an_event_trigger_is_at_most_once_unless_it_says_otherwise() -> None:
    base = {"type": "event", "function": "f", "queue": "orders"}
    plain = event_trigger_view(trigger(base))
    assert plain is not None and (plain.queue, plain.at_least_once) == ("orders", False)
    again = event_trigger_view(trigger({**base, "delivery": "at_least_once"}))
    assert again is not None and again.at_least_once
    assert event_trigger_view(trigger({**base, "delivery": "at_most_once"})).at_least_once is False  # type: ignore[union-attr]


def test_an_invalid_delivery_or_another_type_is_not_consumed() -> None:
    assert event_trigger_view(trigger({"type": "event", "function": "f", "queue": "q", "delivery": "twice"})) is None
    assert event_trigger_view(trigger({"type": "http", "function": "f"})) is None
