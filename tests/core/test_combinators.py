"""ctx.gather and ctx.task_group: branches the engine knows.

A run whose branches all wait on durable waits through them parks from what the tick was
told (no asyncio internals read), holds no task afterwards, resumes by replay into the
same positions the bare asyncio combinators gave, cancels siblings on a failure, and
still mixes with bare ``asyncio.gather`` (through the fallback)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest

import toren
import toren.core.drivers.parker as tick_module  # where the Parker takes its verdicts
from toren.core.agent_api import branches as branches_module
from toren.core.agent_api.branches import IDLE, UNKNOWN, Branches, Verdict
from toren.core.agent_api.combinators import TaskGroup, gather
from toren.providers.scripted import ScriptedProvider
from toren.store import Store

from .test_engine import Mailbox, make_deps


class Spy:
    """The tick's verdicts, and every task its facts named (to check none outlives it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.verdicts: list[Verdict] = []
        self.tasks: set[asyncio.Future[Any]] = set()
        self.known: list[Branches] = []
        self.taken = asyncio.Event()  # a verdict was taken: the tick considered parking
        real = tick_module.verdict

        def spy(root: Any, durable: Any, known: Branches | None = None) -> Verdict:
            found = real(root, durable, known)
            self.verdicts.append(found)
            self.taken.set()
            self.tasks.add(root)
            if known is not None:
                self.known.append(known)
                self.tasks |= known.tasks()
            return found

        monkeypatch.setattr(tick_module, "verdict", spy)

    def parked_from_facts(self) -> bool:
        """The run parked on an IDLE verdict taken without reading asyncio's internals."""
        return (
            bool(self.verdicts)
            and self.verdicts[-1].state == IDLE
            and not any(v.inferred for v in self.verdicts)
        )

    def nothing_held(self) -> bool:
        return all(t.done() for t in self.tasks) and all(k.held() == 0 for k in self.known)

    def reset(self) -> None:
        self.verdicts.clear()


async def _aw(aw: Awaitable[Any]) -> Any:
    return await aw


def waiting_agent(style: str) -> Any:
    """Two branches, each on a durable wait (a message, a long timer), combined by
    ``style``; steps before and after them."""

    async def agent(ctx: toren.Context, input: Any) -> Any:
        first = await ctx.now()
        if style == "ctx.gather":
            go, _ = await ctx.gather(ctx.wait_for_message("go"), ctx.sleep(3600))
        elif style == "asyncio.gather":
            go, _ = await asyncio.gather(ctx.wait_for_message("go"), ctx.sleep(3600))
        elif style == "ctx.task_group":
            async with ctx.task_group() as tg:
                got = tg.create_task(_aw(ctx.wait_for_message("go")))
                tg.create_task(_aw(ctx.sleep(3600)))
            go = got.result()
        else:
            async with asyncio.TaskGroup() as group:
                got = group.create_task(_aw(ctx.wait_for_message("go")))
                group.create_task(_aw(ctx.sleep(3600)))
            go = got.result()
        last = await ctx.now()
        return {"go": go, "slept": last - first}

    return agent


def signature(events: list[Any]) -> list[tuple[Any, ...]]:
    """What replay matches on: each step's stream, position, kind and digest."""
    return [(e.stream, e.position, e.type, e.digest) for e in events if e.position is not None]


@pytest.mark.parametrize(
    ("durable", "bare"),
    [("ctx.gather", "asyncio.gather"), ("ctx.task_group", "asyncio.TaskGroup")],
)
async def test_branches_all_waiting_park_from_facts_and_resume_in_the_bare_positions(
    store: Store, monkeypatch: pytest.MonkeyPatch, durable: str, bare: str
) -> None:
    clock = toren.ManualClock()
    spy = Spy(monkeypatch)
    reg = toren.Registry()
    reg.add(durable, waiting_agent(durable))
    reg.add(bare, waiting_agent(bare))
    deps = make_deps(store, reg, ScriptedProvider(), clock=clock)
    runs = {}
    for style in (durable, bare):
        spy.reset()
        run = await toren.start_run(store, reg, style, clock=clock)
        first = await toren.tick(run.id, deps)
        assert first.status == "waiting", first
        parked = await store.get_run(run.id)
        assert parked is not None and parked.status == "waiting"
        assert parked.waiting_for == ["go"] and parked.not_before == clock.now() + 3600
        # The engine's own combinators park from facts; the bare ones only by inference.
        assert spy.parked_from_facts() is (style == durable), spy.verdicts
        assert spy.nothing_held()  # every branch unwound: no task outlives the tick
        runs[style] = run.id

    await clock.advance(3600)
    for style, run_id in runs.items():
        await store.send_message(run_id, "go", style, now=clock.now())
        final = await toren.tick(run_id, deps)
        assert final.status == "completed", final
        assert final.output == {"go": style, "slept": 3600}
        assert final.invalidations == 0 and final.replayed == 1  # the first ctx.now()
    logs = {style: signature(await store.load_events(run_id)) for style, run_id in runs.items()}
    assert logs[durable] == logs[bare]  # same positions and digests as the bare combinator
    # now (0), the message (1) and the timer (2) in call order, then now (3). The wake's
    # claim read the message (Lease.message), so its branch writes it without waiting for
    # a read; the timer's end, written with the tick's next write, comes after it.
    assert [(p, t) for _, p, t, _ in logs[durable]] == [
        (0, "ValueRecorded"),
        (2, "TimerScheduled"),
        (1, "MessageReceived"),
        (2, "TimerFired"),
        (3, "ValueRecorded"),
    ]


@pytest.mark.parametrize("style", ["ctx.gather", "ctx.task_group"])
async def test_a_failing_branch_cancels_its_siblings_before_the_run_fails(
    store: Store, style: str
) -> None:
    progress: list[str] = []

    async def agent(ctx: toren.Context, input: Any) -> Any:
        async def works() -> None:
            await ctx.now()
            try:
                await asyncio.sleep(3600)  # work outside ctx: an HTTP call, say
            except asyncio.CancelledError:
                progress.append("cancelled")
                raise
            progress.append("finished")

        async def fails() -> None:
            await ctx.now()
            raise RuntimeError("bug in a branch")

        if style == "ctx.gather":
            await ctx.gather(works(), fails())
        else:
            async with ctx.task_group() as tg:
                tg.create_task(works())
                tg.create_task(fails())

    reg = toren.Registry()
    reg.add("a", agent)
    deps = make_deps(store, reg, ScriptedProvider())
    run = await toren.start_run(store, reg, "a")
    result = await toren.tick(run.id, deps)
    assert result.status == "failed", result
    assert result.error is not None
    if style == "ctx.gather":  # raised as itself
        assert result.error["type"] == "RuntimeError"
        assert result.error["message"] == "bug in a branch"
    else:  # as asyncio.TaskGroup: in an exception group
        assert result.error["type"] == "ExceptionGroup"
    assert progress == ["cancelled"]


async def test_mixed_with_bare_asyncio_gather_parks_through_the_fallback(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = toren.ManualClock()
    spy = Spy(monkeypatch)

    async def agent(ctx: toren.Context, input: Any) -> Any:
        (a, _), b = await asyncio.gather(
            ctx.gather(ctx.wait_for_message("a"), ctx.sleep(3600)), ctx.wait_for_message("b")
        )
        return [a, b]

    reg = toren.Registry()
    reg.add("mixed", agent)
    deps = make_deps(store, reg, ScriptedProvider(), clock=clock)
    run = await toren.start_run(store, reg, "mixed", clock=clock)
    first = await toren.tick(run.id, deps)
    assert first.status == "waiting", first
    assert spy.verdicts[-1].state == IDLE and spy.verdicts[-1].inferred
    assert spy.nothing_held()
    await clock.advance(3600)
    await store.send_message(run.id, "a", 1, now=clock.now())
    await store.send_message(run.id, "b", 2, now=clock.now())
    final = await toren.tick(run.id, deps)
    assert final.status == "completed" and final.output == [1, 2], final


async def test_without_the_asyncio_internals_ctx_gather_still_parks_from_facts(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an interpreter whose tasks have no ``_fut_waiter`` (simulated), code written
    with ctx.gather parks exactly as before; bare asyncio.gather takes the documented
    UNKNOWN path (let ready branches run, then park) and resumes all the same."""
    monkeypatch.setattr(branches_module, "_WAITER", "_no_such_attribute")
    spy = Spy(monkeypatch)
    reg = toren.Registry()

    async def durable(ctx: toren.Context, input: Any) -> Any:
        return await ctx.gather(ctx.wait_for_message("a"), ctx.wait_for_message("b"))

    async def bare(ctx: toren.Context, input: Any) -> Any:
        return await asyncio.gather(ctx.wait_for_message("a"), ctx.wait_for_message("b"))

    reg.add("durable", durable)
    reg.add("bare", bare)
    deps = make_deps(store, reg, ScriptedProvider())
    for name, state in (("durable", IDLE), ("bare", UNKNOWN)):
        spy.reset()
        run = await toren.start_run(store, reg, name)
        assert (await toren.tick(run.id, deps)).status == "waiting"
        assert [v.state for v in spy.verdicts][-1] == state
        await store.send_message(run.id, "a", 1, now=0)
        await store.send_message(run.id, "b", 2, now=0)
        final = await toren.tick(run.id, deps)
        assert final.status == "completed" and final.output == [1, 2], final


@pytest.mark.parametrize("internals", ["readable", "unreadable"])
async def test_a_ctx_gather_branch_busy_outside_ctx_holds_the_run_until_it_reaches_ctx(
    store: Store, monkeypatch: pytest.MonkeyPatch, internals: str
) -> None:
    """A foreign await inside a ctx.gather branch: the engine was not told about it, so
    it looks at that branch through the fallback and waits for it (up to park_grace).
    Where the fallback cannot read asyncio (simulated), a branch the engine knows is
    waited for all the same: it is not cut off by the UNKNOWN path."""
    if internals == "unreadable":
        monkeypatch.setattr(branches_module, "_WAITER", "_no_such_attribute")
    spy = Spy(monkeypatch)
    mailbox = Mailbox()
    reached, gate = asyncio.Event(), asyncio.Event()

    async def fetch_then_send(ctx: toren.Context) -> Any:
        reached.set()
        await gate.wait()  # e.g. an HTTP call made without ctx
        return await ctx.tool("send_email", {"to": "a@example.com", "body": "fetched"})

    async def agent(ctx: toren.Context, input: Any) -> Any:
        go, sent = await ctx.gather(ctx.wait_for_message("go"), fetch_then_send(ctx))
        return {"go": go, "sent": sent}

    reg = toren.Registry()
    reg.add("a", agent, tools=mailbox.tools())
    deps = make_deps(store, reg, ScriptedProvider(), settings=toren.Settings(park_grace=3600))
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
    assert spy.verdicts[-1].state == IDLE and spy.nothing_held()
    await store.send_message(run.id, "go", "now", now=0)
    final = await toren.tick(run.id, deps)
    assert final.status == "completed", final
    assert final.output == {"go": "now", "sent": {"status": "sent", "n": 1}}
    assert len(mailbox.sent) == 1


# -- the combinators alone, without an engine ---------------------------------------------


class _Abort(BaseException):
    """Stands for the engine's aborts (``toren.core.drivers.aborts.Abort``)."""


async def _cancelled_marker(progress: list[str], name: str) -> str:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        progress.append(f"cancelled {name}")
        raise
    return name


async def test_gather_results_in_order_errors_in_place_but_never_an_abort() -> None:
    async def value(v: Any) -> Any:
        await asyncio.sleep(0)
        return v

    async def fail(exc: BaseException) -> Any:
        raise exc

    assert await gather() == []
    assert await gather(value(1), value("b")) == [1, "b"]
    same = asyncio.ensure_future(value(7))
    assert await gather(same, same) == [7, 7]
    error = ValueError("x")
    assert await gather(value(1), fail(error), return_exceptions=True) == [1, error]
    progress: list[str] = []
    with pytest.raises(_Abort):
        await gather(fail(_Abort()), _cancelled_marker(progress, "a"), return_exceptions=True)
    assert progress == ["cancelled a"]  # cancelled and unwound before the abort left
    gathering = gather(value(1))
    await gathering
    with pytest.raises(RuntimeError, match="awaited once"):
        await gathering


async def test_cancelling_a_gather_cancels_and_awaits_every_branch() -> None:
    progress: list[str] = []
    task = asyncio.ensure_future(
        _aw(gather(_cancelled_marker(progress, "a"), _cancelled_marker(progress, "b")))
    )
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(progress) == ["cancelled a", "cancelled b"]


async def test_task_group_is_asyncio_s_with_aborts_raised_as_themselves() -> None:
    progress: list[str] = []

    async def fail(exc: BaseException) -> None:
        await asyncio.sleep(0)
        raise exc

    with pytest.raises(ExceptionGroup) as caught:
        async with TaskGroup() as tg:
            tg.create_task(_cancelled_marker(progress, "sibling"))
            tg.create_task(fail(ValueError("x")))
            await _cancelled_marker(progress, "body")  # the body is cancelled too
    assert [type(e) for e in caught.value.exceptions] == [ValueError]
    assert sorted(progress) == ["cancelled body", "cancelled sibling"]

    progress.clear()
    with pytest.raises(_Abort):  # not in a group an except* could take apart
        async with TaskGroup() as tg:
            tg.create_task(_cancelled_marker(progress, "sibling"))
            tg.create_task(fail(_Abort()))
    assert progress == ["cancelled sibling"]

    async with TaskGroup() as tg:
        first = tg.create_task(asyncio.sleep(0, "a"))

        async def nested() -> str:
            await asyncio.sleep(0)
            tg.create_task(asyncio.sleep(0))  # a branch may start branches
            return "b"

        second = tg.create_task(nested())
    assert (first.result(), second.result()) == ("a", "b")


@pytest.mark.parametrize("internals", ["readable", "unreadable"])
async def test_a_task_group_branch_at_work_while_the_body_waits_is_not_cut_off(
    store: Store, monkeypatch: pytest.MonkeyPatch, internals: str
) -> None:
    """The body of a ctx.task_group waits on a message while one of its branches works
    outside ctx: nobody awaits that branch yet, but the engine knows the group is open,
    so it waits for the branch before parking."""
    if internals == "unreadable":
        monkeypatch.setattr(branches_module, "_WAITER", "_no_such_attribute")
    spy = Spy(monkeypatch)
    mailbox = Mailbox()
    reached, gate = asyncio.Event(), asyncio.Event()

    async def fetch_then_send(ctx: toren.Context) -> Any:
        reached.set()
        await gate.wait()  # e.g. an HTTP call made without ctx
        return await ctx.tool("send_email", {"to": "a@example.com", "body": "fetched"})

    async def agent(ctx: toren.Context, input: Any) -> Any:
        async with ctx.task_group() as tg:
            sent = tg.create_task(fetch_then_send(ctx))
            go = await ctx.wait_for_message("go")
        return {"go": go, "sent": sent.result()}

    reg = toren.Registry()
    reg.add("a", agent, tools=mailbox.tools())
    deps = make_deps(store, reg, ScriptedProvider(), settings=toren.Settings(park_grace=3600))
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
    assert spy.verdicts[-1].state == IDLE and spy.nothing_held()
    await store.send_message(run.id, "go", "now", now=0)
    final = await toren.tick(run.id, deps)
    assert final.status == "completed", final
    assert final.output == {"go": "now", "sent": {"status": "sent", "n": 1}}
    assert len(mailbox.sent) == 1
