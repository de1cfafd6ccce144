"""Toren's side of the benchmark harness (see bench/scenarios.py for the contract).

Every scenario drives the real engine: a LocalWorkerRuntime claiming runs from the store,
ticks replaying and recording through ``ctx.model``, each step committed before the agent
continues. Durability: SQLite in WAL mode with synchronous=FULL (the same setting the peers
and the raw floor use), PostgreSQL with synchronous_commit on (the server default).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import toren
from bench.common import (
    SQLITE_SYNCHRONOUS,
    Backend,
    CrashCounter,
    ModelClient,
    StepClock,
    fake_model,
    peak_rss_mb,
)
from toren.config import LeaseSettings
from toren.providers.base import Message, ModelRequest, ModelResponse, Usage

NAME = "toren"


def info() -> dict[str, Any]:
    return {
        "version": toren.__version__,
        "durability": (
            f"sqlite WAL synchronous={SQLITE_SYNCHRONOUS}; postgres synchronous_commit=on"
        ),
    }


def store_url(backend: Backend) -> str:
    if backend.kind == "sqlite":
        return f"sqlite:///{backend.sqlite_path}?synchronous={SQLITE_SYNCHRONOUS.lower()}"
    return backend.pg_dsn


class FakeModel:
    """Zero latency, ~2 KB responses: step i answers ``fake_model(i)``. ``hook`` runs
    first on every live call (clock ticks, crash counters)."""

    name = "bench"

    def __init__(self, hook: Any = None, client: ModelClient | None = None) -> None:
        self.hook = hook
        self.client = client

    async def complete(self, request: ModelRequest, *, on_delta: Any = None) -> ModelResponse:
        step = int(request.params.get("step", 0))
        if self.hook is not None:
            await self.hook(step)
        if self.client is not None:
            text = await self.client.complete(str(request.messages[-1]["content"]))
        else:
            text = fake_model(step)
        return ModelResponse(text=text, usage=Usage(10, 500))


def settings(**kw: Any) -> toren.Settings:
    return toren.Settings(lease=LeaseSettings(ttl=5.0, heartbeat=1.0), poll_interval=0.05, **kw)


async def sequential_agent(ctx: toren.Context, input: Any) -> Any:
    for i in range(input["steps"]):
        await ctx.model("bench:fake", [{"role": "user", "content": f"step {i}"}], step=i)
    return input["steps"]


async def conversation_agent(ctx: toren.Context, input: Any) -> Any:
    history: list[Any] = [Message(role="system", content="You are a benchmark.")]
    for i in range(input["steps"]):
        history.append(Message(role="user", content=f"step {i}"))
        reply = await ctx.model("bench:fake", history, step=i)
        history.append(reply.message())
    return input["steps"]


async def short_agent(ctx: toren.Context, input: Any) -> Any:
    for i in range(input["steps"]):
        await ctx.model(
            "bench:fake", [{"role": "user", "content": f"run {input['run']} step {i}"}], step=i
        )
    return input["steps"]


def registry() -> toren.Registry:
    reg = toren.Registry()
    reg.add("sequential", sequential_agent)
    reg.add("conversation", conversation_agent)
    reg.add("short", short_agent)
    return reg


async def run_to_end(
    backend: Backend,
    agent: str,
    input: Any,
    model: FakeModel,
    *,
    concurrency: int = 1,
    idempotency_key: str | None = None,
    worker_id: str = "local",
) -> tuple[toren.store.Store, str]:
    store = await toren.connect(store_url(backend))
    reg = registry()
    deps = toren.TickDeps(
        store=store,
        agents=reg,
        providers={"bench": model},
        settings=settings(),
        worker_id=worker_id,
    )
    run = await toren.start_run(store, reg, agent, input, idempotency_key=idempotency_key)
    async with toren.LocalWorkerRuntime(deps, concurrency=concurrency):
        final = await toren.wait_for_run(store, run.id, timeout=3600)
    assert final.status == "completed", final.error
    return store, run.id


def sequential(backend: Backend, steps: int) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        clock = StepClock()

        async def tick(_: int) -> None:
            clock.tick()

        size0 = backend.size_bytes()
        t0 = time.perf_counter()
        store, _ = await run_to_end(backend, "sequential", {"steps": steps}, FakeModel(tick))
        elapsed = time.perf_counter() - t0
        await store.close()
        span = clock.t[-1] - clock.t[0]
        return {
            "steps": steps,
            "steps_per_s": round((steps - 1) / span, 1),
            "wall_steps_per_s": round(steps / elapsed, 1),
            "bytes_per_step": round((backend.size_bytes() - size0) / steps),
        }

    return asyncio.run(go())


def conversation(backend: Backend, steps: int) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        clock = StepClock()

        async def tick(_: int) -> None:
            clock.tick()

        size0 = backend.size_bytes()
        store, _ = await run_to_end(backend, "conversation", {"steps": steps}, FakeModel(tick))
        await store.close()
        span = clock.t[-1] - clock.t[0]
        return {
            "steps": steps,
            "steps_per_s": round((steps - 1) / span, 1),
            "bytes_per_step": round((backend.size_bytes() - size0) / steps),
            **clock.rates(),
        }

    return asyncio.run(go())


def concurrency(backend: Backend, runs: int, steps: int, model_url: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        store = await toren.connect(store_url(backend))
        reg = registry()
        model = FakeModel(client=ModelClient(model_url))
        deps = toren.TickDeps(
            store=store, agents=reg, providers={"bench": model}, settings=settings()
        )
        ids = [
            (await toren.start_run(store, reg, "short", {"run": r, "steps": steps})).id
            for r in range(runs)
        ]
        t0 = time.perf_counter()
        async with toren.LocalWorkerRuntime(deps, concurrency=runs):
            for run_id in ids:
                final = await toren.wait_for_run(store, run_id, timeout=3600)
                assert final.status == "completed", final.error
        elapsed = time.perf_counter() - t0
        await store.close()
        return {
            "runs": runs,
            "steps_per_s": round(runs * steps / elapsed, 1),
            "peak_rss_mb": peak_rss_mb(),
        }

    return asyncio.run(go())


def recovery_child(backend: Backend, steps: int, counter_path: str, hang_at: int) -> None:
    counter = CrashCounter(counter_path, hang_at)

    async def go() -> None:
        store, _ = await run_to_end(
            backend,
            "sequential",
            {"steps": steps},
            FakeModel(counter.ahit),
            idempotency_key="bench-recovery",
            worker_id="bench-worker",  # stable: the restarted process takes its run back
        )
        await store.close()

    asyncio.run(go())
