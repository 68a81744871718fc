"""A private RabbitMQ broker for the tests, started from Debian's rabbitmq-server on loopback.

Each broker gets its own node name, AMQP port, distribution port, epmd port, Mnesia and log
directories and a generated ``rabbitmq.conf`` that binds to 127.0.0.1, so it never meets the
system broker (left stopped by ``scripts/install-test-services.sh``) or another test run.

Fixtures (session scoped): ``rabbitmq_broker`` (a :class:`RabbitBroker` with ``stop``/``start``/
``kill`` for broker-restart tests; whoever stops it must start it again) and ``rabbitmq_url``.
When the broker cannot start, the fixture fails with the reason and the log tail: never a skip.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.support.services import INSTALL_HINT, ServiceError, free_port

#: A cold Erlang VM plus RabbitMQ's boot steps on a loaded 2-core machine.
START_TIMEOUT = 120
STOP_TIMEOUT = 60
#: The broker's consumer_timeout (ms): above the longest a dispatcher holds one message with the
#: defaults (4 attempts x (900 s + margin) + backoff), as the events README asks of a production broker.
CONSUMER_TIMEOUT_MS = 4 * 3600 * 1000
SERVER_GLOBS = ("/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin/rabbitmq-server",)


def server_script() -> Path:
    """The rabbitmq-server start script itself (not Debian's wrapper, which insists on /var/lib)."""
    override = os.environ.get("SLESS_RABBITMQ_SERVER")
    if override:
        return Path(override)
    found = sorted(p for pattern in SERVER_GLOBS for p in Path("/").glob(pattern.lstrip("/")))
    if not found:
        raise ServiceError(f"no rabbitmq-server under /usr/lib/rabbitmq; {INSTALL_HINT}")
    return found[-1]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class RabbitBroker:
    """One private broker node; its data survives stop/start (durable queues, persistent messages)."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.script = server_script()
        self.amqp_port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.nodename = f"sless-test-{uuid.uuid4().hex[:10]}@localhost"
        self.log_dir = base_dir / "log"
        self.console_log = base_dir / "console.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._as = _run_as()
        for sub in ("mnesia", "log", "home"):
            (base_dir / sub).mkdir(parents=True, exist_ok=True)
        (base_dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}\n"
            "loopback_users.guest = true\n"
            "log.console = true\n"
            "log.console.level = warning\n"
            "log.file.level = info\n"
            "disk_free_limit.absolute = 10MB\n"
            f"consumer_timeout = {CONSUMER_TIMEOUT_MS}\n")
        (base_dir / "enabled_plugins").write_text("[].\n")
        (base_dir / "rabbitmq-env.conf").write_text("")
        if self._as is not None:
            for path in [base_dir, *base_dir.rglob("*")]:
                os.chown(path, self._as.pw_uid, self._as.pw_gid)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    def _env(self) -> dict[str, str]:
        base = self.base_dir
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            "HOME": str(base / "home"),  # where Erlang keeps this node's own cookie
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.log_dir),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(base / "rabbit.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "LC_ALL": "C.UTF-8",
        })
        return env

    def start(self) -> None:
        """Start the node and wait until it accepts an AMQP connection."""
        if self.proc is not None and self.proc.poll() is None:
            return
        kwargs: dict[str, object] = {}
        if self._as is not None:
            kwargs = {"user": self._as.pw_uid, "group": self._as.pw_gid, "extra_groups": []}
        with self.console_log.open("ab") as out:
            self.proc = subprocess.Popen(  # type: ignore[call-overload]
                [str(self.script)], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.base_dir, env=self._env(), start_new_session=True, **kwargs)
        deadline = time.monotonic() + START_TIMEOUT
        with _quiet("pika"):
            self._wait_amqp(deadline)

    def _wait_amqp(self, deadline: float) -> None:
        assert self.proc is not None
        last = "no attempt"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceError(f"rabbitmq-server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                conn = pika.BlockingConnection(pika.URLParameters(self.url + "?connection_attempts=1"
                                                                  "&socket_timeout=2"))
                conn.close()
                return
            except pika.exceptions.AMQPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.3)
        self.kill()
        raise ServiceError(f"RabbitMQ did not accept AMQP on {self.amqp_port} within {START_TIMEOUT}s "
                           f"({last}):\n{self.log_tail()}")

    def stop(self) -> None:
        """A clean broker shutdown (SIGTERM, which rabbitmq-server turns into ``rabbitmqctl stop``)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
        self._reap_group(proc.pid)

    def kill(self) -> None:
        """A crash: SIGKILL to the whole process group (the shell, the VM and its port programs)."""
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_TIMEOUT)

    def restart(self) -> None:
        self.stop()
        self.start()

    @staticmethod
    def _reap_group(pgid: int) -> None:
        """Port programs (erl_child_setup, inet_gethost) linger for a moment after the VM; end them."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)

    def close(self) -> None:
        """Stop the node and the epmd daemon it started on its private port."""
        self.stop()
        epmd = shutil.which("epmd") or next(iter(sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))), None)
        if epmd is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run([str(epmd), "-port", str(self.epmd_port), "-kill"], capture_output=True,
                               timeout=10, check=False, env={**os.environ, "ERL_EPMD_PORT": str(self.epmd_port)})

    def log_tail(self) -> str:
        logs = sorted(self.log_dir.glob("*.log"))
        text = f"--- {self.console_log} ---\n{_tail(self.console_log)}"
        for log in logs:
            text += f"\n--- {log} ---\n{_tail(log)}"
        return text

    # helpers for tests: a short blocking connection per call keeps them independent of the code under test

    def connection(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(self.url))


# ---------------------------------------------------------------------- helpers for tests


def publish(broker: RabbitBroker, queue: str, bodies: list[bytes | dict[str, Any]],
            props: Callable[[int], pika.BasicProperties] | None = None) -> None:
    """Publish with confirms to an existing queue (the dispatcher declares it); dicts as JSON with
    message ids ``m0, m1, ...`` unless ``props(i)`` says otherwise."""
    conn = broker.connection()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, passive=True)  # declared by the dispatcher, with its own settings
        for i, body in enumerate(bodies):
            raw = json.dumps(body).encode() if isinstance(body, dict) else body
            p = props(i) if props else pika.BasicProperties(message_id=f"m{i}", content_type="application/json",
                                                             delivery_mode=2)
            ch.basic_publish("", queue, raw, p)
    finally:
        conn.close()


def queue_counts(broker: RabbitBroker, queue: str) -> tuple[int, int]:
    """(ready messages, consumers); (0, 0) when the queue does not exist."""
    conn = broker.connection()
    try:
        ch = conn.channel()
        try:
            ok_ = ch.queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            return (0, 0)
        return ok_.method.message_count, ok_.method.consumer_count
    finally:
        conn.close()


def drain(broker: RabbitBroker, queue: str, expect: int, timeout: float = 30) -> list[tuple[Any, bytes]]:
    """Take ``expect`` messages off ``queue`` (waiting for them), acking each."""
    got: list[tuple[Any, bytes]] = []
    deadline = time.monotonic() + timeout
    conn = broker.connection()
    try:
        ch = conn.channel()
        while len(got) < expect and time.monotonic() < deadline:
            try:
                method, props, body = ch.basic_get(queue, auto_ack=True)
            except pika.exceptions.ChannelClosedByBroker:
                ch = conn.channel()
                method = None
            if method is None:
                time.sleep(0.1)
                continue
            got.append((props, body))
    finally:
        conn.close()
    assert len(got) == expect, f"{queue}: {len(got)} of {expect} messages"
    return got


def take_all(broker: RabbitBroker, queue: str) -> list[tuple[Any, bytes]]:
    """Every message ready in ``queue`` now (acked), none when the queue does not exist."""
    got: list[tuple[Any, bytes]] = []
    conn = broker.connection()
    try:
        ch = conn.channel()
        try:
            while True:
                method, props, body = ch.basic_get(queue, auto_ack=True)
                if method is None:
                    return got
                got.append((props, body))
        except pika.exceptions.ChannelClosedByBroker:
            return got
    finally:
        conn.close()


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Connection refusals while the broker boots are expected; keep them out of the test's log."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _run_as() -> pwd.struct_passwd | None:
    """As root, run the broker as the Debian ``rabbitmq`` user when it exists (Erlang is happier)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("rabbitmq")
    except KeyError:
        return None


@contextlib.contextmanager
def rabbitmq_server(attempts: int = 2) -> Iterator[RabbitBroker]:
    """A fresh private broker; stopped and removed at the end."""
    base = Path(tempfile.mkdtemp(prefix="sless-rabbit-"))
    os.chmod(base, 0o755)
    broker: RabbitBroker | None = None
    try:
        last: Exception | None = None
        for _ in range(attempts):
            candidate = RabbitBroker(Path(tempfile.mkdtemp(prefix="node-", dir=base)))
            try:
                candidate.start()
            except (ServiceError, OSError) as exc:
                last = exc
                candidate.close()
                continue
            broker = candidate
            break
        if broker is None:
            raise ServiceError(f"RabbitMQ did not start after {attempts} attempts: {last}")
        yield broker
    finally:
        if broker is not None:
            broker.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def rabbitmq_broker() -> Iterator[RabbitBroker]:
    """The session's broker. A test that stops it must start it again (use try/finally)."""
    try:
        cm = rabbitmq_server()
        broker = cm.__enter__()
    except (ServiceError, OSError) as exc:
        pytest.fail(f"RabbitMQ test broker could not be started: {exc}", pytrace=False)
    try:
        yield broker
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def rabbitmq_url(rabbitmq_broker: RabbitBroker) -> str:
    """``amqp://guest:guest@127.0.0.1:PORT/%2F`` of the session's broker."""
    return rabbitmq_broker.url
