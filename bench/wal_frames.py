"""What one commit writes on SQLite: WAL frames (pages) per commit, by b-tree, for the raw
floor's row and for a Toren step written through the store (the event with its 2 KB
response, the message body and the message-list node, under the lease check).

A WAL-mode commit writes every page it changed to the WAL, then (synchronous=FULL)
fsyncs it; so pages per commit is what a commit costs the disk. Automatic checkpoints are
turned off for the measurement so the WAL holds exactly the measured commits; each page
number in a frame header is mapped to its table or index with SQLite's ``dbstat``.

    python -m bench.wal_frames [--n 500]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import sqlite3
import struct
import tempfile
import time

from rich.console import Console
from rich.table import Table

import toren
from bench.common import fake_model
from bench.core import registry, step_writes

_WAL_HEADER = 32
_FRAME_HEADER = 24


def frames_by_btree(path: str) -> tuple[collections.Counter[str], int]:
    """The WAL's frames counted by the b-tree their page belongs to."""
    with sqlite3.connect(path) as conn:
        owner = dict(conn.execute("SELECT pageno, name FROM dbstat"))
    with open(path + "-wal", "rb") as f:
        data = f.read()
    page_size = struct.unpack(">I", data[8:12])[0]
    counts: collections.Counter[str] = collections.Counter()
    off = _WAL_HEADER
    while off + _FRAME_HEADER <= len(data):
        page = struct.unpack(">I", data[off : off + 4])[0]
        counts["page 1 (header)" if page == 1 else owner.get(page, "other")] += 1
        off += _FRAME_HEADER + page_size
    return counts, page_size


def floor_frames(d: str, n: int) -> collections.Counter[str]:
    path = os.path.join(d, "floor.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
    row = fake_model(1)
    for _ in range(n):  # warm-up: a table of some size, as in the floor benchmark
        conn.execute("INSERT INTO t(payload) VALUES (?)", (row,))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for _ in range(n):
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t(payload) VALUES (?)", (row,))
        conn.execute("COMMIT")
    counts, _ = frames_by_btree(path)
    conn.close()
    return counts


async def toren_frames(d: str, n: int) -> collections.Counter[str]:
    path = os.path.join(d, "toren.db")
    store = await toren.connect(f"sqlite:///{path}")
    run = await toren.start_run(store, registry(), "one")
    lease = (await store.claim("bench", 1, now=time.time(), ttl=600))[0]
    for events, blobs in step_writes(run.id, 0, n):  # warm-up, as above
        await store.append(lease, events, blobs=blobs, now=time.time())
    conn = store._loop_conn  # type: ignore[attr-defined]  # the store's writing connection
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for events, blobs in step_writes(run.id, n, n):
        await store.append(lease, events, blobs=blobs, now=time.time())
    counts, _ = frames_by_btree(path)
    await store.close()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=500, help="commits measured (after as many)")
    n = parser.parse_args().n
    d = tempfile.mkdtemp(prefix="toren_bench_wal_")
    try:
        measured = {
            "floor (one 2 KB row)": floor_frames(d, n),
            "Toren step (store alone)": asyncio.run(toren_frames(d, n)),
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)
    table = Table(title=f"SQLite WAL frames (4 KB pages) per commit, {n} commits")
    table.add_column("b-tree")
    for name in measured:
        table.add_column(name, justify="right")
    names = sorted({k for c in measured.values() for k in c})
    for key in names:
        table.add_row(key, *(f"{c[key] / n:.2f}" if c[key] else "" for c in measured.values()))
    table.add_row("total", *(f"{sum(c.values()) / n:.2f}" for c in measured.values()))
    Console().print(table)


if __name__ == "__main__":
    main()
