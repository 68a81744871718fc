"""A stopping `sless-api` (gunicorn) lets its calls in flight run to their end.

On SIGTERM each worker stops accepting, and a call already running (here a stream that sends its first chunk,
then its last one 8 s later) is answered in full before the process exits: the graceful timeout follows the
longest call or stream the platform allows (``ApiConfig.drain_sec``), not a fixed 30 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from sless_api.main.config import ApiConfig
from sless_api.main.serve import SHUTDOWN_AFTER_DRAIN_SEC, gunicorn_options
from tests.support.platform import SECRET, Tenant
from tests.support.poll import until
from tests.support.services import free_port
from tests.support.streams import open_stream, read_until

pytestmark = pytest.mark.e2e

LATE_STREAM = r"""
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
exports.handle = async () => (async function* chunks() {
  yield 'first\n';
  await sleep(8000);
  yield 'last\n';
})();
"""


def test_the_graceful_timeout_is_the_longest_call_or_stream() -> None:
    base = {"SLESS_JWT_SECRET": SECRET}
    config = ApiConfig.from_env({**base, "SLESS_MAX_TIMEOUT_SEC": "900", "SLESS_PROXY_TIMEOUT_MARGIN_SEC": "5",
                                 "SLESS_PROXY_STREAM_MAX_SEC": "60"})
    assert gunicorn_options(config)["graceful_timeout"] == 905 + SHUTDOWN_AFTER_DRAIN_SEC
    config = ApiConfig.from_env({**base, "SLESS_MAX_TIMEOUT_SEC": "60"})  # streams may last an hour by default
    assert gunicorn_options(config)["graceful_timeout"] == 3600 + SHUTDOWN_AFTER_DRAIN_SEC


def test_a_call_in_flight_is_answered_in_full_after_sigterm(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "SLESS_JWT_SECRET": SECRET, "SLESS_DATA_DIR": str(tmp_path / "data"),
           "SLESS_BIND": f"127.0.0.1:{port}", "SLESS_WORKERS": "1"}
    env.pop("SLESS_DATABASE_URL", None)
    log_path = tmp_path / "sless-api.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sless_api.main.serve"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        until("sless-api answers", lambda: _answers(url + "/health"), 60)
        tenant = Tenant(url, "drain")
        tenant.deploy("late", "nodejs20", {"handler.js": LATE_STREAM})
        conn, resp = open_stream(tenant.fn_url("late"))
        assert resp.status == 200
        assert read_until(resp, b"first\n") == b"first\n"  # the call is in flight
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        until("no new connections once stopping", lambda: not _answers(url + "/health"), 30)
        rest = resp.read()  # the stream's end, 8 s after it began
        conn.close()
        assert rest == b"last\n", rest
        assert proc.wait(60) == 0, log_path.read_text(errors="replace")
        print(f"stopped {time.monotonic() - stopped:.1f}s after SIGTERM, its call answered in full")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False
