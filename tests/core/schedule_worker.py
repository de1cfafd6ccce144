"""A worker process for the schedule tests: serves the `tick` agent (one clock read, or a
wait for a message when its input asks) with one schedule, until SIGTERM.

    python -m tests.core.schedule_worker DB_URL CODE_VERSION SPEC_JSON
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import toren
from toren.core.contract.schedule import ScheduleDef, ScheduleSpec


async def tick(ctx: toren.Context, input: Any) -> Any:
    return {"at": await ctx.now()}


def registry(version: str, spec: dict[str, Any]) -> toren.Registry:
    reg = toren.Registry()
    schedule = ScheduleDef("tick", "beat", ScheduleSpec(**spec), input={"v": version})
    reg.add("tick", tick, code_version=version, schedules=[schedule])
    return reg


async def serve(
    url: str, agents: toren.Registry, settings: toren.Settings, concurrency: int
) -> None:
    """Serve ``agents`` on ``url`` until SIGTERM, saying "ready" once started (the worker
    scripts of the schedule and flow-control fleet tests)."""
    store = await toren.connect(url)
    deps = toren.TickDeps(store=store, agents=agents, settings=settings)
    worker = toren.LocalWorkerRuntime(deps, concurrency=concurrency)
    await worker.start()
    worker.install_signal_handlers()
    print("ready", flush=True)
    await worker.wait_stopped()
    await store.close()


async def main(url: str, version: str, spec: dict[str, Any]) -> None:
    await serve(url, registry(version, spec), toren.Settings(poll_interval=0.1), 8)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
