"""Who may read a component's /metrics: the holder of the operator-set scrape token, nobody else.

Shared by the API, the event dispatcher and the operator, so the rule (off without a token, constant-time
comparison of the whole ``Authorization`` header) is the same everywhere.
"""

from __future__ import annotations

import hmac


def scrape_allowed(authorization: str | None, scrape_token: str) -> bool:
    """Whether a request's Authorization header holds the scrape token (never when no token is set)."""
    if not scrape_token:
        return False
    sent = (authorization or "").encode("utf-8", "replace")
    return hmac.compare_digest(sent, f"Bearer {scrape_token}".encode())
