"""Every source of nondeterminism a live step records comes from ``TickDeps``: the clock
(``ctx.now()``, latencies, the flush cadence), ``random`` and ``uuid``; and the replay GC
pause is a setting."""

from __future__ import annotations

import gc
from typing import Any

import toren
from toren.core.contract.events import ModelCallRecorded, ToolCallRecorded, ValueRecorded
from toren.providers.base import ToolSpec
from toren.providers.scripted import ScriptedProvider
from toren.store import Store


async def agent(ctx: toren.Context, input: Any) -> Any:
    now = await ctx.now()
    r = await ctx.random()
    u = await ctx.uuid()
    await ctx.model("scripted:s", [{"role": "user", "content": "hi"}])
    await ctx.tool("echo", {"x": 1})
    return {"now": now, "random": r, "uuid": u}


def registry() -> toren.Registry:
    reg = toren.Registry()

    def echo(x: int) -> int:
        return x

    reg.add("a", agent, tools={"echo": toren.ToolDef("echo", echo, ToolSpec("echo"))})
    return reg


async def test_random_uuid_and_times_come_from_tick_deps(store: Store) -> None:
    clock = toren.ManualClock(1_800_000_000.0)
    reg = registry()
    deps = toren.TickDeps(
        store=store,
        agents=reg,
        providers={"scripted": ScriptedProvider({"default": {"text": "ok"}})},
        clock=clock,
        random=lambda: 0.25,
        uuid=lambda: "00000000-0000-4000-8000-000000000001",
    )
    run = await toren.start_run(store, reg, "a", {})
    result = await toren.tick(run.id, deps)
    assert result.status == "completed"
    assert result.output == {
        "now": 1_800_000_000.0,
        "random": 0.25,
        "uuid": "00000000-0000-4000-8000-000000000001",
    }
    events = await store.load_events(run.id)
    values = [e.payload.value for e in events if isinstance(e.payload, ValueRecorded)]
    assert values == [1_800_000_000.0, 0.25, "00000000-0000-4000-8000-000000000001"]
    # Latencies are measured on the clock's monotonic time: a manual clock stands still.
    latencies = [
        e.payload.latency_ms
        for e in events
        if isinstance(e.payload, (ModelCallRecorded, ToolCallRecorded))
    ]
    assert latencies == [0.0, 0.0]


async def test_the_replay_gc_pause_is_a_setting(store: Store) -> None:
    seen: list[bool] = []

    async def watch(ctx: toren.Context, input: Any) -> Any:
        seen.append(gc.isenabled())
        return await ctx.now()

    reg = toren.Registry()
    reg.add("w", watch)
    assert gc.isenabled()
    for pause in (True, False):
        deps = toren.TickDeps(
            store=store, agents=reg, settings=toren.Settings(pause_gc_on_replay=pause)
        )
        run = await toren.start_run(store, reg, "w", {})
        assert (await toren.tick(run.id, deps)).status == "completed"
    assert seen == [False, True]
    assert gc.isenabled()
