"""The standalone secret store: values encrypted at rest (AES-256-GCM) in SQLite, the key in a 0600 file.

Why AES-GCM from ``cryptography`` and not a hand-made scheme: an authenticated cipher from a maintained
library, with the row's namespace, name and version as associated data, so a ciphertext copied onto another
row (another tenant's secret) fails to decrypt instead of being served.

The key file (``SLESS_SECRETS_KEY_FILE``, default ``<data dir>/secrets.key``) is made once, 0600, by the
platform's user. Function processes never see it: the data dir is 0700 and outside every function sandbox
(sandbox.py), and a sandboxed process gets its own secrets only, as env values or files bound into its view.
Whoever has the key and the database has every value: back them up apart.
"""

from __future__ import annotations

import json
import os
import secrets as random
import sqlite3
import threading
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sless_api.domain.errors import Conflict, NotFound
from sless_api.domain.secrets import SecretMeta, SecretValues, now

KEY_BYTES = 32
NONCE_BYTES = 12
SCHEMA = """
CREATE TABLE IF NOT EXISTS secrets (
  namespace TEXT NOT NULL, name TEXT NOT NULL, keys TEXT NOT NULL, version INTEGER NOT NULL,
  revision TEXT NOT NULL, nonce BLOB NOT NULL, ciphertext BLOB NOT NULL,
  created_at REAL NOT NULL, updated_at REAL NOT NULL, PRIMARY KEY (namespace, name));
"""


class SecretKeyError(RuntimeError):
    """The key file is unusable (wrong size, wrong owner, readable by others); the message says how to fix it."""


def load_or_create_key(path: Path) -> bytes:
    """The 32-byte key in PATH, created 0600 (O_EXCL: two workers starting together make one key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as out:
            out.write(random.token_bytes(KEY_BYTES))
            out.flush()
            os.fsync(out.fileno())
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as src:
        st = os.fstat(src.fileno())
        if st.st_uid != os.geteuid():
            raise SecretKeyError(f"secrets key {path} belongs to uid {st.st_uid}, not to this user")
        if st.st_mode & 0o077:
            os.fchmod(src.fileno(), 0o600)
        key = src.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise SecretKeyError(f"secrets key {path} must hold exactly {KEY_BYTES} bytes (it holds {len(key)}): "
                             "restore it from a backup; a new key cannot read the stored secrets")
    return key


def _aad(namespace: str, name: str, version: int) -> bytes:
    return f"{namespace}/{name}/{version}".encode()


class LocalSecretStore:
    """Secrets of every tenant in one SQLite file, each row's data encrypted with the platform's key."""

    def __init__(self, db_path: Path, key_path: Path) -> None:
        self._cipher = AESGCM(load_or_create_key(key_path))
        db_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(db_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        self._db = sqlite3.connect(str(db_path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    def _meta(self, row: tuple[object, ...]) -> SecretMeta:
        namespace, name, keys, version, revision, created, updated = row
        return SecretMeta(str(namespace), str(name), tuple(json.loads(str(keys))), int(str(version)), str(revision),
                          float(str(created)), float(str(updated)))

    _COLUMNS = "namespace, name, keys, version, revision, created_at, updated_at"

    def list(self, namespace: str) -> list[SecretMeta]:
        with self._lock:
            rows = self._db.execute(f"SELECT {self._COLUMNS} FROM secrets WHERE namespace = ? ORDER BY name",  # noqa: S608
                                    (namespace,)).fetchall()
        return [self._meta(r) for r in rows]

    def get(self, namespace: str, name: str) -> SecretMeta:
        with self._lock:
            row = self._db.execute(f"SELECT {self._COLUMNS} FROM secrets WHERE namespace = ? AND name = ?",  # noqa: S608
                                   (namespace, name)).fetchone()
        if row is None:
            raise NotFound(f"secret {name!r} not found")
        return self._meta(row)

    def values(self, namespace: str, name: str) -> SecretValues:
        with self._lock:
            row = self._db.execute("SELECT version, nonce, ciphertext FROM secrets WHERE namespace = ? AND name = ?",
                                   (namespace, name)).fetchone()
        if row is None:
            raise NotFound(f"secret {name!r} not found")
        version, nonce, ciphertext = row
        try:
            plain = self._cipher.decrypt(bytes(nonce), bytes(ciphertext), _aad(namespace, name, int(version)))
        except InvalidTag:
            raise RuntimeError(f"secret {namespace}/{name} does not decrypt with this platform's key") from None
        data: SecretValues = json.loads(plain)
        return data

    def _seal(self, namespace: str, name: str, version: int, data: SecretValues) -> tuple[bytes, bytes]:
        nonce = random.token_bytes(NONCE_BYTES)
        plain = json.dumps(data, sort_keys=True).encode()
        return nonce, self._cipher.encrypt(nonce, plain, _aad(namespace, name, version))

    def create(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        stamp = now()
        nonce, sealed = self._seal(namespace, name, 1, data)
        with self._lock:
            try:
                self._db.execute("INSERT INTO secrets VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?)",
                                 (namespace, name, json.dumps(sorted(data)), random.token_hex(8), nonce, sealed,
                                  stamp, stamp))
            except sqlite3.IntegrityError:
                raise Conflict(f"secret {name!r} already exists") from None
        return self.get(namespace, name)

    def replace(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT version FROM secrets WHERE namespace = ? AND name = ?",
                                       (namespace, name)).fetchone()
                if row is None:
                    raise NotFound(f"secret {name!r} not found")
                version = int(row[0]) + 1
                nonce, sealed = self._seal(namespace, name, version, data)
                self._db.execute("UPDATE secrets SET keys = ?, version = ?, revision = ?, nonce = ?, ciphertext = ?, "
                                 "updated_at = ? WHERE namespace = ? AND name = ?",
                                 (json.dumps(sorted(data)), version, random.token_hex(8), nonce, sealed, now(),
                                  namespace, name))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return self.get(namespace, name)

    def delete(self, namespace: str, name: str) -> None:
        with self._lock:
            deleted = self._db.execute("DELETE FROM secrets WHERE namespace = ? AND name = ?", (namespace, name))
        if deleted.rowcount == 0:
            raise NotFound(f"secret {name!r} not found")
