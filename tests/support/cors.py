"""A CORS preflight as a browser sends it, and the answer the platform gives to an allowed one."""

from __future__ import annotations

import requests


def preflight(url: str, origin: str, method: str = "POST", headers: str = "X-Token") -> requests.Response:
    return requests.options(url, headers={"Origin": origin, "Access-Control-Request-Method": method,
                                          "Access-Control-Request-Headers": headers}, timeout=30)


def assert_allowed(answer: requests.Response, origin: str, max_age: int) -> None:
    """The platform's 204 for a trigger with origins [ORIGIN], methods GET and POST, header X-Token,
    credentials and MAX_AGE."""
    assert answer.status_code == 204, answer.text
    assert answer.headers["Access-Control-Allow-Origin"] == origin
    assert answer.headers["Access-Control-Allow-Methods"] == "GET, POST"
    assert answer.headers["Access-Control-Allow-Headers"] == "x-token"
    assert answer.headers["Access-Control-Allow-Credentials"] == "true"
    assert answer.headers["Access-Control-Max-Age"] == str(max_age)
    assert "Content-Length" not in answer.headers
