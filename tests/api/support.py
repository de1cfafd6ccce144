"""Agents and helpers shared by the API tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

import toren
from toren.api import create_app, running_server
from toren.client import AsyncTorenClient
from toren.providers.base import ToolSpec
from toren.providers.scripted import ScriptedProvider
from toren.store import Store

TOKEN = "tok-current-0123456789"
OLD_TOKEN = "tok-previous-0123456789"  # still accepted: token rotation
SECRET = "sk-test-SECRETKEY0123456789abcdef"  # a provider key the API must never echo


def registry() -> toren.Registry:
    reg = toren.Registry()

    async def echo(ctx: toren.Context, input: Any) -> Any:
        n = int((input or {}).get("n", 3)) if isinstance(input, dict) else 3
        messages: list[dict[str, Any]] = []
        for i in range(n):
            messages.append({"role": "user", "content": f"say something long number {i}"})
            reply = await ctx.model("scripted:echo", messages)
            messages.append(reply.message())
        return {"turns": n, "last": messages[-1]["content"]}

    async def approval(ctx: toren.Context, input: Any) -> Any:
        await ctx.model("scripted:echo", [{"role": "user", "content": "draft a refund"}])
        decision = await ctx.wait_for_message("approve")
        await ctx.model("scripted:echo", [{"role": "user", "content": f"decided {decision}"}])
        return {"decision": decision}

    async def mend(ctx: toren.Context, input: Any) -> Any:
        """Fails until the file ``input["fixed"]`` exists (a fix deployed), then waits for
        a message ``approve``: a retried run that is not over when its stream is read."""
        await ctx.model("scripted:echo", [{"role": "user", "content": "draft a refund"}])
        if not Path(input["fixed"]).exists():
            raise RuntimeError("not fixed yet")
        decision = await ctx.wait_for_message("approve")
        return {"decision": decision}

    async def slow(ctx: toren.Context, input: Any) -> Any:
        n = int(input.get("n", 10)) if isinstance(input, dict) else 10
        for i in range(n):
            await ctx.tool("tick", {"i": i})
        return {"ticks": n}

    async def tick(i: int) -> dict[str, Any]:
        await asyncio.sleep(0.02)
        return {"i": i}

    def leak() -> None:
        raise RuntimeError(f"provider refused key {SECRET}")

    tools = {
        "tick": toren.ToolDef("tick", tick, ToolSpec("tick")),
        "leak": toren.ToolDef("leak", leak, ToolSpec("leak")),
    }

    async def leaky(ctx: toren.Context, input: Any) -> Any:
        return await ctx.tool("leak", {})

    reg.add("echo", echo)
    reg.add("approval", approval)
    reg.add("mend", mend)
    reg.add("slow", slow, tools=tools)
    reg.add("slow", slow, process="batch", tools=tools)
    reg.add("leaky", leaky, tools=tools)
    return reg


@dataclass
class Api:
    url: str
    store: Store
    hub: toren.LiveHub
    runtime: toren.LocalWorkerRuntime
    client: AsyncTorenClient
    app: FastAPI

    def http(self, token: str | None = TOKEN, **kw: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30, **kw)


@contextlib.asynccontextmanager
async def worker(
    store: Store, hub: toren.LiveHub | None, concurrency: int = 50
) -> AsyncIterator[toren.LocalWorkerRuntime]:
    deps = toren.TickDeps(
        store=store,
        agents=registry(),
        providers={"scripted": ScriptedProvider()},
        live=hub,
        settings=toren.Settings(poll_interval=0.05),
    )
    runtime = toren.LocalWorkerRuntime(deps, concurrency=concurrency)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop(drain_window=0.5)


@contextlib.asynccontextmanager
async def serve_api(
    store: Store, *, live: bool = True, concurrency: int = 50, **app_options: Any
) -> AsyncIterator[Api]:
    """A real uvicorn server on 127.0.0.1 (ephemeral port) and a worker, in this loop."""
    hub = toren.LiveHub()
    async with worker(store, hub, concurrency) as runtime:
        app_options.setdefault("tokens", [TOKEN, OLD_TOKEN])
        app_options.setdefault("heartbeat", 0.3)
        app = create_app(
            store, registry(), live=hub if live else None, runtime=runtime, **app_options
        )
        async with (
            running_server(app) as server,
            AsyncTorenClient(server.url, TOKEN, stream_timeout=10) as client,
        ):
            yield Api(server.url, store, hub, runtime, client, app)


async def read_sse(response: httpx.Response, *, until: Any = None) -> list[dict[str, Any]]:
    """Parse an SSE response into messages ``{"event", "id", "data"|"comment"}`` until the
    stream closes or ``until(message)`` is true."""
    import json

    out: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if line.startswith(":"):
            out.append({"comment": line[1:].strip()})
            continue
        if line == "":
            if "data" in current:
                current["data"] = json.loads(current["data"])
                out.append(current)
                if until is not None and until(current):
                    return out
            current = {}
            continue
        name, _, value = line.partition(": ")
        current[name] = value
    return out
