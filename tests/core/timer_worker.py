"""A worker process for the timer tests: serves the `clock` agent (one clock read) until
SIGTERM; then drains and prints its wake-up and claim counters as one JSON line on stdout.
On PostgreSQL the tests give it a poll interval of an hour, so only a timer's due time
(``store.next_due``) or a NOTIFY can wake it.

    python -m tests.core.timer_worker DB_URL CONCURRENCY POLL_INTERVAL
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import toren


async def clock(ctx: toren.Context, input: Any) -> Any:
    return {"at": await ctx.now()}


def registry() -> toren.Registry:
    reg = toren.Registry()
    reg.add("clock", clock, code_version="timer-v1")
    return reg


async def main(url: str, concurrency: int, poll_interval: float) -> None:
    store = await toren.connect(url)
    deps = toren.TickDeps(
        store=store, agents=registry(), settings=toren.Settings(poll_interval=poll_interval)
    )
    worker = toren.LocalWorkerRuntime(deps, concurrency=concurrency)
    await worker.start()
    worker.install_signal_handlers()
    print("ready", flush=True)
    await worker.wait_stopped()
    await store.close()
    metrics = worker.metrics
    print(json.dumps({"wakes": dict(metrics.wakes), "claimed": dict(metrics.claimed)}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
