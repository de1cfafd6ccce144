"""A worker process for the concurrency-key fleet test: serves the `job` agent (limit 2 per
`input.key`), whose one tool step calls the test's loopback server, until SIGTERM.

    python -m tests.core.flow_worker DB_URL SERVER_URL
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import httpx

import toren
from tests.core.schedule_worker import serve
from toren.config import LeaseSettings
from toren.core.contract.flow import Concurrency
from toren.providers.base import ToolSpec


def registry(server: str) -> toren.Registry:
    async def work(key: str, run: str) -> dict[str, Any]:
        began = time.time()  # before anything else: a freeze may land right after it
        async with httpx.AsyncClient(timeout=60) as http:
            # Which worker called, and when its tool began: a frozen worker's calls after
            # its thaw, of tools it began before the freeze, are told apart
            # (tests/core/test_flow_fleet.py).
            params = {"key": key, "run": run, "pid": str(os.getpid()), "began": repr(began)}
            response = await http.get(f"{server}/work", params=params)
            response.raise_for_status()
            return {"done": True}

    async def job(ctx: toren.Context, input: Any) -> Any:
        return await ctx.tool("work", {"key": input["key"], "run": ctx.run_id})

    reg = toren.Registry()
    reg.add(
        "job",
        job,
        tools={"work": toren.ToolDef("work", work, ToolSpec("work"))},
        concurrency=Concurrency(limit=2, key=("key",)),
    )
    return reg


async def main(url: str, server: str) -> None:
    settings = toren.Settings(lease=LeaseSettings(ttl=2.0, heartbeat=0.2), poll_interval=0.05)
    await serve(url, registry(server), settings, 16)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
