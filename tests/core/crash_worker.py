"""A worker process for the crash tests: serves the `fifty` agent (50 model calls) until
the given run is finished, then exits 0. Killed with SIGKILL by the tests."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import toren
from toren.config import LeaseSettings
from toren.providers.scripted import ScriptedProvider

STEPS = 50
DRAINED = 4  # exit code: stopped by a signal before the run finished


async def fifty(ctx: toren.Context, input: Any) -> Any:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "count with me"}]
    for i in range(STEPS):
        messages.append({"role": "user", "content": f"step {i}"})
        reply = await ctx.model("scripted:echo", messages)
        messages.append(reply.message())
    return {"answers": [m["content"] for m in messages if m["role"] == "assistant"]}


def registry() -> toren.Registry:
    reg = toren.Registry()
    reg.add("fifty", fifty)
    return reg


async def main(url: str, ledger: str, run_id: str, latency: str) -> int:
    store = await toren.connect(url)
    provider = ScriptedProvider(
        {"default": {"text": "ok {last_user}"}, "latency": float(latency)}, ledger_path=ledger
    )
    settings = toren.Settings(
        lease=LeaseSettings(ttl=0.6, heartbeat=0.15), poll_interval=0.05, drain_window=0.3
    )
    deps = toren.TickDeps(
        store=store, agents=registry(), providers={"scripted": provider}, settings=settings
    )
    worker = toren.LocalWorkerRuntime(deps, concurrency=4)
    await worker.start()
    worker.install_signal_handlers()  # SIGTERM drains
    finished = asyncio.ensure_future(toren.wait_for_run(store, run_id, timeout=120))
    stopped = asyncio.ensure_future(worker.wait_stopped())
    await asyncio.wait({finished, stopped}, return_when=asyncio.FIRST_COMPLETED)
    await worker.stop()
    code = 0 if finished.done() and finished.result().status == "completed" else DRAINED
    finished.cancel()
    await store.close()
    return code


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:5])))
