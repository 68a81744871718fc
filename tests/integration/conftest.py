"""Fixtures of the integration tests: one database URL per dialect the platform supports."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.services import fresh_pg_database


@pytest.fixture(params=["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database: a SQLite file (`sless up`), then an empty PostgreSQL database (the API replicas')."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/invocations.db"
    return fresh_pg_database(request.getfixturevalue("pg_url"))
