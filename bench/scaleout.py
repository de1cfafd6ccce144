"""Scale-out on PostgreSQL (issue 9): the latency-bound workload (runs of 10 steps, each a
call to the loopback model server answering in 200 ms) served by 1, 2 and 4 Toren worker
processes sharing one database, each worker running at most CONCURRENCY runs at once (so
one worker is bound by its slots and the model's latency, not by CPU: the case where
adding workers is the way to go faster). Toren only: it is the one system here whose workers
share a queue in the database (DBOS and LangGraph would need their own orchestration).

    python -m bench.scaleout [--runs 600] [--workers 1,2,4]

A worker process runs ``python -m bench.scaleout worker URL MODEL_URL`` until SIGTERM.
steps/s = all steps / (first run started -> last run completed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import toren
from bench import toren_bench as tb
from bench.common import Backend, ModelClient
from bench.run import start_model_server
from toren.config import LeaseSettings

REPO = Path(__file__).parents[1]
STEPS = 10
CONCURRENCY = 50  # runs per worker process at once


def settings() -> toren.Settings:
    return toren.Settings(lease=LeaseSettings(ttl=10, heartbeat=2), poll_interval=0.05)


async def serve(url: str, model_url: str) -> None:
    store = await toren.connect(url)
    model = tb.FakeModel(client=ModelClient(model_url))
    deps = toren.TickDeps(
        store=store, agents=tb.registry(), providers={"bench": model}, settings=settings()
    )
    worker = toren.LocalWorkerRuntime(deps, concurrency=CONCURRENCY)
    await worker.start()
    worker.install_signal_handlers()
    await worker.wait_stopped()
    await store.close()


async def measure(url: str, runs: int) -> float:
    store = await toren.connect(url)
    reg = tb.registry()
    t0 = time.perf_counter()
    ids = [
        (await toren.start_run(store, reg, "short", {"run": r, "steps": STEPS})).id
        for r in range(runs)
    ]
    for run_id in ids:
        final = await toren.wait_for_run(store, run_id, timeout=600)
        assert final.status == "completed", final.error
    elapsed = time.perf_counter() - t0
    await store.close()
    return runs * STEPS / elapsed


def one(workers: int, runs: int, model_url: str) -> float:
    backend = Backend.fresh("postgres", f"scaleout_{workers}")
    url = backend.pg_dsn
    asyncio.run(_migrate(url))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.scaleout", "worker", url, model_url],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        for _ in range(workers)
    ]
    try:
        time.sleep(2.0)  # let every worker import, connect and go idle
        return asyncio.run(measure(url, runs))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(60)
        backend.drop()


async def _migrate(url: str) -> None:
    store = await toren.connect(url)
    await store.close()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        asyncio.run(serve(sys.argv[2], sys.argv[3]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--latency", type=float, default=0.2)
    args = parser.parse_args()
    server, model_url = start_model_server(args.latency)
    try:
        results = {w: one(w, args.runs, model_url) for w in map(int, args.workers.split(","))}
    finally:
        server.kill()
        server.wait()
    base = results[min(results)]
    ms = args.latency * 1000
    table = Table(
        title=f"Toren scale-out, PostgreSQL: {args.runs} runs x {STEPS} steps, "
        f"{ms:.0f} ms model, {CONCURRENCY} runs/worker"
    )
    for col in ("worker processes", "steps/s", "vs one worker"):
        table.add_column(col)
    for w, rate in results.items():
        table.add_row(str(w), f"{rate:,.0f}", f"{rate / base:.2f}x")
    Console().print(table)
    Path(__file__).with_name("scaleout-results.json").write_text(
        json.dumps({"runs": args.runs, "steps": STEPS, "steps_per_s": results}, indent=2)
    )


if __name__ == "__main__":
    main()
