"""Concurrent event reads against a real server process (issue 34: "the occasional dropped
connection under 200 concurrent event reads on PostgreSQL").

    python -m bench.event_reads [--database-url URL] [--clients 200] [--requests 10]
                                [--events 300] [--think 0] [--keep-alive 5]

One run with ``--events`` events (a tool call each, ~1 KB) is written by a real worker;
then ``--clients`` clients, each its own ``httpx.AsyncClient`` (its defaults: a pooled
keep-alive connection kept for 5 s), read ``GET /v1/runs/{id}/events?limit=1000``
``--requests`` times each, waiting ``--think`` seconds (uniformly 0 to ``--think``)
between two reads, as a console or a poller does. The server is a separate process serving
the app as ``toren serve`` does, with uvicorn's keep-alive timeout ``--keep-alive``
(``toren serve --keep-alive``). Every failure is counted by its kind: an HTTP status, or
the transport error httpx raised (``RemoteProtocolError``: the server closed the
connection without an answer).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from bench.list_load import TOKEN, database, free_port

SERVER = """
import asyncio, sys
import toren
from toren.api import create_app
from toren.api.server import serve
from toren.store import connect

async def main(url, port, token, keep_alive):
    store = await connect(url)
    try:
        app = create_app(store, toren.Registry(), tokens=[token], console=False)
        await serve(app, "127.0.0.1", port, log_level="warning", access_log=False,
                    timeout_keep_alive=keep_alive)
    finally:
        await store.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])))
"""


async def seed(url: str, events: int) -> str:
    """One completed run of ``events`` tool calls, written by a real worker."""
    import toren
    from toren.providers.base import ToolSpec

    async def echo(i: int) -> dict[str, Any]:
        return {"i": i, "text": "lorem ipsum dolor sit amet " * 40}

    async def many(ctx: toren.Context, input: Any) -> Any:
        for i in range(int(input["n"])):
            await ctx.tool("echo", {"i": i})
        return {"done": True}

    registry = toren.Registry()
    registry.add("many", many, tools={"echo": toren.ToolDef("echo", echo, ToolSpec("echo"))})
    store = await toren.connect(url)
    try:
        run = await toren.start_run(store, registry, "many", {"n": events})
        deps = toren.TickDeps(store=store, agents=registry, providers={})
        worker = toren.LocalWorkerRuntime(deps, concurrency=1)
        await worker.start()
        try:
            await toren.wait_for_run(store, run.id, timeout=600)
        finally:
            await worker.stop(drain_window=1)
        return run.id
    finally:
        await store.close()


@contextmanager
def server_process(url: str, keep_alive: float, log_path: str | None) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = open(log_path, "w+b") if log_path else tempfile.TemporaryFile()  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, url, str(port), TOKEN, str(keep_alive)],
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
        yield base
    finally:
        proc.terminate()
        proc.wait(30)
        log.seek(0)
        tail = log.read().decode(errors="replace").strip()
        if tail:
            print("server stderr:", tail[-2000:], file=sys.stderr)
        log.close()


async def hammer(
    base: str, run_id: str, clients: int, requests: int, think: float, events: int
) -> dict[str, Any]:
    kinds: collections.Counter[str] = collections.Counter()
    latencies: list[float] = []

    async def client(i: int) -> None:
        rnd = random.Random(i)
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120
        ) as http:
            for n in range(requests):
                if n and think:
                    await asyncio.sleep(rnd.uniform(0, think))
                began = time.perf_counter()
                try:
                    r = await http.get(f"/v1/runs/{run_id}/events", params={"limit": 1000})
                except httpx.TransportError as exc:
                    kinds[f"{type(exc).__name__}: {exc}"[:120]] += 1
                    continue
                latencies.append((time.perf_counter() - began) * 1000)
                if r.status_code != 200:
                    kinds[f"HTTP {r.status_code}"] += 1
                elif len(r.json()["events"]) < events:
                    kinds["short page"] += 1
                else:
                    kinds["ok"] += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    ordered = sorted(latencies) or [0.0]
    return {
        "answers": dict(kinds),
        "p50_ms": round(ordered[len(ordered) // 2], 1),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 1),
        "max_ms": round(ordered[-1], 1),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    async with database(args.database_url) as (db, backend):
        run_id = await seed(db, args.events)
        with server_process(db, args.keep_alive, args.server_log) as base:
            found = await hammer(
                base, run_id, args.clients, args.requests, args.think, args.events + 2
            )
    return {
        "backend": backend,
        "clients": args.clients,
        "requests": args.requests,
        "events": args.events,
        "think_s": args.think,
        "keep_alive_s": args.keep_alive,
        "load_average": round(os.getloadavg()[0], 1),
        **found,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--think", type=float, default=0.0)
    parser.add_argument("--keep-alive", type=float, default=5.0)
    parser.add_argument("--server-log", default=None, help="keep the server's stderr here")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args)), indent=2))


if __name__ == "__main__":
    main()
