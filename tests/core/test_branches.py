"""Parking loses nothing: a run parks only when every branch of its agent code waits on a
durable wait, never while a branch is in the middle of work outside ``ctx``."""

from __future__ import annotations

import asyncio
from typing import Any

import toren
from toren.config import Settings
from toren.core.branches import BUSY, IDLE, READY, verdict
from toren.providers.scripted import ScriptedProvider
from toren.store import Store

from .test_engine import Mailbox, make_deps


async def test_a_branch_busy_outside_ctx_is_not_cancelled_by_parking(store: Store) -> None:
    """One branch waits for a message (durable); the other awaits work the log does not
    cover, then calls a tool. The run parks only after that branch reached its tool."""
    mailbox = Mailbox()
    reached, gate = asyncio.Event(), asyncio.Event()

    async def fetch_then_send(ctx: toren.Context) -> Any:
        reached.set()
        await gate.wait()  # e.g. an HTTP call made without ctx
        return await ctx.tool("send_email", {"to": "a@example.com", "body": "fetched"})

    async def agent(ctx: toren.Context, input: Any) -> Any:
        go, sent = await asyncio.gather(ctx.wait_for_message("go"), fetch_then_send(ctx))
        return {"go": go, "sent": sent}

    reg = toren.Registry()
    reg.add("a", agent, tools=mailbox.tools())
    deps = make_deps(store, reg, ScriptedProvider(), settings=Settings(park_grace=3600))
    run = await toren.start_run(store, reg, "a")
    tick = asyncio.ensure_future(toren.tick(run.id, deps))
    await reached.wait()
    for _ in range(50):  # give a tick that would park early every chance to do so
        await asyncio.sleep(0)
    assert not tick.done()
    gate.set()
    first = await tick
    assert first.status == "waiting", first
    assert len(mailbox.sent) == 1  # the branch got to its tool before the run parked

    await store.send_message(run.id, "go", "now", now=0)
    final = await toren.tick(run.id, deps)
    assert final.status == "completed", final
    assert final.output == {"go": "now", "sent": {"status": "sent", "n": 1}}
    assert len(mailbox.sent) == 1  # replayed, not sent again


async def test_park_grace_bounds_the_wait_for_a_branch_busy_outside_ctx(store: Store) -> None:
    """A branch that never finishes its outside work does not hold the run forever: after
    park_grace the run parks anyway (that work runs again on resume)."""
    never = asyncio.Event()

    async def agent(ctx: toren.Context, input: Any) -> Any:
        go, _ = await asyncio.gather(ctx.wait_for_message("go"), never.wait())
        return go

    reg = toren.Registry()
    reg.add("a", agent)
    deps = make_deps(store, reg, ScriptedProvider(), settings=Settings(park_grace=0.01))
    run = await toren.start_run(store, reg, "a")
    result = await toren.tick(run.id, deps)
    assert result.status == "waiting", result
    parked = await store.get_run(run.id)
    assert parked is not None and parked.waiting_for == ["go"]


# -- the walk itself, over each way agent code may combine branches -----------------------


class Waits:
    """Durable waits as the tick makes them: futures it knows, resolved only by parking."""

    def __init__(self) -> None:
        self.futures: set[asyncio.Future[Any]] = set()

    async def wait(self) -> None:
        fut = asyncio.get_running_loop().create_future()
        self.futures.add(fut)
        await fut

    def verdict(self, task: asyncio.Task[Any]) -> str:
        return verdict(task, self.futures.__contains__).state


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def check(make: Any, expected: str) -> None:
    waits = Waits()
    task = asyncio.ensure_future(make(waits))
    await settle()
    try:
        assert waits.verdict(task) == expected
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_verdict_sees_through_gather_task_groups_wait_and_wait_for() -> None:
    async def gathered(w: Waits) -> Any:
        return await asyncio.gather(w.wait(), w.wait())

    async def grouped(w: Waits) -> Any:
        async with asyncio.TaskGroup() as group:
            group.create_task(w.wait())
            group.create_task(w.wait())

    async def first_of(w: Waits) -> Any:
        tasks = {asyncio.ensure_future(w.wait()), asyncio.ensure_future(w.wait())}
        return await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)

    async def bounded(w: Waits) -> Any:
        return await asyncio.wait_for(w.wait(), timeout=3600)

    async def awaited_task(w: Waits) -> Any:
        return await asyncio.ensure_future(gathered(w))

    for make in (gathered, grouped, first_of, bounded, awaited_task):
        await check(make, IDLE)


async def test_verdict_finds_a_branch_busy_outside_ctx_at_any_depth() -> None:
    async def sleeping(w: Waits) -> Any:
        return await asyncio.gather(w.wait(), asyncio.sleep(3600))

    async def grouped(w: Waits) -> Any:
        async with asyncio.TaskGroup() as group:
            group.create_task(w.wait())
            group.create_task(asyncio.Event().wait())

    async def first_of(w: Waits) -> Any:
        tasks = {asyncio.ensure_future(w.wait()), asyncio.ensure_future(asyncio.sleep(3600))}
        return await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)

    async def threaded(w: Waits) -> Any:
        blocker = asyncio.Event()
        return await asyncio.gather(w.wait(), asyncio.to_thread(lambda: None), blocker.wait())

    for make in (sleeping, grouped, first_of, threaded):
        await check(make, BUSY)


async def test_verdict_lets_a_ready_branch_run() -> None:
    waits = Waits()
    task = asyncio.ensure_future(waits.wait())  # created, not yet started: ready to run
    assert waits.verdict(task) == READY
    await settle()
    assert waits.verdict(task) == IDLE
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
