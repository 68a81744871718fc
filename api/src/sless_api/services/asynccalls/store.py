"""Where asynchronous calls wait and end: one table, in SQLite (`sless up`) or PostgreSQL (API replicas).

A call is claimed with a lease by one runner (PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so replicas never take the
same call; SQLite: ``BEGIN IMMEDIATE``). Every later write names the claiming owner, so a runner whose lease was
taken over cannot overwrite the new owner's outcome. A call whose runner died is queued again: at once when the
runner was a process on this host that is gone, otherwise when its lease ends. The table comes from the numbered
migrations shared with the invocation log.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from sless_api.services.asynccalls.model import AsyncCall, CallState
from sless_api.stores.migrate import migrate_postgres, migrate_sqlite

_COLUMNS = ("id", "namespace", "function", "method", "path", "headers", "body", "request_id", "created_at", "state",
            "attempts", "next_attempt_at", "lease_owner", "lease_until", "result_status", "result_headers",
            "result_body", "result_truncated", "error", "finished_at", "callback_url", "callback_state")
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM async_calls"  # noqa: S608 - constant columns
Row = Sequence[Any]


def _row(call: AsyncCall) -> tuple[Any, ...]:
    return (call.id, call.namespace, call.function, call.method, call.path, json.dumps(call.headers), call.body,
            call.request_id, call.created_at, call.state.value, call.attempts, call.next_attempt_at,
            call.lease_owner, call.lease_until, call.result_status, json.dumps(call.result_headers),
            call.result_body, int(call.result_truncated), call.error, call.finished_at, call.callback_url,
            call.callback_state)  # fmt: skip


def _call(row: Row) -> AsyncCall:
    (ident, namespace, function, method, path, headers, body, request_id, created_at, state, attempts,
     next_attempt_at, lease_owner, lease_until, result_status, result_headers, result_body, result_truncated,
     error, finished_at, callback_url, callback_state) = row  # fmt: skip
    return AsyncCall(
        id=ident, namespace=namespace, function=function, method=method, path=path,
        headers=[(k, v) for k, v in json.loads(headers)], body=bytes(body or b""), request_id=request_id,
        created_at=float(created_at), state=CallState(state), attempts=int(attempts),
        next_attempt_at=float(next_attempt_at), lease_owner=lease_owner or "", lease_until=float(lease_until or 0),
        result_status=None if result_status is None else int(result_status),
        result_headers=[(k, v) for k, v in json.loads(result_headers or "[]")], result_body=bytes(result_body or b""),
        result_truncated=bool(result_truncated), error=error,
        finished_at=None if finished_at is None else float(finished_at), callback_url=callback_url,
        callback_state=callback_state,
    )  # fmt: skip


class CallStore(Protocol):
    """Blocking methods: the runner and the API call them in a thread."""

    def add(self, call: AsyncCall) -> None: ...
    def get(self, namespace: str, call_id: str) -> AsyncCall | None: ...
    def list(self, namespace: str, function: str | None, state: str | None, limit: int,
             before: str | None) -> list[AsyncCall]: ...
    def claim(self, owner: str, now: float, lease_until: float) -> AsyncCall | None: ...
    def settle(self, call: AsyncCall, owner: str) -> bool: ...
    def release(self, call_id: str, owner: str, now: float) -> bool: ...
    def requeue_orphans(self, is_gone: Callable[[str], bool]) -> int: ...
    def take_callback(self, call_id: str, stuck_before: float) -> bool: ...
    def set_callback_state(self, call_id: str, state: str) -> None: ...
    def stale_callbacks(self, finished_before: float, limit: int) -> Sequence[AsyncCall]: ...
    def purge(self, finished_before: float) -> int: ...
    def close(self) -> None: ...


class _SqlStore:
    """The statements both databases share; subclasses run them (``?`` placeholders, rewritten for psycopg2)."""

    placeholder = "?"

    @contextlib.contextmanager
    def _transaction(self, immediate: bool = False) -> Iterator[Any]:
        raise NotImplementedError
        yield

    def _q(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    def add(self, call: AsyncCall) -> None:
        marks = ", ".join("?" for _ in _COLUMNS)
        with self._transaction() as cur:
            cur.execute(self._q(f"INSERT INTO async_calls ({', '.join(_COLUMNS)}) VALUES ({marks})"),  # noqa: S608
                        _row(call))

    def get(self, namespace: str, call_id: str) -> AsyncCall | None:
        with self._transaction() as cur:
            cur.execute(self._q(f"{_SELECT} WHERE namespace = ? AND id = ?"), (namespace, call_id))
            row = cur.fetchone()
        return None if row is None else _call(row)

    def list(self, namespace: str, function: str | None, state: str | None, limit: int,
             before: str | None) -> list[AsyncCall]:
        where, args = ["namespace = ?"], [namespace]
        if function is not None:
            where, args = [*where, "function = ?"], [*args, function]
        if state is not None:
            where, args = [*where, "state = ?"], [*args, state]
        if before is not None:
            where.append("(created_at, id) < (SELECT created_at, id FROM async_calls WHERE namespace = ? AND id = ?)")
            args += [namespace, before]
        sql = f"{_SELECT} WHERE {' AND '.join(where)} ORDER BY created_at DESC, id DESC LIMIT ?"
        with self._transaction() as cur:
            cur.execute(self._q(sql), (*args, int(limit)))
            return [_call(row) for row in cur.fetchall()]

    def settle(self, call: AsyncCall, owner: str) -> bool:
        """Write the outcome of an attempt (done, dead, or queued again) if OWNER still holds the call."""
        with self._transaction() as cur:
            cur.execute(self._q(
                "UPDATE async_calls SET state = ?, attempts = ?, next_attempt_at = ?, lease_owner = '', "
                "lease_until = 0, result_status = ?, result_headers = ?, result_body = ?, result_truncated = ?, "
                "error = ?, finished_at = ? WHERE id = ? AND lease_owner = ? AND state = 'running'"),
                (call.state.value, call.attempts, call.next_attempt_at, call.result_status,
                 json.dumps(call.result_headers), call.result_body, int(call.result_truncated), call.error,
                 call.finished_at, call.id, owner))  # fmt: skip
            return bool(cur.rowcount)

    def release(self, call_id: str, owner: str, now: float) -> bool:
        """Give back a call OWNER claimed and cut off unfinished (its process is stopping): queued again, due at
        NOW, so any runner takes it at once instead of after the lease; the cut attempt does not count against
        its retries (the platform stopped it, not the function). False when OWNER no longer held it."""
        with self._transaction() as cur:
            cur.execute(self._q(
                "UPDATE async_calls SET state = 'queued', lease_owner = '', lease_until = 0, next_attempt_at = ?, "
                "attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END "
                "WHERE id = ? AND lease_owner = ? AND state = 'running'"), (now, call_id, owner))  # fmt: skip
            return bool(cur.rowcount)

    def take_callback(self, call_id: str, stuck_before: float) -> bool:
        """Whether this runner is the one to deliver CALL_ID's callback: it was pending, or its delivery began
        for a call that ended before STUCK_BEFORE (the process sending it stopped); now it is sending."""
        with self._transaction() as cur:
            cur.execute(self._q("UPDATE async_calls SET callback_state = 'sending' WHERE id = ? AND "
                                "(callback_state = 'pending' OR (callback_state = 'sending' AND finished_at < ?))"),
                        (call_id, stuck_before))
            return bool(cur.rowcount)

    def set_callback_state(self, call_id: str, state: str) -> None:
        with self._transaction() as cur:
            cur.execute(self._q("UPDATE async_calls SET callback_state = ? WHERE id = ?"), (state, call_id))

    def stale_callbacks(self, finished_before: float, limit: int) -> Sequence[AsyncCall]:
        """Ended calls whose callback was never made (their runner stopped before or while delivering it)."""
        with self._transaction() as cur:
            cur.execute(self._q(f"{_SELECT} WHERE callback_state IN ('pending', 'sending') "
                                "AND state IN ('succeeded', 'dead') "
                                "AND finished_at < ? ORDER BY finished_at LIMIT ?"), (finished_before, int(limit)))
            return [_call(row) for row in cur.fetchall()]

    def requeue_orphans(self, is_gone: Callable[[str], bool]) -> int:
        with self._transaction(immediate=True) as cur:
            cur.execute("SELECT id, lease_owner FROM async_calls WHERE state = 'running'")
            orphans = [ident for ident, owner in cur.fetchall() if is_gone(owner)]
            for ident in orphans:
                cur.execute(self._q("UPDATE async_calls SET state = 'queued', lease_owner = '', lease_until = 0 "
                                    "WHERE id = ? AND state = 'running'"), (ident,))
        return len(orphans)

    def purge(self, finished_before: float) -> int:
        with self._transaction() as cur:
            cur.execute(self._q("DELETE FROM async_calls WHERE state IN ('succeeded', 'dead') AND finished_at < ?"),
                        (finished_before,))
            return int(cur.rowcount)


class SqliteCallStore(_SqlStore):
    """`sless up`'s store: the invocation log's SQLite file (WAL), one connection under a lock."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA busy_timeout = 30000")
        migrate_sqlite(self._db)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _transaction(self, immediate: bool = False) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            try:
                yield self._db.cursor()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def claim(self, owner: str, now: float, lease_until: float) -> AsyncCall | None:
        with self._transaction(immediate=True) as cur:
            cur.execute(f"{_SELECT} WHERE (state = 'queued' AND next_attempt_at <= ?) OR "
                        "(state = 'running' AND lease_until < ?) ORDER BY next_attempt_at LIMIT 1", (now, now))
            row = cur.fetchone()
            if row is None:
                return None
            call = _call(row)
            cur.execute("UPDATE async_calls SET state = 'running', lease_owner = ?, lease_until = ?, "
                        "attempts = attempts + 1 WHERE id = ?", (owner, lease_until, call.id))
        call.state, call.lease_owner, call.lease_until, call.attempts = (CallState.RUNNING, owner, lease_until,
                                                                         call.attempts + 1)
        return call

    def close(self) -> None:
        with self._lock:
            self._db.close()


class PostgresCallStore(_SqlStore):
    """The store API replicas share; a connection per thread from a small pool, reopened after a failure."""

    placeholder = "%s"

    def __init__(self, dsn: str) -> None:
        import psycopg2.pool

        from sless_api.stores.postgres import connect_options

        self._pool = psycopg2.pool.ThreadedConnectionPool(1, 8, dsn, **connect_options("sless-async"))
        with self._connection() as conn:
            migrate_postgres(conn)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Any]:
        from sless_api.stores.postgres import DISCONNECTS

        conn = self._pool.getconn()
        broken = False
        try:
            yield conn
        except DISCONNECTS:
            broken = True
            raise
        finally:
            self._pool.putconn(conn, close=broken or bool(conn.closed))

    @contextlib.contextmanager
    def _transaction(self, immediate: bool = False) -> Iterator[Any]:
        with self._connection() as conn, conn, conn.cursor() as cur:
            yield cur

    def claim(self, owner: str, now: float, lease_until: float) -> AsyncCall | None:
        with self._transaction() as cur:
            cur.execute(
                f"UPDATE async_calls SET state = 'running', lease_owner = %s, lease_until = %s, "  # noqa: S608
                f"attempts = attempts + 1 WHERE id = (SELECT id FROM async_calls WHERE (state = 'queued' AND "
                f"next_attempt_at <= %s) OR (state = 'running' AND lease_until < %s) ORDER BY next_attempt_at "
                f"LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING {', '.join(_COLUMNS)}", (owner, lease_until, now, now))
            row = cur.fetchone()
        return None if row is None else _call(row)

    def close(self) -> None:
        self._pool.closeall()


def store_from_url(url: str) -> CallStore:
    """The store in the invocation log's database (``sqlite:///path`` or ``postgresql://...``)."""
    if url.startswith("sqlite:///"):
        from sless_api.stores.invocations import sqlite_path

        return SqliteCallStore(sqlite_path(url))
    return PostgresCallStore(url)
