"""Desired and observed state of the standalone backend, in SQLite under the data directory.

Everything needed to bring functions back after a restart lives here (specs, phases, where the built
artifact is), so `sless up` restarted on the same data dir serves the same functions without re-upload.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sless_api.backends.standalone.builder import BuildArtifact
from sless_api.domain.errors import NotFound
from sless_api.domain.records import FunctionRecord, JobRecord, TriggerRecord
from sless_api.domain.versions import Version, append, function_config
from sless_api.stores.datadir import create_private_file
from sless_core.models import FunctionSpec, JobSpec, TriggerSpec
from sless_core.traffic import TrafficSplit, parse_entries

SCHEMA = """
CREATE TABLE IF NOT EXISTS namespaces (name TEXT PRIMARY KEY, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS functions (
  namespace TEXT NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL, phase TEXT NOT NULL, message TEXT NOT NULL,
  code_hash TEXT, image TEXT, created_at REAL NOT NULL, last_built_at REAL, artifact TEXT,
  PRIMARY KEY (namespace, name));
CREATE TABLE IF NOT EXISTS triggers (
  namespace TEXT NOT NULL, name TEXT NOT NULL, function TEXT NOT NULL, spec TEXT NOT NULL, created_at REAL NOT NULL,
  last_fired_at REAL, message TEXT NOT NULL DEFAULT '', PRIMARY KEY (namespace, name));
CREATE TABLE IF NOT EXISTS versions (
  namespace TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL, code_hash TEXT NOT NULL,
  config TEXT NOT NULL, deployed_at REAL NOT NULL, PRIMARY KEY (namespace, name, version));
CREATE TABLE IF NOT EXISTS traffic (
  namespace TEXT NOT NULL, name TEXT NOT NULL, split TEXT NOT NULL, artifact TEXT, PRIMARY KEY (namespace, name));
CREATE TABLE IF NOT EXISTS jobs (
  namespace TEXT NOT NULL, name TEXT NOT NULL, function TEXT NOT NULL, spec TEXT NOT NULL, phase TEXT NOT NULL,
  message TEXT NOT NULL, started_at REAL, completed_at REAL, created_at REAL NOT NULL, PRIMARY KEY (namespace, name));
"""


def artifact_to_dict(artifact: BuildArtifact) -> dict[str, Any]:
    """A built artifact as stored in the functions table (paths as strings)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(artifact).items()}


def artifact_from_dict(data: dict[str, Any]) -> BuildArtifact:
    values = dict(data)
    for key in ("code_dir", "deps_dir", "bin_dir"):
        if values.get(key) is not None:
            values[key] = Path(values[key])
    return BuildArtifact(**values)


def require_function(state: StateStore, namespace: str, name: str) -> FunctionRecord:
    """The function, or NotFound (what every operation on a missing function answers)."""
    rec = state.get_function(namespace, name)
    if rec is None:
        raise NotFound(f"function {name!r} not found")
    return rec


class CorruptStateError(RuntimeError):
    """The state database cannot be read. Not moved aside on its own: it is every function's spec, and
    starting empty would look like every function had been deleted."""

    def __init__(self, path: Path, cause: Exception) -> None:
        super().__init__(
            f"the state database {path} is unreadable ({cause}). It holds every function, trigger and job: "
            f"restore it from a backup, or move it aside (mv {path} {path}.corrupt) to start with no functions "
            "and deploy them again.")


class StateStore:
    """A small, synchronous store: every call is a short local transaction, cheap enough for the event loop."""

    def __init__(self, path: Path) -> None:
        # Every function's env vars are in here: 0600 before SQLite creates it (its WAL and shm files
        # take the database's mode).
        create_private_file(path)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        try:
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            check = self._db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(check)
            self._db.executescript(SCHEMA)
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise CorruptStateError(path, exc) from None
        self._lock = threading.RLock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def generation(self) -> int:
        """A number that changes whenever anything in the store does: the rows this connection (the only
        writer: `sless up` is one process) has inserted, updated or deleted. What is read per call (an event's
        route) is kept while it stays the same."""
        return self._db.total_changes

    def _rows(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(sql, args))

    # namespaces
    def ensure_namespace(self, namespace: str, now: float) -> bool:
        with self._tx() as db:
            cur = db.execute("INSERT OR IGNORE INTO namespaces VALUES (?, ?)", (namespace, now))
            return cur.rowcount == 1

    # functions
    @staticmethod
    def _function(row: sqlite3.Row) -> FunctionRecord:
        return FunctionRecord(
            namespace=row["namespace"], spec=FunctionSpec.from_dict(json.loads(row["spec"])), phase=row["phase"],
            message=row["message"], code_hash=row["code_hash"], image=row["image"],
            created_at=row["created_at"], last_built_at=row["last_built_at"],
        )

    def list_functions(self, namespace: str | None = None) -> list[FunctionRecord]:
        if namespace is None:
            return [self._function(r) for r in self._rows("SELECT * FROM functions ORDER BY namespace, name")]
        rows = self._rows("SELECT * FROM functions WHERE namespace = ? ORDER BY name", namespace)
        return [self._function(r) for r in rows]

    def get_function(self, namespace: str, name: str) -> FunctionRecord | None:
        rows = self._rows("SELECT * FROM functions WHERE namespace = ? AND name = ?", namespace, name)
        return self._function(rows[0]) if rows else None

    def insert_function(self, rec: FunctionRecord, limit: int = 0) -> bool:
        """Insert REC unless its name is taken (False); ``AtLimit`` when its namespace holds LIMIT already."""
        with self._tx() as db:
            _check_limit(db, "functions", rec.namespace, rec.spec.name, limit)
            cur = db.execute(
                "INSERT OR IGNORE INTO functions VALUES (?,?,?,?,?,?,?,?,?,NULL)",
                (rec.namespace, rec.spec.name, json.dumps(rec.spec.to_dict()), rec.phase, rec.message,
                 rec.code_hash, rec.image, rec.created_at, rec.last_built_at),
            )
            return cur.rowcount == 1

    def save_function(self, rec: FunctionRecord) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE functions SET spec=?, phase=?, message=?, code_hash=?, image=?, last_built_at=? "
                "WHERE namespace=? AND name=?",
                (json.dumps(rec.spec.to_dict()), rec.phase, rec.message, rec.code_hash, rec.image,
                 rec.last_built_at, rec.namespace, rec.spec.name),
            )

    def set_artifact(self, namespace: str, name: str, artifact: dict[str, Any] | None) -> None:
        with self._tx() as db:
            db.execute("UPDATE functions SET artifact=? WHERE namespace=? AND name=?",
                       (json.dumps(artifact) if artifact else None, namespace, name))

    def get_artifact(self, namespace: str, name: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT artifact FROM functions WHERE namespace=? AND name=?", namespace, name)
        if not rows or rows[0]["artifact"] is None:
            return None
        value: dict[str, Any] = json.loads(rows[0]["artifact"])
        return value

    def delete_function(self, namespace: str, name: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM functions WHERE namespace=? AND name=?", (namespace, name))
            db.execute("DELETE FROM triggers WHERE namespace=? AND function=?", (namespace, name))
            db.execute("DELETE FROM jobs WHERE namespace=? AND function=?", (namespace, name))
            db.execute("DELETE FROM versions WHERE namespace=? AND name=?", (namespace, name))
            db.execute("DELETE FROM traffic WHERE namespace=? AND name=?", (namespace, name))

    # deployed versions (sless_api.domain.versions)
    def list_versions(self, namespace: str, name: str) -> list[Version]:
        rows = self._rows("SELECT * FROM versions WHERE namespace=? AND name=? ORDER BY version", namespace, name)
        return [_version(r) for r in rows]

    def newest_version(self, namespace: str, name: str) -> Version | None:
        """The newest recorded version alone (one row: what a call, run or event is recorded with)."""
        rows = self._rows("SELECT * FROM versions WHERE namespace=? AND name=? ORDER BY version DESC LIMIT 1",
                          namespace, name)  # fmt: skip
        return _version(rows[0]) if rows else None

    def record_version(self, rec: FunctionRecord, now: float) -> Version | None:
        """Record REC (just Ready) as a new version unless it is the newest already; keeps the newest few."""
        config = function_config(rec.spec)
        with self._tx():
            history = self.list_versions(rec.namespace, rec.spec.name)
            updated = append(history, rec.code_hash or "", config, now)
            if updated is None:
                return None
            added = updated[-1]
            self._db.execute("INSERT INTO versions VALUES (?,?,?,?,?,?)",
                             (rec.namespace, rec.spec.name, added.version, added.code_hash, json.dumps(config), now))
            self._db.execute("DELETE FROM versions WHERE namespace=? AND name=? AND version < ?",
                             (rec.namespace, rec.spec.name, updated[0].version))
            return added

    # the traffic split (sless_core.traffic) and the built artifact of its other version
    def get_traffic(self, namespace: str, name: str) -> tuple[TrafficSplit, dict[str, Any] | None] | None:
        rows = self._rows("SELECT split, artifact FROM traffic WHERE namespace=? AND name=?", namespace, name)
        if not rows:
            return None
        artifact = json.loads(rows[0]["artifact"]) if rows[0]["artifact"] else None
        return parse_entries(json.loads(rows[0]["split"])), artifact

    def set_traffic(self, namespace: str, name: str, split: TrafficSplit, artifact: dict[str, Any] | None) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO traffic VALUES (?,?,?,?)",
                       (namespace, name, json.dumps(split.to_list()), json.dumps(artifact) if artifact else None))

    def clear_traffic(self, namespace: str, name: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM traffic WHERE namespace=? AND name=?", (namespace, name)).rowcount == 1

    # triggers
    @staticmethod
    def _trigger(row: sqlite3.Row) -> TriggerRecord:
        return TriggerRecord(namespace=row["namespace"], spec=TriggerSpec.from_dict(json.loads(row["spec"])),
                             created_at=row["created_at"], last_fired_at=row["last_fired_at"],
                             message=row["message"])

    def list_triggers(self, namespace: str | None = None, function: str | None = None) -> list[TriggerRecord]:
        sql, args = "SELECT * FROM triggers WHERE 1=1", list[str]()
        if namespace is not None:
            sql, args = sql + " AND namespace = ?", [*args, namespace]
        if function is not None:
            sql, args = sql + " AND function = ?", [*args, function]
        return [self._trigger(r) for r in self._rows(sql + " ORDER BY namespace, name", *args)]

    def get_trigger(self, namespace: str, name: str) -> TriggerRecord | None:
        rows = self._rows("SELECT * FROM triggers WHERE namespace=? AND name=?", namespace, name)
        return self._trigger(rows[0]) if rows else None

    def insert_trigger(self, rec: TriggerRecord, limit: int = 0) -> bool:
        """Insert REC unless its name is taken (False); ``AtLimit`` when its namespace holds LIMIT already."""
        with self._tx() as db:
            _check_limit(db, "triggers", rec.namespace, rec.spec.name, limit)
            cur = db.execute("INSERT OR IGNORE INTO triggers VALUES (?,?,?,?,?,?,?)",
                             (rec.namespace, rec.spec.name, rec.spec.function, json.dumps(rec.spec.to_dict()),
                              rec.created_at, rec.last_fired_at, rec.message))
            return cur.rowcount == 1

    def save_trigger(self, rec: TriggerRecord) -> None:
        with self._tx() as db:
            db.execute("UPDATE triggers SET function=?, spec=?, last_fired_at=?, message=? "
                       "WHERE namespace=? AND name=?",
                       (rec.spec.function, json.dumps(rec.spec.to_dict()), rec.last_fired_at, rec.message,
                        rec.namespace, rec.spec.name))

    def delete_trigger(self, namespace: str, name: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM triggers WHERE namespace=? AND name=?", (namespace, name)).rowcount == 1

    # jobs
    @staticmethod
    def _job(row: sqlite3.Row) -> JobRecord:
        spec = json.loads(row["spec"])
        return JobRecord(namespace=row["namespace"], spec=JobSpec(**spec), phase=row["phase"],
                         message=row["message"], started_at=row["started_at"],
                         completed_at=row["completed_at"], created_at=row["created_at"])

    def list_jobs(self, namespace: str | None = None) -> list[JobRecord]:
        if namespace is None:
            return [self._job(r) for r in self._rows("SELECT * FROM jobs")]
        return [self._job(r) for r in self._rows("SELECT * FROM jobs WHERE namespace=? ORDER BY name", namespace)]

    def get_job(self, namespace: str, name: str) -> JobRecord | None:
        rows = self._rows("SELECT * FROM jobs WHERE namespace=? AND name=?", namespace, name)
        return self._job(rows[0]) if rows else None

    def insert_job(self, rec: JobRecord, limit: int = 0) -> bool:
        """Insert REC unless its name is taken (False); ``AtLimit`` when its namespace holds LIMIT already."""
        with self._tx() as db:
            _check_limit(db, "jobs", rec.namespace, rec.spec.name, limit)
            cur = db.execute("INSERT OR IGNORE INTO jobs VALUES (?,?,?,?,?,?,?,?,?)",
                             (rec.namespace, rec.spec.name, rec.spec.function, json.dumps(rec.spec.to_dict()),
                              rec.phase, rec.message, rec.started_at, rec.completed_at, rec.created_at))
            return cur.rowcount == 1

    def save_job(self, rec: JobRecord) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET spec=?, phase=?, message=?, started_at=?, completed_at=? "
                       "WHERE namespace=? AND name=?",
                       (json.dumps(rec.spec.to_dict()), rec.phase, rec.message, rec.started_at,
                        rec.completed_at, rec.namespace, rec.spec.name))

    def delete_job(self, namespace: str, name: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM jobs WHERE namespace=? AND name=?", (namespace, name)).rowcount == 1


def _version(row: Any) -> Version:
    """A ``versions`` row as the model's Version."""
    return Version(row["version"], row["code_hash"], json.loads(row["config"]), row["deployed_at"])


class AtLimit(Exception):
    """A namespace already holds as many of a kind as its limit allows (``used``)."""

    def __init__(self, used: int) -> None:
        super().__init__(f"{used} in use")
        self.used = used


def _check_limit(db: sqlite3.Connection, table: str, namespace: str, name: str, limit: int) -> None:
    """Within an insert's transaction, so two creates at once cannot both pass: ``AtLimit`` at LIMIT (0: none).
    A name already taken passes: its create is a conflict, whatever the count."""
    if limit <= 0:
        return
    if db.execute(f"SELECT 1 FROM {table} WHERE namespace = ? AND name = ?", (namespace, name)).fetchone():  # noqa: S608
        return
    used = int(db.execute(f"SELECT count(*) FROM {table} WHERE namespace = ?", (namespace,)).fetchone()[0])  # noqa: S608
    if used >= limit:
        raise AtLimit(used)
