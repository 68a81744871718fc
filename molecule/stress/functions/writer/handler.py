"""stress-writer: a batch INSERT of event["rows"] rows (default 10) into PostgreSQL ($DATABASE_URL)."""

import os

import psycopg2

DDL = (
    "CREATE TABLE IF NOT EXISTS stress_writes"
    " (id bigserial PRIMARY KEY, source text NOT NULL, at timestamptz DEFAULT now())"
)


def handle(event):
    rows = int(event.get("rows", 10))
    with psycopg2.connect(os.environ["DATABASE_URL"], connect_timeout=10) as conn, conn.cursor() as cur:
        # concurrent first calls would race on CREATE TABLE IF NOT EXISTS (a unique violation in pg_type)
        cur.execute("SELECT pg_advisory_xact_lock(4242)")
        cur.execute(DDL)
        cur.executemany("INSERT INTO stress_writes (source) VALUES (%s)", [("writer",)] * rows)
        cur.execute("SELECT count(*) FROM stress_writes")
        (total,) = cur.fetchone()
    return {"inserted": rows, "total": total}
