"""Parking loses nothing: a run parks only when every branch of its agent code waits on a
durable wait, never while a branch is in the middle of work outside ``ctx``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import toren
from toren.config import Settings
from toren.core.agent_api import branches as branches_module
from toren.core.agent_api.branches import (
    BUSY,
    IDLE,
    READY,
    Branches,
    verdict,
)
from toren.core.agent_api.combinators import gather
from toren.providers.scripted import ScriptedProvider
from toren.store import Store
from toren.store.sql import loop_is_idle

from .asyncio_probe import CHECKS, Waits, settle
from .test_combinators import Spy
from .test_engine import Mailbox, make_deps


async def test_a_branch_busy_outside_ctx_is_not_cancelled_by_parking(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One branch waits for a message (durable); the other awaits work the log does not
    cover, then calls a tool. The run parks only after that branch reached its tool."""
    spy = Spy(monkeypatch)
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
    await spy.taken.wait()  # the other branch parked: the tick asked whether to park
    for _ in range(50):  # give a tick that would park early every chance to do so
        await asyncio.sleep(0)
    assert not tick.done(), spy.verdicts
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


# -- what the engine was told: facts before the fallback ----------------------------------


async def test_facts_answer_without_reading_asyncio_internals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Branches joined by a Toren combinator and parked through Branches are judged from
    those facts alone: with the internals made unreadable, the walk still says IDLE."""
    monkeypatch.setattr(branches_module, "_WAITER", "_no_such_attribute")
    known = Branches()

    async def parked() -> None:
        future = asyncio.get_running_loop().create_future()
        with known.parked(future):
            await future

    async def main() -> Any:
        return await gather(parked(), parked(), branches=known)

    task = asyncio.ensure_future(main())
    await settle()
    try:
        found = verdict(task, lambda f: False, known)
        assert (found.state, found.inferred) == (IDLE, False)
        assert len(known.tasks()) == 3  # the joining task and its two branches
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert known.held() == 0


async def test_a_join_whose_branch_just_failed_is_ready_before_its_wake_up_runs() -> None:
    """The moment a branch fails, its join is about to wake (asyncio.wait's contract),
    even though the callbacks that wake it have not run yet: ready, not idle."""
    known = Branches()
    first, second = asyncio.Future[None](), asyncio.Future[None]()

    async def join() -> None:
        with known.joining([first, second], first_exception=True):
            await asyncio.wait([first, second], return_when=asyncio.FIRST_EXCEPTION)
        await asyncio.Future()  # stays, so the test can look at it

    task = asyncio.ensure_future(join())
    await settle()
    parked_forever = {second}  # the other branch is a durable wait
    # ``first`` stands for work outside ctx: busy until it ends
    assert verdict(task, parked_forever.__contains__, known).state == BUSY
    first.set_exception(ValueError("x"))
    assert verdict(task, parked_forever.__contains__, known).state == READY
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    first.exception()  # retrieved


# -- the fallback's reads of asyncio's internals: fail loudly if they change --------------
#
# core/agent_api/branches.py reads these for tasks the engine was not told about (bare asyncio
# combinators), and store/sql.py loop_is_idle reads the loop's ready queue. They are not
# public API. If one of these fails on a new Python, the fallback there gives UNKNOWN
# (bare combinators park after letting ready branches run) and group commit never goes
# inline: update core/agent_api/branches.py for that Python, and the verified versions in
# docs/agent-code.md. The same checks run alone on any Python: tests/core/asyncio_probe.py.


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
async def test_asyncio_internals_the_fallback_reads(check: Any) -> None:
    problem = await check()
    if problem is not None:
        pytest.fail(problem)


async def test_loop_is_idle_reads_the_ready_queue() -> None:
    loop = asyncio.get_running_loop()
    assert loop_is_idle(loop)
    loop.call_soon(lambda: None)
    assert not loop_is_idle(loop)
    await asyncio.sleep(0)
    assert loop_is_idle(loop)


def test_a_ready_queue_added_to_while_read_is_not_idle() -> None:
    """Another thread's ``call_soon_threadsafe`` (the SQLite thread settling a job) may
    append to the loop's ready queue while ``loop_is_idle`` walks it: that is not an error
    (it failed a request with "deque mutated during iteration" under load in CI) but a
    queue with work in it. Here the append comes from the walk itself, deterministically:
    a cancelled handle whose check adds another."""
    import collections

    class Appending:
        def __init__(self, ready: collections.deque[object]) -> None:
            self.ready = ready

        def cancelled(self) -> bool:
            self.ready.append(object())  # what the other thread did meanwhile
            return True

    class Loop:
        _ready: collections.deque[object] = collections.deque()

    loop = Loop()
    loop._ready.extend([Appending(loop._ready), Appending(loop._ready)])
    assert loop_is_idle(loop) is False  # type: ignore[arg-type]


async def test_a_cancelled_handle_keeps_nobody_waiting() -> None:
    """A handle cancelled after it was queued stays in the ready queue until the loop's
    next turn drops it: it runs nothing, so the loop counts as idle; one live handle
    beside it does not."""
    loop = asyncio.get_running_loop()
    loop.call_soon(lambda: None).cancel()
    assert len(loop._ready) == 1  # type: ignore[attr-defined]
    assert loop_is_idle(loop)
    live = loop.call_soon(lambda: None)
    assert not loop_is_idle(loop)
    live.cancel()
    assert loop_is_idle(loop)
    await asyncio.sleep(0)
