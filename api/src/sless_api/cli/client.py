"""The CLI's REST client: one readable line on stderr and exit code 1 for every failure, never a traceback."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any


class Client:
    """A thin REST client; every failure becomes one readable line on stderr and exit code 1."""

    def __init__(self, url: str, token: str, namespace: str | None = None) -> None:
        import requests

        self.url = url.rstrip("/")
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"
        self._namespace = namespace  # None: the token's own, asked of /v1/whoami once

    def namespace(self) -> str:
        if self._namespace is None:
            self._namespace = str(self.request("GET", "/v1/whoami")["namespace"])
        return self._namespace

    def request(self, method: str, path: str, ok: tuple[int, ...] = (200, 201, 202, 204), **kw: Any) -> Any:
        resp = self.http.request(method, self.url + path, timeout=kw.pop("timeout", 60), **kw)
        if resp.status_code not in ok:
            try:
                message = resp.json().get("error", resp.text)
            except ValueError:
                message = resp.text
            raise CliError(f"{method} {path}: HTTP {resp.status_code}: {message}")
        return resp.json() if resp.content and resp.headers.get("content-type", "").startswith(
            "application/json") else None

    def ns_path(self, rest: str) -> str:
        return f"/v1/namespaces/{self.namespace()}{rest}"


    def items(self, rest: str) -> list[dict[str, Any]]:
        """Every item of a paged namespace listing (following ``next_cursor``)."""
        found: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 1000}
        while True:
            page = self.request("GET", self.ns_path(rest), params=params)
            found.extend(page["items"])
            params["cursor"] = page.get("next_cursor")
            if not params["cursor"]:
                return found


class CliError(Exception):
    pass


def emit(data: Any, as_json: bool, table: str) -> None:
    """Print DATA as JSON (``--output json``) or as the given table text."""
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True))
    elif table:
        sys.stdout.write(table if table.endswith("\n") else table + "\n")


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """ROWS under a HEADER row, each column as wide as its widest cell, so nothing is cut (a trigger's URL, a
    long name); the last column is not padded. No rows: no text at all (not even the header), so an empty
    listing prints nothing, as ``ls`` of an empty folder does."""
    cells = [[str(cell) for cell in row] for row in rows]
    if not cells:
        return ""
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        padded = [cell.ljust(width) for cell, width in zip(row[:-1], widths[:-1], strict=True)]
        return "  ".join([*padded, row[-1]]).rstrip()

    return "\n".join(line(row) for row in [list(header), *cells])
