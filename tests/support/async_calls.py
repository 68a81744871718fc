"""Asynchronous calls (``Prefer: respond-async``): the functions, settings and wait shared by their e2e tests.

test_async_calls.py and test_async_callbacks.py deploy the same functions on platforms with the same fast
retries and wait on a call's state the same way.
"""

from __future__ import annotations

import time
from typing import Any

from tests.support.platform import Tenant

FAST_RETRIES = {"SLESS_ASYNC_RETRY_BACKOFF_SEC": "0.1", "SLESS_ASYNC_RETRY_BACKOFF_MAX_SEC": "0.3",
                "SLESS_ASYNC_MAX_RETRIES": "2"}
ECHO = ("def handle(event):\n"
        "    headers = {k.lower(): v for k, v in event['_headers'].items()}\n"
        "    return {'got': event.get('x'), 'path': event['_path'], 'rid': headers.get('x-request-id')}\n")
FAILING = "def handle(event):\n    raise RuntimeError('always broken')\n"


def wait_call(tenant: Tenant, call_id: str, states: tuple[str, ...] = ("succeeded", "dead"),
              timeout: float = 60) -> dict[str, Any]:
    """The call's record once its state is one of STATES (it is processed in the background)."""
    deadline = time.monotonic() + timeout
    call: dict[str, Any] = {}
    while time.monotonic() < deadline:
        call = tenant.api("GET", f"/calls/{call_id}", expect=200).json()
        if call["state"] in states:
            return call
        time.sleep(0.1)
    raise AssertionError(f"call {call_id} did not reach {states}: {call}")
