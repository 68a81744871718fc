"""A code update under load: the new version takes over with no failed request."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from tests.support.platform import Tenant
from tests.support.poll import holds

pytestmark = pytest.mark.e2e


def version(n: int) -> dict[str, str | bytes]:
    return {"handler.py": f"import time\n\ndef handle(event):\n    time.sleep(0.01)\n    return 'v{n}'\n"}


def test_redeploy_under_load_fails_no_request(tenant: Tenant) -> None:
    tenant.deploy("rolling", "python3.11", version(1))
    url = tenant.fn_url("rolling")
    stop = threading.Event()
    seen: list[str] = []
    failures: list[str] = []

    def hammer() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    resp = session.get(url, timeout=30)
                except requests.RequestException as exc:
                    failures.append(repr(exc))
                    continue
                if resp.status_code != 200:
                    failures.append(f"{resp.status_code} {resp.text[:200]}")
                else:
                    seen.append(resp.text)

    workers = [threading.Thread(target=hammer) for _ in range(6)]
    for w in workers:
        w.start()
    try:
        for n in (2, 3, 4):
            time.sleep(0.5)  # the scenario: each version serves the load a while before the next upload
            tenant.upload("rolling", version(n))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (not seen or seen[-1] != f"v{n}"):
                time.sleep(0.05)
        holds("no call failed through the redeploys and after them", lambda: failures == [], for_sec=0.5,
              why="6 callers call back to back (a call takes ~10 ms), so a call hurt by the last switch (an old "
              "process going away) fails within the next few dozen calls; 0.5 s is many times that")
    finally:
        stop.set()
        for w in workers:
            w.join(60)
    assert failures == [], failures[:5]
    assert len(seen) > 100
    assert seen[-1] == "v4"
    order = [int(s[1:]) for s in seen]
    assert {1, 4} <= set(order)
