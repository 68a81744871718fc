"""Handlers that overrun and ignore their cancellation are abandoned with a 504; past a limit the process recycles.

Python cannot stop a thread and Go cannot stop a goroutine, so a handler that never returns keeps its
memory and its CPU. Node has no such leftovers (a busy loop blocks the whole process, which the
platform's health probe catches; a pending promise costs nothing), so only Python and Go are here.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests

ServerFactory = Callable[..., Any]
STUBBORN_PATH = {"python3.11": "/slow?s=8", "go1.23": "/stubborn?s=8"}


@pytest.mark.parametrize("runtime", sorted(STUBBORN_PATH))
def test_past_the_limit_the_process_drains_and_exits_75(runtime: str, start_server: ServerFactory) -> None:
    server = start_server(runtime, env={"SLESS_TIMEOUT_SEC": "0.5", "SLESS_MAX_ABANDONED_HANDLERS": "3",
                                        "SLESS_DRAIN_SEC": "5"})
    url = server.url + STUBBORN_PATH[runtime]
    # Two abandoned handlers: still serving.
    for _ in range(2):
        assert requests.get(url, timeout=30).status_code == 504
    assert requests.get(server.url + "/_/health", timeout=10).status_code == 200
    assert server.proc.poll() is None
    # The third one crosses the limit: the answer is still a 504, then the process drains and exits.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        third = pool.submit(requests.get, url, timeout=30)
        assert third.result().status_code == 504
    deadline = time.monotonic() + 15
    while server.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.proc.returncode == 75, server.stderr
    assert "recycl" in server.stderr


@pytest.mark.parametrize("runtime", sorted(STUBBORN_PATH))
def test_handlers_that_finish_late_are_no_longer_counted(runtime: str, start_server: ServerFactory) -> None:
    server = start_server(runtime, env={"SLESS_TIMEOUT_SEC": "0.3", "SLESS_MAX_ABANDONED_HANDLERS": "2"})
    late = server.url + STUBBORN_PATH[runtime].replace("s=8", "s=0.6")
    for _ in range(4):  # each finishes 0.3 s after its 504, before the next one is abandoned
        assert requests.get(late, timeout=30).status_code == 504
        time.sleep(0.6)
    assert server.proc.poll() is None
    assert requests.get(server.url + "/_/health", timeout=10).status_code == 200
