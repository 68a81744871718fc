"""Code a tenant leaves on the platform's disk: the newest versions per function, and a quota per tenant."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from tests.support.platform import Tenant, make_zip, running_sless

pytestmark = pytest.mark.e2e


def handler(version: int, padding: int = 0) -> dict[str, str | bytes]:
    files: dict[str, str | bytes] = {"handler.py": f"def handle(event):\n    return {version}\n"}
    if padding:
        files["data.bin"] = bytes(range(256)) * (padding // 256)
    return files


def test_old_versions_go_and_a_tenant_over_its_quota_gets_413(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"SLESS_CODE_VERSIONS_KEPT": "2", "SLESS_TENANT_CODE_QUOTA_BYTES": "40000"}
    with running_sless(data, env) as sp:
        tenant = Tenant(sp.url, "retention")
        tenant.deploy("kept", "python3.11", handler(1))
        for version in (2, 3, 4):
            tenant.upload("kept", handler(version))
            tenant.wait_phase("kept", ("Ready",))
            assert requests.get(tenant.fn_url("kept"), timeout=30).text == str(version)
        versions = list((data / "functions" / tenant.ns / "kept").iterdir())
        assert len(versions) == 2
        assert len(list((data / "objects" / "functions" / tenant.ns / "kept").iterdir())) == 2

        resp = tenant.api("POST", "/functions/kept/upload",
                          files={"code": ("code.zip", make_zip(handler(5, padding=50_000)), "application/zip")})
        assert resp.status_code == 413 and "quota" in resp.json()["error"], resp.text
        assert requests.get(tenant.fn_url("kept"), timeout=30).text == "4"  # the running version is untouched
        assert len(list((data / "functions" / tenant.ns / "kept").iterdir())) == 2

        other = Tenant(sp.url, "retention-other")  # quotas are per tenant
        other.deploy("mine", "python3.11", handler(1, padding=30_000))

