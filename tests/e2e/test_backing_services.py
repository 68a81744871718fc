"""`sless up` on real backing services: invocations into PostgreSQL, code archives into S3."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import psycopg2
import pytest
import requests
from minio import Minio

from tests.support.platform import Tenant, running_sless
from tests.support.services import S3Endpoint, fresh_pg_database

pytestmark = [pytest.mark.e2e, pytest.mark.pg, pytest.mark.s3]
CODE = "def handle(event):\n    return {'ok': True}\n"


def test_invocations_in_postgres_and_code_in_s3(tmp_path: Path, pg_url: str, s3_endpoint: S3Endpoint) -> None:
    db_url = fresh_pg_database(pg_url)
    bucket = "e2e-" + uuid.uuid4().hex[:10]
    env = {**s3_endpoint.env(), "SLESS_S3_BUCKET": bucket, "SLESS_DATABASE_URL": db_url}
    with running_sless(tmp_path / "data", env) as sp:
        tenant = Tenant(sp.url, "backing-services")
        tenant.deploy("stored", "python3.11", {"handler.py": CODE})
        for _ in range(3):
            assert requests.post(tenant.fn_url("stored"), json={}, timeout=30).json() == {"ok": True}
        deadline = time.monotonic() + 15
        rows: list[tuple[str, int, str]] = []
        while time.monotonic() < deadline and len(rows) < 3:
            conn = psycopg2.connect(db_url)
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT function, status, trigger FROM invocations WHERE namespace = %s",
                                (tenant.ns,))
                    rows = cur.fetchall()
            except psycopg2.errors.UndefinedTable:
                rows = []  # the log creates its table with its first batch
            finally:
                conn.close()
            time.sleep(0.3)
        assert rows == [("stored", 200, "http")] * 3
        listed = tenant.api("GET", "/functions/stored/invocations", expect=200).json()["items"]
        assert len(listed) == 3

        client = Minio(s3_endpoint.endpoint, access_key=s3_endpoint.access_key,
                       secret_key=s3_endpoint.secret_key, secure=False)
        keys = sorted(o.object_name for o in client.list_objects(bucket, recursive=True))
        assert any(k.startswith(f"functions/{tenant.ns}/stored/") and k.endswith(".zip") for k in keys), keys
        assert any(k.startswith(f"contexts/{tenant.ns}/stored/") and k.endswith(".tar.gz") for k in keys), keys

        tenant.api("DELETE", "/functions/stored", expect=204)
        left = [o.object_name for o in client.list_objects(bucket, prefix=f"functions/{tenant.ns}/", recursive=True)]
        assert left == []


def test_postgres_down_does_not_fail_invocations(tmp_path: Path) -> None:
    from tests.support.services import postgres_server

    with postgres_server() as pg, running_sless(tmp_path / "data", {"SLESS_DATABASE_URL": pg.url}) as sp:
        tenant = Tenant(sp.url, "pg-down")
        tenant.deploy("steady", "python3.11", {"handler.py": CODE})
        pg.sigstop()
        try:
            started = time.monotonic()
            for _ in range(50):
                assert requests.get(tenant.fn_url("steady"), timeout=10).status_code == 200
            assert time.monotonic() - started < 20
        finally:
            pg.sigcont()
        pg.crash()
        for _ in range(20):
            assert requests.get(tenant.fn_url("steady"), timeout=10).status_code == 200
        pg.start()
        ready = requests.get(f"{sp.url}/ready", timeout=10).json()
        assert ready["invocation_log"]["recorded"] >= 70
