"""The data files the API's modules find relative to themselves are where they look: a module moved to another
package must still find its migrations and the console's static files (an empty folder would start a database
with no tables)."""

from __future__ import annotations

from sless_api.rest.console.resource import ASSETS, _static
from sless_api.stores.migrate import MIGRATIONS_DIR, load_migrations


def test_the_migrations_are_found() -> None:
    assert MIGRATIONS_DIR.is_dir() and sorted(MIGRATIONS_DIR.glob("*.sql")), MIGRATIONS_DIR
    assert load_migrations("sqlite") and load_migrations("postgresql")


def test_the_console_finds_its_static_files() -> None:
    assert {"console.js", "console.css"} <= ASSETS
    assert _static("index.html").startswith(b"<!")
