"""Real PostgreSQL and S3 servers for the tests, started on loopback in throwaway directories.

Nothing here is a mock: PostgreSQL runs from the Debian server binaries, S3 from
``moto_server`` in its own virtualenv (its botocore pins conflict with the kubernetes
client in the project's venv). ``scripts/install-test-services.sh`` installs both.

When a service cannot be started the fixtures fail with the reason instead of skipping:
a CI run must never go green without having run the tests that need it.

Fixtures (session scoped): ``pg_url`` (a ``postgresql://`` URL of a fresh database),
``s3_endpoint`` (an :class:`S3Endpoint`). Fault tests that stop or freeze the database
use :func:`postgres_server` directly, so the shared session server is never disturbed.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

#: Seconds pg_ctl and moto_server may take to come up on a loaded 2-core machine.
START_TIMEOUT = 90
INSTALL_HINT = "run scripts/install-test-services.sh (as root) to install the test services"


class ServiceError(RuntimeError):
    """A test service could not be started; the message says why."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry on a lost race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------------------- PostgreSQL


def pg_bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<ver>/bin`` with initdb (or ``$SLESS_PG_BIN``)."""
    override = os.environ.get("SLESS_PG_BIN")
    if override:
        return Path(override)
    root = Path("/usr/lib/postgresql")
    versions = sorted(
        (p for p in root.glob("*/bin") if (p / "initdb").exists() and p.parent.name.isdigit()),
        key=lambda p: int(p.parent.name),
    )
    if not versions:
        raise ServiceError(f"no PostgreSQL server binaries under {root}; {INSTALL_HINT}")
    return versions[-1]


@dataclass(frozen=True)
class _RunAs:
    """The unprivileged account the server runs as (initdb and postgres refuse root)."""

    uid: int
    gid: int
    name: str


def _run_as() -> _RunAs | None:
    """None when we are not root; else the ``postgres`` system user (or ``nobody``)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return _RunAs(entry.pw_uid, entry.pw_gid, name)
    raise ServiceError("running as root and neither a 'postgres' nor a 'nobody' user exists")


class PostgresServer:
    """A private PostgreSQL cluster in a temporary directory, with fault-injection helpers."""

    def __init__(self, base_dir: Path, port: int, *, fsync: bool = False, database: str = "sless",
                 listen: str = "127.0.0.1") -> None:  # fmt: skip
        self.bin_dir = pg_bin_dir()
        self.listen = listen  # listen_addresses: loopback, plus e.g. an address pods reach
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.socket_dir = base_dir / "sock"
        self.log_file = base_dir / "postgres.log"
        self.port = port
        self.database = database
        self.superuser = "postgres"
        self.fsync = fsync
        self._as = _run_as()

    @property
    def url(self) -> str:
        """A libpq URL of the test database over TCP on loopback (trust authentication)."""
        return f"postgresql://{self.superuser}@127.0.0.1:{self.port}/{self.database}"

    # -- process plumbing

    def _run(self, argv: list[str], timeout: float = START_TIMEOUT) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, object] = {}
        if self._as is not None:
            kwargs = {"user": self._as.uid, "group": self._as.gid, "extra_groups": []}
        return subprocess.run(  # type: ignore[call-overload, no-any-return]
            argv,
            cwd=self.base_dir,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "LC_ALL": "C", "TZ": "UTC"},
            **kwargs,
        )

    def _check(self, what: str, proc: subprocess.CompletedProcess[str]) -> None:
        if proc.returncode != 0:
            raise ServiceError(
                f"{what} failed (exit {proc.returncode}): {proc.stdout}{proc.stderr}\n"
                f"--- {self.log_file} ---\n{_tail(self.log_file)}"
            )

    def init(self) -> None:
        """initdb with trust auth; the directory belongs to the unprivileged account."""
        for path in (self.data_dir, self.socket_dir):
            path.mkdir(mode=0o700)
        if self._as is not None:
            for path in (self.base_dir, self.data_dir, self.socket_dir):
                os.chown(path, self._as.uid, self._as.gid)
        self._check(
            "initdb",
            self._run(
                [
                    str(self.bin_dir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    self.superuser,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-sync",
                ]
            ),
        )

    def start(self) -> None:
        """Start the postmaster and wait until it accepts connections."""
        opts = (
            f"-c listen_addresses={self.listen} -c port={self.port} "
            f"-c unix_socket_directories={self.socket_dir} -c max_connections=100 "
            f"-c fsync={'on' if self.fsync else 'off'} -c full_page_writes={'on' if self.fsync else 'off'}"
        )
        proc = self._run(
            [
                str(self.bin_dir / "pg_ctl"),
                "start",
                "-w",
                "-t",
                str(START_TIMEOUT),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-o",
                opts,
            ],
            timeout=START_TIMEOUT + 10,
        )
        self._check("pg_ctl start", proc)

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE`` (fast, smart or immediate — the last is a crash)."""
        self.sigcont()  # a frozen server would never answer the shutdown request
        proc = self._run(
            [str(self.bin_dir / "pg_ctl"), "stop", "-w", "-t", "60", "-m", mode, "-D", str(self.data_dir)],
            timeout=90,
        )
        self._check(f"pg_ctl stop -m {mode}", proc)

    def running(self) -> bool:
        """Whether pg_ctl sees a live postmaster for the data directory."""
        proc = self._run([str(self.bin_dir / "pg_ctl"), "status", "-D", str(self.data_dir)], timeout=30)
        return proc.returncode == 0

    def create_database(self) -> None:
        proc = self._run(
            [
                str(self.bin_dir / "createdb"),
                "-h",
                str(self.socket_dir),
                "-p",
                str(self.port),
                "-U",
                self.superuser,
                self.database,
            ]
        )
        self._check("createdb", proc)

    # -- fault injection

    def postmaster_pid(self) -> int:
        """The postmaster's pid, from the first line of postmaster.pid."""
        return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])

    def server_pids(self) -> list[int]:
        """The postmaster and every process it forked (backends, checkpointer, walwriter...)."""
        master = self.postmaster_pid()
        return [master, *sorted(children_of(master))]

    def _signal_all(self, sig: signal.Signals, pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def sigstop(self, *, whole_server: bool = True) -> None:
        """Freeze the server: the postmaster alone (new connections hang) or every process
        (also open connections hang — what a stalled database looks like to a client)."""
        try:
            pids = self.server_pids() if whole_server else [self.postmaster_pid()]
        except (OSError, ValueError):
            return
        self._signal_all(signal.SIGSTOP, pids)

    def sigcont(self) -> None:
        """Undo :meth:`sigstop` (a no-op when the server is not running)."""
        try:
            pids = self.server_pids()
        except (OSError, ValueError):
            return
        self._signal_all(signal.SIGCONT, pids)

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: no shutdown checkpoint; the next start recovers."""
        self.stop("immediate")

    def restart(self) -> None:
        """Start again after :meth:`crash` or :meth:`stop` (same port, same data)."""
        self.start()


@contextlib.contextmanager
def postgres_server(*, fsync: bool = False, attempts: int = 3) -> Iterator[PostgresServer]:
    """A fresh PostgreSQL with database ``sless``; stopped (``-m fast``) and removed at the end."""
    base = Path(tempfile.mkdtemp(prefix="sless-pg-"))
    server: PostgresServer | None = None
    try:
        last: Exception | None = None
        for _ in range(attempts):
            # A new directory per attempt: a lost port race must not leave half a cluster behind.
            attempt_dir = Path(tempfile.mkdtemp(prefix="cluster-", dir=base))
            os.chmod(base, 0o755)  # the unprivileged server user must reach its directory
            candidate = PostgresServer(attempt_dir, free_port(), fsync=fsync)
            try:
                candidate.init()
                candidate.start()
                candidate.create_database()
            except (ServiceError, subprocess.TimeoutExpired, OSError) as exc:
                last = exc
                with contextlib.suppress(ServiceError, subprocess.TimeoutExpired, OSError):
                    if candidate.running():
                        candidate.stop("immediate")
                continue
            server = candidate
            break
        if server is None:
            raise ServiceError(f"PostgreSQL did not start after {attempts} attempts: {last}")
        yield server
    finally:
        if server is not None:
            with contextlib.suppress(ServiceError, subprocess.TimeoutExpired, OSError):
                server.sigcont()
                if server.running():
                    server.stop("fast")
        shutil.rmtree(base, ignore_errors=True)


def fresh_pg_database(base_url: str) -> str:
    """A new empty database on a running server; its URL (tests share one server, not one database)."""
    import uuid

    import psycopg2

    name = f"t_{uuid.uuid4().hex[:16]}"
    conn = psycopg2.connect(base_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return base_url.rsplit("/", 1)[0] + "/" + name


def sql(url: str, statement: str, *args: object, missing_table_ok: bool = False) -> list[tuple[Any, ...]]:
    """Run one statement on the database at URL; its rows ([] for a statement without any). MISSING_TABLE_OK: a
    table the platform has not created yet (its first write makes it) reads as no rows."""
    import psycopg2

    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement, args)
            return list(cur.fetchall()) if cur.description else []
    except psycopg2.errors.UndefinedTable:
        if missing_table_ok:
            return []
        raise
    finally:
        conn.close()


# ---------------------------------------------------------------------------- S3 (moto)


def tools_dir() -> Path:
    return Path(os.environ.get("SLESS_TOOLS_DIR", "/var/cache/sless-tools"))


@dataclass(frozen=True)
class S3Endpoint:
    """Where the S3 server listens and the credentials it accepts (moto accepts any)."""

    endpoint: str  # host:port, the form the minio client wants
    access_key: str
    secret_key: str
    bucket: str

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def env(self) -> dict[str, str]:
        """The SLESS_S3_* variables that point the platform at this server."""
        return {
            "SLESS_S3_ENDPOINT": self.endpoint,
            "SLESS_S3_ACCESS_KEY": self.access_key,
            "SLESS_S3_SECRET_KEY": self.secret_key,
            "SLESS_S3_BUCKET": self.bucket,
        }


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(f"moto_server exited with {proc.returncode}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer means it is serving
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise ServiceError(f"moto_server did not answer on {url} within {START_TIMEOUT}s:\n{_tail(log)}")


@contextlib.contextmanager
def s3_server(bucket: str = "sless-test", attempts: int = 3) -> Iterator[S3Endpoint]:
    """``moto_server -H 127.0.0.1 -p PORT`` from the tools venv; terminated at the end."""
    exe = tools_dir() / "moto-venv" / "bin" / "moto_server"
    if not exe.exists():
        raise ServiceError(f"{exe} is missing; {INSTALL_HINT}")
    workdir = Path(tempfile.mkdtemp(prefix="sless-s3-"))
    log = workdir / "moto.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        last: Exception | None = None
        for _ in range(attempts):
            port = free_port()
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    [str(exe), "-H", "127.0.0.1", "-p", str(port)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=workdir,
                    start_new_session=True,
                )
            try:
                _wait_http(f"http://127.0.0.1:{port}/", proc, log, time.monotonic() + START_TIMEOUT)
            except ServiceError as exc:
                last = exc
                _terminate(proc)
                proc = None
                continue
            break
        if proc is None:
            raise ServiceError(f"S3 server did not start after {attempts} attempts: {last}")
        yield S3Endpoint(f"127.0.0.1:{port}", "sless-test-access", "sless-test-secret", bucket)
    finally:
        if proc is not None:
            _terminate(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


# ---------------------------------------------------------------------------- pytest fixtures


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL (do not stop or freeze it; use postgres_server() for that)."""
    try:
        cm = postgres_server()
        server = cm.__enter__()
    except (ServiceError, OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"PostgreSQL test server could not be started: {exc}", pytrace=False)
    try:
        yield server
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def pg_url(pg_server: PostgresServer) -> str:
    """``postgresql://postgres@127.0.0.1:PORT/sless`` of the session's PostgreSQL."""
    return pg_server.url


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    """The session's S3 server (moto); the bucket is created by whoever uses it first."""
    try:
        cm = s3_server()
        endpoint = cm.__enter__()
    except (ServiceError, OSError) as exc:
        pytest.fail(f"S3 test server could not be started: {exc}", pytrace=False)
    try:
        yield endpoint
    finally:
        cm.__exit__(None, None, None)


def children_of(parent: int) -> set[int]:
    """Live or unreaped children of process ``parent``, from /proc."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == parent:
            found.add(int(entry.name))
    return found
