"""Heavy rows under load: 200 concurrent clients list runs from a table of 1,000 runs with
1 MB inputs, against a real server process; the list latency (p50/p95/p99) and the server
process's resident memory, sampled every 20 ms from /proc, throughout.

    python -m bench.list_load [--database-url URL] [--reuse] [--runs 1000]
                              [--input-bytes 1000000] [--clients 200] [--requests 10]
                              [--limit 50] [--mode first|pages] [--conditional]
                              [--note TEXT] [--json PATH]

The clients are raw keep-alive HTTP/1.1 connections (``Connection``), cheap enough that
the server, not the load generator, is what is measured on a small machine; the result
includes the server's and the generator's CPU per request.

Without --database-url a fresh SQLite file is used; pass ``postgresql://...`` for
PostgreSQL (a fresh database is created on the server of that URL and dropped after).
The latency bound (p95 < 200 ms) is reported, not asserted by the test suite: wall-clock
depends on the machine. ``tests/api/test_load.py`` asserts the memory bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

TOKEN = "bench-list-load-token-0123456789"


@dataclass
class Result:
    backend: str
    runs: int
    input_bytes: int
    clients: int
    requests: int
    limit: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    errors: int
    response_bytes_max: int
    rss_start_mb: float
    rss_max_mb: float
    seconds: float
    server_cpu_ms_per_request: float  # CPU the server spent per list request
    load_average: float  # the machine's 1-minute load average when the run ended
    mode: str = "first"  # "first": every client asks for the newest page; "pages": all
    # the pages by cursor; "health": GET /v1/health (the HTTP stack's floor)
    conditional: bool = False  # clients send If-None-Match with their last ETag
    not_modified: int = 0  # answers that were 304
    pace: float = 0.0  # seconds each client waits between requests (0: back to back)
    client_cpu_ms_per_request: float = 0.0  # the load generator's CPU per request
    load_average_start: float = 0.0
    note: str = ""


# Runs started at once while seeding: the store commits concurrent writes together
# (SQLite's write queue, PostgreSQL's pool), which made seeding 1,000 runs of 1 MB two to
# three times faster than one after another (bench/RESULTS.md, "The test suite's time").
SEED_CONCURRENCY = 8


async def seed(url: str, runs: int, input_bytes: int) -> None:
    """``runs`` queued runs whose input is a JSON object of about ``input_bytes``."""
    import toren
    from toren.store import connect

    async def big(ctx: Any, input: Any) -> Any:
        return None

    registry = toren.Registry()
    registry.add("big", big)
    store = await connect(url)
    try:
        text = "x" * max(0, input_bytes - 32)
        slots = asyncio.Semaphore(SEED_CONCURRENCY)

        async def one(i: int) -> None:
            async with slots:
                await toren.start_run(store, registry, "big", {"i": i, "text": text})

        async with asyncio.TaskGroup() as group:  # one fails: the others are cancelled
            for i in range(runs):
                group.create_task(one(i))
    finally:
        await store.close()


SERVER = """
import asyncio, sys
import toren
from toren.api import create_app
from toren.api.server import serve
from toren.store import connect

async def main(url, port, token):
    async def big(ctx, input):
        return None
    registry = toren.Registry()
    registry.add("big", big)
    store = await connect(url)
    try:
        app = create_app(store, registry, tokens=[token], console=False)
        await serve(
            app, "127.0.0.1", port, log_level="warning", access_log=False,
            timeout_keep_alive=60, backlog=4096,
        )
    finally:
        await store.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used (from /proc/<pid>/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` (VmRSS), in MB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


@contextlib.contextmanager
def server_process(url: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # A file, not a pipe: an unread pipe can block the server. Closed in the finally below.
    log = tempfile.TemporaryFile()  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, url, str(port), TOKEN],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(log.read().decode(errors="replace") or "the server died")
            try:
                if httpx.get(f"{base}/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not start")
            time.sleep(0.05)
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class Connection:
    """One keep-alive HTTP/1.1 connection speaking just enough of the protocol for this
    bench (GET, a Content-Length body). httpx spent ~5 ms of CPU per request with 200
    connections in one process, more than the server: the load generator would have
    measured itself on a 2-core machine. This one costs a few tens of microseconds."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, target: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        lines = [f"GET {target} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *fields = head.decode("latin-1").split("\r\n")
        found: dict[str, str] = {}
        for field in fields:
            if field:
                name, _, value = field.partition(":")
                found[name.strip().lower()] = value.strip()
        size = int(found.get("content-length", "0"))
        body = await self.reader.readexactly(size) if size else b""
        if found.get("connection", "").lower() == "close":
            self.close()
        return int(status_line.split()[1]), found, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


async def hammer(
    base: str,
    pid: int,
    clients: int,
    requests: int,
    limit: int,
    *,
    conditional: bool = False,
    mode: str = "first",
    runs: int = 1000,
    pace: float = 0.0,
) -> tuple[list[float], int, int, float, float, int]:
    """Latencies (ms), errors, the largest response, RSS at the start and its maximum,
        and how many answers were 304 (``conditional``: each client sends the ETag of its
        previous answer to the same request, as a browser does for the console). ``pace``: each
    client waits that long after each answer (the console polls every 2 s), starting at a
    random offset within the first interval so the clients do not ask in step; 0: back to
    back (a closed loop, the harshest reading of "concurrent clients")."""
    latencies: list[float] = []
    errors = 0
    biggest = 0
    not_modified = 0
    start_rss = rss_mb(pid)
    peak = start_rss
    done = asyncio.Event()
    host, port = base.removeprefix("http://").rsplit(":", 1)
    cursors = await page_cursors(host, int(port), limit, runs) if mode == "pages" else []

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mb(pid))
            await asyncio.sleep(0.02)

    async def client(i: int) -> None:
        nonlocal errors, biggest, not_modified
        conn = Connection(host, int(port))
        tags: dict[str, str] = {}
        try:
            if pace:
                await asyncio.sleep(random.uniform(0, pace))
            for n in range(requests):
                if n and pace:
                    await asyncio.sleep(pace)
                if mode == "health":
                    target = "/v1/health"
                elif mode == "pages":
                    cursor = cursors[(i + n) % len(cursors)]
                    target = f"/v1/runs?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
                else:
                    target = f"/v1/runs?limit={limit}"
                headers = {"Authorization": f"Bearer {TOKEN}"}
                if conditional and target in tags:
                    headers["If-None-Match"] = tags[target]
                began = time.perf_counter()
                try:
                    status, found, body = await conn.get(target, headers)
                except (OSError, asyncio.IncompleteReadError):
                    errors += 1
                    conn.close()
                    continue
                latencies.append((time.perf_counter() - began) * 1000)
                if status == 304:
                    not_modified += 1
                elif status != 200 or (mode != "health" and len(json.loads(body)["runs"]) != limit):
                    errors += 1
                if "etag" in found:
                    tags[target] = found["etag"]
                biggest = max(biggest, len(body))
        finally:
            conn.close()

    sampler = asyncio.ensure_future(sample())
    try:
        await asyncio.gather(*(client(i) for i in range(clients)))
    finally:
        done.set()
        await sampler
    return latencies, errors, biggest, start_rss, peak, not_modified


async def page_cursors(host: str, port: int, limit: int, runs: int) -> list[str | None]:
    """The cursor of every full page of the table (None: the first page)."""
    conn = Connection(host, port)
    found: list[str | None] = [None]
    try:
        while len(found) < max(1, runs // limit):
            target = f"/v1/runs?limit={limit}&cursor={found[-1]}" if found[-1] else None
            status, _, body = await conn.get(
                target or f"/v1/runs?limit={limit}", {"Authorization": f"Bearer {TOKEN}"}
            )
            cursor = json.loads(body)["next_cursor"] if status == 200 else None
            if cursor is None:
                break
            found.append(cursor)
    finally:
        conn.close()
    return found


@contextlib.asynccontextmanager
async def database(url: str | None, fresh: bool = True) -> AsyncIterator[tuple[str, str]]:
    if url is not None and not fresh:
        yield url, "sqlite" if url.startswith("sqlite") else "postgres"
        return
    if url is None or url.startswith("sqlite"):
        path = Path(tempfile.mkdtemp(prefix="toren_list_load_")) / "toren.db"
        yield url or f"sqlite:///{path}", "sqlite"
        return
    import psycopg

    name = f"toren_list_load_{uuid.uuid4().hex[:8]}"
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url.rsplit("/", 1)[0] + f"/{name}", "postgres"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _seeded(url: str, runs: int) -> bool:
    """A database given with --database-url (and --reuse, on PostgreSQL) that already
    holds the runs is reused."""
    if url.startswith("sqlite") and not Path(url.removeprefix("sqlite:///")).exists():
        return False
    from toren.store import connect

    store = await connect(url)
    try:
        return len(await store.list_runs(limit=runs, summary=True)) >= runs
    finally:
        await store.close()


async def measure(
    url: str | None,
    runs: int = 1000,
    input_bytes: int = 1_000_000,
    clients: int = 200,
    requests: int = 10,
    limit: int = 50,
    fresh: bool = True,
    *,
    conditional: bool = False,
    mode: str = "first",
    pace: float = 0.0,
) -> Result:
    """``fresh``: on PostgreSQL, seed a new database on the URL's server (dropped after);
    False: use the URL's database as it is."""
    async with database(url, fresh) as (db, backend):
        if not await _seeded(db, runs):
            await seed(db, runs, input_bytes)
        with server_process(db) as (base, proc):
            load_start = os.getloadavg()[0]
            began, cpu = time.monotonic(), cpu_seconds(proc.pid)
            own = time.process_time()
            latencies, errors, biggest, start, peak, not_modified = await hammer(
                base,
                proc.pid,
                clients,
                requests,
                limit,
                conditional=conditional,
                mode=mode,
                runs=runs,
                pace=pace,
            )
            seconds = time.monotonic() - began
            cpu = cpu_seconds(proc.pid) - cpu
            own = time.process_time() - own
    ordered = sorted(latencies)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 1)

    return Result(
        backend=backend,
        runs=runs,
        input_bytes=input_bytes,
        clients=clients,
        requests=len(latencies),
        limit=limit,
        p50_ms=round(statistics.median(ordered), 1),
        p95_ms=pct(0.95),
        p99_ms=pct(0.99),
        max_ms=round(ordered[-1], 1),
        errors=errors,
        response_bytes_max=biggest,
        rss_start_mb=round(start, 1),
        rss_max_mb=round(peak, 1),
        seconds=round(seconds, 1),
        server_cpu_ms_per_request=round(cpu * 1000 / max(1, len(latencies)), 2),
        load_average=round(os.getloadavg()[0], 1),
        mode=mode,
        conditional=conditional,
        not_modified=not_modified,
        pace=pace,
        client_cpu_ms_per_request=round(own * 1000 / max(1, len(latencies)), 2),
        load_average_start=round(load_start, 1),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--input-bytes", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--requests", type=int, default=10, help="per client")
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument(
        "--mode",
        choices=("first", "pages", "health"),
        default="first",
        help="first: every client lists the newest page; pages: the clients walk every "
        "page of the table by cursor; health: GET /v1/health, the HTTP stack's floor",
    )
    parser.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="seconds each client waits between its requests (the console polls every "
        "2 s); 0: back to back",
    )
    parser.add_argument(
        "--conditional",
        action="store_true",
        help="clients send If-None-Match with the ETag of their previous answer",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="PostgreSQL: use the URL's database as it is (seeded if it holds fewer runs) "
        "instead of a fresh one",
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
            args.limit,
            not args.reuse,
            conditional=args.conditional,
            mode=args.mode,
            pace=args.pace,
        )
    )
    result.note = args.note
    print(json.dumps(asdict(result), indent=2))
    if args.json is not None:
        found = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps([*found, asdict(result)], indent=2) + "\n")


if __name__ == "__main__":
    main()
