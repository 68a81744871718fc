#!/usr/bin/python
"""The platform's PostgreSQL database (invocation log, async calls) as a pg_dump archive, and back."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sless_backup_files import FILE_MODE, BackupError, private_folder

DOCUMENTATION = r"""
---
module: sless_backup_database
short_description: Dump the sless database with pg_dump (custom format), or restore such a dump with pg_restore
description:
  - The connection comes from O(dsn) (the platform's C(SLESS_DATABASE_URL)); its parts reach pg_dump and pg_restore
    as C(PG*) environment variables, so the password is on no command line.
  - V(save) writes O(path) (0600) with C(pg_dump --format=custom).
  - V(restore) first reads the archive's table of contents (C(pg_restore --list)), then restores it into the
    database in one transaction (C(--clean --if-exists --no-owner --no-privileges --single-transaction
    --exit-on-error)): the platform's tables are replaced by the backup's, or the whole restore is rolled back.
    Check mode reads the table of contents only.
options:
  mode:
    description: V(save) (database to file) or V(restore) (file to database).
    type: str
    choices: [save, restore]
    required: true
  path:
    description: The dump file.
    type: path
    required: true
  dsn:
    description: The database's URL or key=value DSN, e.g. C(postgresql://sless:PASSWORD@db-1:5432/sless).
    type: str
    required: true
  pg_dump:
    description: The pg_dump binary (of the server's major version or newer).
    type: str
    default: pg_dump
  pg_restore:
    description: The pg_restore binary.
    type: str
    default: pg_restore
"""

RETURN = r"""
database:
  description: The database's name.
  returned: always
  type: str
entries:
  description: How many entries the archive's table of contents holds.
  returned: always
  type: int
"""

#: libpq's connection parameters and the environment variables that carry them.
PG_ENV = {"host": "PGHOST", "hostaddr": "PGHOSTADDR", "port": "PGPORT", "user": "PGUSER", "password": "PGPASSWORD",
          "dbname": "PGDATABASE", "sslmode": "PGSSLMODE", "sslrootcert": "PGSSLROOTCERT", "sslcert": "PGSSLCERT",
          "sslkey": "PGSSLKEY", "connect_timeout": "PGCONNECT_TIMEOUT", "application_name": "PGAPPNAME",
          "options": "PGOPTIONS", "target_session_attrs": "PGTARGETSESSIONATTRS", "passfile": "PGPASSFILE"}  # fmt: skip


def environment(dsn: str) -> tuple[dict[str, str], str]:
    """The PG* variables of DSN (the process's own PG* dropped) and the database's name."""
    from psycopg2.extensions import parse_dsn

    try:
        parts = parse_dsn(dsn)
    except Exception:  # psycopg2.ProgrammingError quotes the DSN: not repeated here
        raise BackupError("the database URL does not parse") from None
    unknown = sorted(set(parts) - set(PG_ENV))
    if unknown:
        raise BackupError(f"the database URL has parameters this module does not pass on: {', '.join(unknown)}")
    if not parts.get("dbname"):
        raise BackupError("the database URL names no database")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update({PG_ENV[k]: str(v) for k, v in parts.items()})
    return env, str(parts["dbname"])


def run(argv: list[str], env: dict[str, str], what: str) -> str:
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600, check=False)
    except FileNotFoundError:
        raise BackupError(f"{argv[0]} is not installed (PostgreSQL's client programs)") from None
    if proc.returncode != 0:
        raise BackupError(f"{what} failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}")
    return proc.stdout


def entries(pg_restore: str, path: Path, env: dict[str, str]) -> int:
    if not path.is_file():
        raise BackupError(f"{path} is missing")
    listing = run([pg_restore, "--list", str(path)], env, "reading the dump's table of contents")
    return sum(1 for line in listing.splitlines() if line.strip() and not line.startswith(";"))


def save(path: Path, env: dict[str, str], pg_dump: str, pg_restore: str) -> int:
    """pg_dump into PATH (0600); the entries of its table of contents."""
    private_folder(path.parent)
    previous = os.umask(0o077)
    try:
        run([pg_dump, "--format=custom", "--no-password", f"--file={path}"], env, "pg_dump")
    finally:
        os.umask(previous)
    os.chmod(path, FILE_MODE)
    return entries(pg_restore, path, env)


def restore(path: Path, env: dict[str, str], database: str, pg_restore: str) -> None:
    """The dump at PATH into DATABASE, replacing what it holds of the same names, in one transaction."""
    run([pg_restore, "--clean", "--if-exists", "--no-owner", "--no-privileges", "--single-transaction",
         "--exit-on-error", "--no-password", f"--dbname={database}", str(path)], env, "pg_restore")  # fmt: skip


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "choices": ["save", "restore"], "required": True},
            "path": {"type": "path", "required": True},
            "dsn": {"type": "str", "required": True, "no_log": True},
            "pg_dump": {"type": "str", "default": "pg_dump"},
            "pg_restore": {"type": "str", "default": "pg_restore"},
        },
        supports_check_mode=True,
    )
    p = module.params
    path = Path(p["path"])
    result: dict[str, Any] = {"database": "", "entries": 0}
    try:
        env, result["database"] = environment(p["dsn"])
        if p["mode"] == "save":
            if module.check_mode:
                module.exit_json(changed=True, **result)
            result["entries"] = save(path, env, p["pg_dump"], p["pg_restore"])
            module.exit_json(changed=True, **result)
        result["entries"] = entries(p["pg_restore"], path, env)
        if not module.check_mode:
            restore(path, env, result["database"], p["pg_restore"])
        module.exit_json(changed=True, **result)
    except BackupError as exc:
        module.fail_json(msg=f"sless backup, database: {exc}", **result)


if __name__ == "__main__":
    main()
