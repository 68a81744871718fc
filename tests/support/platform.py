"""`sless up` as a real process for end-to-end tests, and a small authenticated client for it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from sless_api.auth import issue_token
from sless_api.domain.archive import zip_bytes
from sless_core.naming import tenant_namespace
from tests.support.services import free_port

REPO = Path(__file__).resolve().parents[2]
SECRET = "e2e-secret-that-is-long-enough-for-hs256"
START_TIMEOUT = 60
#: A pooled connection idle this long is not reused. ``sless up`` closes a connection idle for 5 s
#: (``SLESS_KEEPALIVE_SEC``), and a request sent on it as the server closes it is reset: the client has to repeat
#: it (RFC 9112 9.3.1), which is not safe for a POST. Well under the server's limit, so no request meets the close.
REUSE_IDLE_SEC = 2.0


@dataclass
class SlessProcess:
    url: str
    data_dir: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_of(self, word: str, lines: int = 40) -> str:
        """The last LINES lines of the platform's log that mention WORD (a tenant's namespace): what a failed
        test shows of a platform shared by many tests."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join([line for line in text.splitlines() if word in line][-lines:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def start_sless(data_dir: Path, extra_env: dict[str, str] | None = None, port: int | None = None) -> SlessProcess:
    port = port or free_port()
    env = {**os.environ, "SLESS_JWT_SECRET": SECRET, "SLESS_IDLE_TIMEOUT_SEC": "300", **(extra_env or {})}
    env.pop("SLESS_DATABASE_URL", None) if "SLESS_DATABASE_URL" not in (extra_env or {}) else None
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / f"sless-up-{port}.log"
    out = open(log_path, "ab")  # noqa: SIM115 - handed to the child for its lifetime
    proc = subprocess.Popen(
        [sys.executable, "-m", "sless_api", "up", "--host", "127.0.0.1", "--port", str(port),
         "--data-dir", str(data_dir)],
        stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
    out.close()
    sp = SlessProcess(f"http://127.0.0.1:{port}", data_dir, proc, log_path, env)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sless up exited with {proc.returncode}:\n{sp.log_tail()}")
        try:
            if requests.get(sp.url + "/health", timeout=1).status_code == 200:
                return sp
        except requests.RequestException:
            pass
        time.sleep(0.1)
    sp.stop(signal.SIGKILL)
    raise RuntimeError(f"sless up did not answer /health in {START_TIMEOUT}s:\n{sp.log_tail()}")


@contextmanager
def serving(argv: list[str], env: dict[str, str], log_path: Path, url: str, umask: int = -1) -> Iterator[str]:
    """A server process (any of the platform's commands) until the block ends: started, ready once its
    /health answers, then stopped with SIGTERM (SIGKILL after 40 s)."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, umask=umask)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            try:
                if requests.get(url + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def running_sless(data_dir: Path, extra_env: dict[str, str] | None = None) -> Iterator[SlessProcess]:
    sp = start_sless(data_dir, extra_env)
    try:
        yield sp
    finally:
        sp.stop()


def make_zip(files: dict[str, str | bytes]) -> bytes:
    """Deterministic: the same files give the same bytes (and code hash) whenever the test runs."""
    return zip_bytes((name, content, False) for name, content in files.items())


class FreshSession(requests.Session):
    """A ``requests.Session`` that opens new connections after ``REUSE_IDLE_SEC`` without a request, rather than
    reuse one the server may be closing at that moment."""

    def __init__(self) -> None:
        super().__init__()
        self.last_used = time.monotonic()

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        if time.monotonic() - self.last_used > REUSE_IDLE_SEC:
            self.close()  # the pools are emptied; the next request makes a new connection
        try:
            return super().request(method, url, *args, **kwargs)
        finally:
            self.last_used = time.monotonic()


class Tenant:
    """One tenant's view of the API: its token, its namespace, helpers that assert on status codes."""

    def __init__(self, url: str, sub: str, secret: str = SECRET,
                 platform_log: Callable[[str], str] | None = None) -> None:
        self.url = url
        #: The platform's log lines of a namespace, shown when a function fails or never gets Ready.
        self.platform_log = platform_log
        self.sub = sub
        self.ns = tenant_namespace(sub)
        self.token = issue_token(secret, sub, 3600)
        self.http = FreshSession()
        self.http.headers["Authorization"] = f"Bearer {self.token}"

    def api(self, method: str, rest: str, expect: int | tuple[int, ...] | None = None, **kw: Any) -> requests.Response:
        resp = self.http.request(method, f"{self.url}/v1/namespaces/{self.ns}{rest}", timeout=60, **kw)
        if expect is not None:
            codes = (expect,) if isinstance(expect, int) else expect
            assert resp.status_code in codes, f"{method} {rest}: {resp.status_code} {resp.text[:500]}"
        return resp

    def fn_url(self, name: str, path: str = "") -> str:
        return f"{self.url}/fn/{self.ns}/{name}{path}"

    def deploy(self, name: str, runtime: str, files: dict[str, str | bytes], http: bool = True,
               wait: float = 180, **spec: Any) -> dict[str, Any]:
        self.api("POST", "/ensure", expect=(200, 201))
        self.api("POST", "/functions", json={"name": name, "runtime": runtime, **spec}, expect=201)
        self.upload(name, files)
        if http:
            self.api("POST", "/triggers", json={"name": name, "type": "http", "function": name}, expect=201)
        return self.wait_phase(name, ("Ready",), wait)

    def upload(self, name: str, files: dict[str, str | bytes]) -> requests.Response:
        return self.api("POST", f"/functions/{name}/upload", expect=202,
                        files={"code": ("code.zip", make_zip(files), "application/zip")})

    def wait_phase(self, name: str, phases: tuple[str, ...], wait: float = 180,
                   code_hash: str | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + wait
        record: dict[str, Any] = {}
        while time.monotonic() < deadline:
            record = self.api("GET", f"/functions/{name}", expect=200).json()
            if record["phase"] in phases and (code_hash is None or record["code_hash"] == code_hash):
                return record
            if record["phase"] == "Failed" and "Failed" not in phases:
                raise AssertionError(f"{name} failed: {record['message']}{self._log_note()}")
            time.sleep(0.2)
        raise AssertionError(f"{name} did not reach {phases} in {wait}s: {record}{self._log_note()}")

    def _log_note(self) -> str:
        return f"\nthe platform's log of {self.ns}:\n{self.platform_log(self.ns)}" if self.platform_log else ""

    def wait_job(self, name: str, wait: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + wait
        record: dict[str, Any] = {}
        while time.monotonic() < deadline:
            record = self.api("GET", f"/jobs/{name}", expect=200).json()
            if record["phase"] in ("Succeeded", "Failed"):
                return record
            time.sleep(0.2)
        raise AssertionError(f"job {name} did not finish in {wait}s: {record}")


def invocation_record(tenant: Tenant, name: str, request_id: str) -> dict[str, Any]:
    """The invocation record of the call with ``request_id`` (records are written in batches, a moment later)."""
    deadline = time.monotonic() + 30
    items: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        items = tenant.api("GET", f"/functions/{name}/invocations?limit=100", expect=200).json()["items"]
        for item in items:
            if item["request_id"] == request_id:
                return item
        time.sleep(0.1)
    raise AssertionError(f"no record of {request_id}: {items}")


def table_rows(stdout: str) -> list[list[str]]:
    """A CLI table's rows split at blanks, below its header row (checked to be one: the column names in capitals);
    an empty listing prints nothing at all."""
    lines = stdout.splitlines()
    if not lines:
        return []
    assert lines[0] == lines[0].upper() and lines[0].split()[0] in ("NAME", "VERSION", "ID"), lines[0]
    return [line.split() for line in lines[1:]]


def sless_cli(tenant: Tenant, *argv: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    """The ``sless`` command as a tenant runs it (token and URL from the environment); asserts its exit code and
    that no traceback reached its stderr."""
    env = {**os.environ, "SLESS_TOKEN": tenant.token, "SLESS_URL": tenant.url}
    done = subprocess.run([sys.executable, "-m", "sless_api", *argv], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == expect, (argv, done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr
    return done
