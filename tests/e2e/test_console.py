"""The web console: a static page without tenant data, and an authenticated plain-text listing for curl."""

from __future__ import annotations

import pytest
import requests

from sless_api.rest.console.resource import ASSETS
from tests.support.platform import SlessProcess, Tenant

pytestmark = pytest.mark.e2e


def test_page_holds_no_tenant_data_and_uses_no_cdn(tenant: Tenant, sless: SlessProcess) -> None:
    tenant.deploy("secret-name-fn", "python3.11", {"handler.py": "def handle(e):\n    return 1\n"})
    page = requests.get(f"{sless.url}/console", headers={"Accept": "text/html"}, timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "secret-name-fn" not in page.text and tenant.ns not in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert {"console.js", "console.css", "api.js", "invoke.js", "upload.js", "jobs.js", "versions.js"} <= ASSETS
    for asset in ASSETS:
        resp = requests.get(f"{sless.url}/console/{asset}", timeout=30)
        assert resp.status_code == 200 and "://" not in resp.text  # no third-party assets
        assert resp.headers["content-security-policy"] == page.headers["content-security-policy"]
        assert resp.headers["x-content-type-options"] == "nosniff"
    assert "://" not in page.text
    # The policy stays strict: scripts and everything else from the console's own origin only, no inline
    # script or eval, no framing.
    policy = {d.split()[0]: d.split()[1:] for d in page.headers["content-security-policy"].split("; ")}
    assert policy["default-src"] == ["'self'"] and "script-src" not in policy and "connect-src" not in policy
    assert policy["frame-ancestors"] == ["'none'"] and policy["base-uri"] == ["'none'"]
    for name in ("..%2fapp.py", "index.html", "resource.py", "missing.js"):
        assert requests.get(f"{sless.url}/console/{name}", timeout=30).status_code == 404


def test_plain_text_listing_needs_the_token(tenant: Tenant, other_tenant: Tenant, sless: SlessProcess) -> None:
    tenant.deploy("listed", "python3.11", {"handler.py": "def handle(e):\n    return 1\n"})
    tenant.api("POST", "/functions", json={"name": "idle", "runtime": "nodejs20", "scale": {"max": 3}}, expect=201)
    assert requests.get(f"{sless.url}/console", timeout=30).status_code == 401
    text = requests.get(f"{sless.url}/console", headers={"Authorization": f"Bearer {tenant.token}"}, timeout=30)
    assert text.headers["content-type"].startswith("text/plain")
    lines = text.text.splitlines()
    assert lines[1].startswith("listed ") and "Ready" in lines[1] and f"/fn/{tenant.ns}/listed" in lines[1]
    assert lines[0].split()[:4] == ["NAME", "RUNTIME", "PHASE", "SCALE"]
    assert lines[1].split()[3] == "fixed"
    assert lines[2].startswith("idle ") and lines[2].split()[2:4] == ["Pending", "0..3"]
    foreign = requests.get(f"{sless.url}/console", headers={"Authorization": f"Bearer {other_tenant.token}"},
                           timeout=30)
    assert "listed" not in foreign.text
