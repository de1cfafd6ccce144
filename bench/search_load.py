"""Search under load (issue 34): 50 concurrent clients search a table of runs with large
inputs (the issue's size: 10,000 runs of 0.9 MB) through ``GET /v1/runs?search=``,
against a real server process; the latency (p50/p95/p99) and the server's resident
memory, sampled every 20 ms, throughout. Targets: p95 < 200 ms, RSS < 150 MB.

    python -m bench.search_load [--database-url URL] [--runs 10000]
                                [--input-bytes 900000] [--clients 50] [--requests 20]
                                [--note TEXT] [--json PATH]

Each run's input starts with ~4 KB of its own words: 40 drawn from a vocabulary of 2,000
(``wNNNNx``, each in ~2% of the runs) and one of its own (``runNNNNN``); the rest, to the
input size, is a slice at a random offset of a 4 MB text of filler words drawn from
another 50,000 (``fNNNNN``), so no two inputs are alike and a database that compresses
(PostgreSQL's TOAST) compresses them about as much as prose. The runs (finished, with a
small output) are written by bulk insert (PostgreSQL ``COPY``, SQLite ``executemany``;
the runs table only: search reads no events), as :mod:`bench.scale` fills its database.
The server's indexer builds the search text first (the time it takes is reported:
``index_seconds``); the clients then search a mix of one word, two words, a phrase and a
prefix, back to back. Uses the database, server and connection helpers of
:mod:`bench.list_load`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.list_load import TOKEN, Connection, cpu_seconds, database, rss_mb, server_process

VOCABULARY = [f"w{n:04d}x{chr(97 + n % 26)}" for n in range(2000)]


@dataclass
class Result:
    backend: str
    runs: int
    input_bytes: int
    clients: int
    requests: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    errors: int
    rss_start_mb: float
    rss_max_mb: float
    seed_seconds: float
    index_seconds: float
    rss_max_while_indexing_mb: float
    seconds: float
    server_cpu_ms_per_request: float
    load_average: float
    note: str = ""


def _words(i: int) -> list[str]:
    rnd = random.Random(i)
    return [*rnd.sample(VOCABULARY, 40), f"run{i:05d}"]


FILLER = [f"f{n:05d}" for n in range(50_000)]
POOL_BYTES = 4_000_000
HEADER_BYTES = 4096
INSERT_RUN = (
    "INSERT INTO runs (id, agent, status, input, output, created_at, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def _inputs(runs: int, input_bytes: int, base: float) -> Iterator[tuple[str, str]]:
    """(run id, input JSON) per run, oldest first (created a second apart from ``base``):
    ids made as the store makes them."""
    from toren.core.drivers.runs import new_run_id

    rnd = random.Random(7)
    pool = " ".join(rnd.choices(FILLER, k=POOL_BYTES // 6))
    for i in range(runs):
        sentence = " ".join(_words(i)) + ". "
        header = sentence * (HEADER_BYTES // len(sentence) + 1)
        rest = max(0, input_bytes - len(header))
        start = rnd.randrange(0, max(1, len(pool) - rest))
        text = header + pool[start : start + rest]
        yield new_run_id(base + i), json.dumps({"i": i, "text": text})


async def seed(url: str, runs: int, input_bytes: int) -> float:
    """Create the schema through the store, then bulk-insert the runs; the seconds it took."""
    from toren.store import connect

    began = time.monotonic()
    store = await connect(url)  # migrates
    await store.close()
    output = json.dumps({"answer": "done"})
    base = time.time() - runs
    rows = (
        (run_id, "big", "completed", text, output, base + i, base + i)
        for i, (run_id, text) in enumerate(_inputs(runs, input_bytes, base))
    )
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            batch: list[tuple[object, ...]] = []
            for row in rows:
                batch.append(row)
                if len(batch) == 200:
                    with conn:
                        conn.executemany(INSERT_RUN, batch)
                    batch.clear()
            with conn:
                conn.executemany(INSERT_RUN, batch)
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(url) as conn, conn.cursor() as cur:
            with cur.copy(
                "COPY runs (id, agent, status, input, output, created_at, updated_at) FROM STDIN"
            ) as copy:
                for row in rows:
                    copy.write_row(row)
            conn.commit()
            cur.execute("ANALYZE runs")
            conn.commit()
    return time.monotonic() - began


def _query(rnd: random.Random, runs: int) -> str:
    words = _words(rnd.randrange(runs))
    kind = rnd.randrange(4)
    if kind == 0:
        return words[rnd.randrange(40)]
    if kind == 1:
        return f"{words[0]} {words[5]}"
    if kind == 2:
        return f'"{words[3]} {words[4]}"'
    return words[rnd.randrange(40)][:4] + "*"


async def _until_indexed(base: str, pid: int, runs: int) -> tuple[float, float]:
    """Seconds until the last seeded run is found, and the server's peak RSS meanwhile."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    conn = Connection(host, int(port))
    began, peak = time.monotonic(), rss_mb(pid)
    try:
        while True:
            status, _, body = await conn.get(
                f"/v1/runs?search=run{runs - 1:05d}", {"Authorization": f"Bearer {TOKEN}"}
            )
            peak = max(peak, rss_mb(pid))
            if status == 200 and json.loads(body)["runs"]:
                return time.monotonic() - began, peak
            await asyncio.sleep(0.2)
    finally:
        conn.close()


async def hammer(
    base: str, pid: int, clients: int, requests: int, runs: int
) -> tuple[list[float], int, float, float]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    latencies: list[float] = []
    errors = 0
    start = peak = rss_mb(pid)
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mb(pid))
            await asyncio.sleep(0.02)

    async def client(i: int) -> None:
        nonlocal errors
        rnd = random.Random(1000 + i)
        conn = Connection(host, int(port))
        try:
            for _ in range(requests):
                from urllib.parse import quote

                target = f"/v1/runs?limit=50&search={quote(_query(rnd, runs))}"
                began = time.perf_counter()
                try:
                    status, _, body = await conn.get(target, {"Authorization": f"Bearer {TOKEN}"})
                except (OSError, asyncio.IncompleteReadError):
                    errors += 1
                    conn.close()
                    continue
                latencies.append((time.perf_counter() - began) * 1000)
                if status != 200 or not json.loads(body)["runs"]:
                    errors += 1  # every query names words some run holds
        finally:
            conn.close()

    sampler = asyncio.ensure_future(sample())
    try:
        await asyncio.gather(*(client(i) for i in range(clients)))
    finally:
        done.set()
        await sampler
    return latencies, errors, start, peak


async def _seeded(url: str, runs: int) -> bool:
    from toren.store import connect

    store = await connect(url)
    try:
        return len(await store.list_runs(limit=runs, summary=True)) >= runs
    finally:
        await store.close()


async def measure(
    url: str | None,
    runs: int,
    input_bytes: int,
    clients: int,
    requests: int,
    reuse: bool = False,
) -> Result:
    async with database(url, fresh=not reuse) as (db, backend):
        if reuse and await _seeded(db, runs):
            seed_seconds = 0.0  # seeded by an earlier run of this bench (--reuse)
        else:
            seed_seconds = await seed(db, runs, input_bytes)
        print(f"seeded {runs} runs in {seed_seconds:.0f} s", flush=True)
        with server_process(db) as (base, proc):
            index_seconds, index_peak = await _until_indexed(base, proc.pid, runs)
            began, cpu = time.monotonic(), cpu_seconds(proc.pid)
            latencies, errors, start, peak = await hammer(base, proc.pid, clients, requests, runs)
            seconds = time.monotonic() - began
            cpu = cpu_seconds(proc.pid) - cpu
        if backend == "sqlite" and url is None:  # the fresh file (~1 GB per 1,000 runs)
            shutil.rmtree(Path(db.removeprefix("sqlite:///")).parent, ignore_errors=True)
    ordered = sorted(latencies)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 1)

    return Result(
        backend=backend,
        runs=runs,
        input_bytes=input_bytes,
        clients=clients,
        requests=len(latencies),
        p50_ms=round(statistics.median(ordered), 1),
        p95_ms=pct(0.95),
        p99_ms=pct(0.99),
        max_ms=round(ordered[-1], 1),
        errors=errors,
        rss_start_mb=round(start, 1),
        rss_max_mb=round(peak, 1),
        seed_seconds=round(seed_seconds, 1),
        index_seconds=round(index_seconds, 1),
        rss_max_while_indexing_mb=round(index_peak, 1),
        seconds=round(seconds, 1),
        server_cpu_ms_per_request=round(cpu * 1000 / max(1, len(latencies)), 2),
        load_average=round(os.getloadavg()[0], 1),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--input-bytes", type=int, default=900_000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=20, help="per client")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="--database-url names a database an earlier run seeded (and left, e.g. "
        "interrupted): use it as it is, search texts already built included",
    )
    parser.add_argument("--note", default="", help="recorded with the result")
    parser.add_argument("--json", type=Path, default=None, help="append the result here")
    args = parser.parse_args()
    result = asyncio.run(
        measure(
            args.database_url,
            args.runs,
            args.input_bytes,
            args.clients,
            args.requests,
            args.reuse,
        )
    )
    result.note = args.note
    print(json.dumps(asdict(result), indent=2))
    if args.json is not None:
        found = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps([*found, asdict(result)], indent=2) + "\n")


if __name__ == "__main__":
    main()
