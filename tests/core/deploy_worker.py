"""A worker process for the rolling-deploy tests. Its code version is VERSION ("A" or
"B"); the two versions differ only in the prompt of main-stream step 1. Runs until SIGTERM
(which drains it). The scripted provider appends every call it serves to LEDGER."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import toren
from toren.config import LeaseSettings
from toren.providers.scripted import ScriptedProvider

MAIN_STEPS = 14
CHILD_STEPS = 3
CHANGED_STEP = 1


def registry(version: str) -> toren.Registry:
    async def research(ctx: toren.Context, input: Any) -> Any:
        notes = []
        for j in range(CHILD_STEPS):
            r = await ctx.model(
                "scripted:x", [{"role": "user", "content": f"run {input['id']} research {j}"}]
            )
            notes.append(r.text)
        return notes

    async def deploy(ctx: toren.Context, input: Any) -> Any:
        notes = await ctx.spawn("research", {"id": input["id"]})
        replies = []
        for i in range(MAIN_STEPS):
            marker = f" [{version}]" if i == CHANGED_STEP else ""
            r = await ctx.model(
                "scripted:x", [{"role": "user", "content": f"run {input['id']} step {i}{marker}"}]
            )
            replies.append(r.text)
            await ctx.sleep(0.05)  # parks: the run goes back to the pool, any worker may take it
        return {"notes": notes, "replies": replies}

    reg = toren.Registry()
    reg.add("deploy", deploy, code_version=version)
    reg.add("deploy", research, process="research", code_version=version)
    return reg


def settings() -> toren.Settings:
    return toren.Settings(
        lease=LeaseSettings(ttl=3.0, heartbeat=0.2),
        poll_interval=0.05,
        drain_window=5.0,
        worker_ttl=2.0,
        inline_wait=0.0,
    )


async def main(url: str, version: str, ledger: str, latency: str, go: str = "") -> int:
    """With ``go``: once imported and connected, say so (``go + ".ready.<pid>"``) and wait
    for the file ``go`` before claiming anything: a test starts the new version's workers
    the moment it wants them, not after their imports, which on a loaded machine can take
    longer than the old version needs to finish every run."""
    store = await toren.connect(url)
    if go:
        Path(f"{go}.ready.{os.getpid()}").touch()
        while not Path(go).exists():
            await asyncio.sleep(0.01)
    provider = ScriptedProvider(
        {"default": {"text": "ok {last_user}"}, "latency": float(latency)}, ledger_path=ledger
    )
    deps = toren.TickDeps(
        store=store, agents=registry(version), providers={"scripted": provider}, settings=settings()
    )
    worker = toren.LocalWorkerRuntime(deps, concurrency=50)
    await worker.start()
    worker.install_signal_handlers()
    await worker.wait_stopped()
    await store.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:6])))
