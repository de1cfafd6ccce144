"""How long a step's own SQLite transaction takes, alone and with CPU work between
transactions, next to the raw floor's commit: the median of each, so that checkpoints
(about one transaction in a hundred) do not hide the typical cost.

A step's transaction is exactly what the store commits for a sequential step (BEGIN
IMMEDIATE, the message body and list node into ``blobs``, the lease-fenced event with its
2 KB response, COMMIT), on Toren's own schema, with no Python of Toren's around it. The gap
is a busy loop of the given length before each transaction, standing in for the engine's
work between two steps.

    python -m bench.commit_gap [--n 1500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sqlite3
import statistics
import tempfile
import time

from rich.console import Console
from rich.table import Table

from bench.common import fake_model
from toren.store.schema import SCHEMA, render
from toren.store.sql import INSERT_EVENT_FENCED, insert_blobs_sql

RESPONSE = fake_model(1)
GAPS_US = (0, 100, 200, 400)


def _database(schema: bool) -> sqlite3.Connection:
    path = os.path.join(tempfile.mkdtemp(prefix="toren_bench_gap_"), "gap.sqlite")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    if schema:
        for migration in SCHEMA:  # a new file: every entry applies as rendered
            conn.execute(render(migration, "sqlite"))
        conn.execute(
            "INSERT INTO runs (id, agent, created_at, updated_at, lease_owner, lease_epoch) "
            "VALUES ('r', 'a', 0, 0, 'w', 1)"
        )
    else:
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
    return conn


def _step(conn: sqlite3.Connection, i: int) -> None:
    message = f'{{"content":"step {i}","role":"user"}}'
    key = hashlib.sha256(message.encode()).hexdigest()
    node = f'{{"items":["{key}"],"prev":null}}'
    node_key = hashlib.sha256(node.encode()).hexdigest()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(insert_blobs_sql(2), (key, message, len(message), node_key, node, len(node)))
    conn.execute(
        INSERT_EVENT_FENCED.format(lock=""),
        (
            "r",
            "main",
            i,
            0,
            f"main#0:{i}",
            "ModelCallRecorded",
            f"{i:064x}",
            "dev",
            "w",
            time.time(),
            1,
            RESPONSE,
            "r",
            "w",
            1,
        ),
    )
    conn.execute("COMMIT")


def _floor(conn: sqlite3.Connection, _: int) -> None:
    conn.execute("BEGIN")
    conn.execute("INSERT INTO t (payload) VALUES (?)", (RESPONSE,))
    conn.execute("COMMIT")


def _busy(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def median_us(kind: str, gap_us: float, n: int) -> float:
    conn = _database(schema=kind == "step")
    work = _step if kind == "step" else _floor
    for i in range(100):  # warm-up
        work(conn, 10**6 + i)
    times = []
    for i in range(n):
        _busy(gap_us)
        t0 = time.perf_counter()
        work(conn, i)
        times.append((time.perf_counter() - t0) * 1e6)
    conn.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    table = Table(title="Median transaction time, µs (SQLite WAL, synchronous=FULL)")
    table.add_column("round")
    for kind in ("floor", "step"):
        for gap in GAPS_US:
            table.add_column(f"{kind}, gap {gap} µs")
    for r in range(args.rounds):
        cells = [
            f"{median_us(kind, gap, args.n):.0f}" for kind in ("floor", "step") for gap in GAPS_US
        ]
        table.add_row(str(r + 1), *cells)
    Console().print(table)


if __name__ == "__main__":
    main()
