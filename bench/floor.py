"""The raw commit floor: N x (INSERT one 2 KB row; COMMIT) on one connection.

* SQLite, journal_mode=WAL, synchronous=FULL   (the bench's durability setting)
* SQLite, journal_mode=WAL, synchronous=NORMAL (not durable across power loss)
* PostgreSQL 15 on 127.0.0.1, autocommit, synchronous_commit=on (server default)

  python -m bench.floor [--n 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import tempfile
import time
from typing import Any

from bench.common import PG_MAIN_DB, ensure_main_pg_db, fake_model, pg_available, pg_dsn

ROW = fake_model(1)  # 2,048 bytes


def sqlite_floor(n: int, synchronous: str) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix="toren_bench_floor_")
    try:
        c = sqlite3.connect(os.path.join(d, "floor.sqlite"), isolation_level=None)
        c.execute("PRAGMA journal_mode=WAL")
        c.execute(f"PRAGMA synchronous={synchronous}")
        c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
        for _ in range(50):  # warm-up
            c.execute("BEGIN")
            c.execute("INSERT INTO t(payload) VALUES (?)", (ROW,))
            c.execute("COMMIT")
        t0 = time.perf_counter()
        for _ in range(n):
            c.execute("BEGIN")
            c.execute("INSERT INTO t(payload) VALUES (?)", (ROW,))
            c.execute("COMMIT")
        dt = time.perf_counter() - t0
        c.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {"n": n, "seconds": round(dt, 3), "commits_per_s": round(n / dt, 1)}


def postgres_floor(n: int) -> dict[str, Any]:
    import psycopg

    ensure_main_pg_db()
    with psycopg.connect(pg_dsn(PG_MAIN_DB), autocommit=True) as c:
        sc = c.execute("SHOW synchronous_commit").fetchone()[0]
        c.execute("DROP TABLE IF EXISTS floor_t")
        c.execute("CREATE TABLE floor_t (id bigserial PRIMARY KEY, payload text NOT NULL)")
        for _ in range(50):
            c.execute("INSERT INTO floor_t(payload) VALUES (%s)", (ROW,))
        t0 = time.perf_counter()
        for _ in range(n):
            c.execute("INSERT INTO floor_t(payload) VALUES (%s)", (ROW,))
        dt = time.perf_counter() - t0
        c.execute("DROP TABLE floor_t")
    return {
        "n": n,
        "seconds": round(dt, 3),
        "commits_per_s": round(n / dt, 1),
        "synchronous_commit": sc,
    }


def run_floor(n: int, backends: tuple[str, ...] = ("sqlite", "postgres")) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "sqlite" in backends:
        out["sqlite_wal_full"] = sqlite_floor(n, "FULL")
        out["sqlite_wal_normal"] = sqlite_floor(n * 4, "NORMAL")
    if "postgres" in backends and pg_available():
        out["postgres_autocommit"] = postgres_floor(n)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    print(json.dumps(run_floor(ap.parse_args().n), indent=2))
