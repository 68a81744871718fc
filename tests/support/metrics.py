"""Reading Prometheus expositions in tests, with prometheus_client's own parser."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TOKEN = "scrape-token-for-tests-0123456789"


def scrape(url: str, token: str | None = SCRAPE_TOKEN) -> str:
    """The exposition at URL/metrics (asserting 200)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    resp = requests.get(url + "/metrics", headers=headers, timeout=30)
    assert resp.status_code == 200, (resp.status_code, resp.text[:500])
    assert resp.headers["Content-Type"].startswith("text/plain")
    return resp.text


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the one series NAME with LABELS among its labels; 0 when there is none (not counted yet)."""
    found = [s.value for family in text_string_to_metric_families(text) for s in family.samples
             if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} series"
    return float(found[0]) if found else 0.0
