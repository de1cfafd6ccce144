"""A timer's events ride on the tick's next write (issue 39).

A ``ctx.sleep`` that ends writes no commit of its own: its ``TimerFired`` goes to the store
ahead of the next write's events (the next step, an invalidation, or the release). A crash
that loses it changes nothing the run does: the replay finds the timer due and fires it
again at once. A sleep that parks writes its ``TimerScheduled`` with the park (lost, the
replay starts the timer again); one slept in place writes it first. These tests count the commits through the store, and take the lease from
under a wake whose model call is in flight (the first worker's write then fails, as a
killed worker's never happens)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import toren
from tests.core.test_message_step_totals import _race
from toren.config import LeaseSettings
from toren.core.contract.records import Lease, Release
from toren.core.drivers.fencing import lease_clock
from toren.core.drivers.tick import TickRunner
from toren.errors import LeaseLost
from toren.providers.base import ModelRequest, ModelResponse
from toren.providers.scripted import ScriptedProvider
from toren.store import Store

SETTINGS = toren.Settings(lease=LeaseSettings(ttl=30.0, heartbeat=5.0))


class Commits:
    """The store, noting the event types of every commit the tick makes (a release as
    ``release:<status>`` after its events)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.commits: list[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def append(self, lease: Lease, events: Any, **kw: Any) -> Any:
        stored = await self.store.append(lease, events, **kw)
        self.commits.append([e.type for e in events])
        return stored

    async def release(self, lease: Lease, release: Release, **kw: Any) -> Any:
        stored = await self.store.release(lease, release, **kw)
        self.commits.append([e.type for e in release.events] + [f"release:{release.status}"])
        return stored

    def take(self) -> list[list[str]]:
        commits, self.commits = self.commits, []
        return commits


class Gated:
    """The scripted model, whose calls wait for ``gate`` once it is closed."""

    name = "scripted"

    def __init__(self) -> None:
        self.inner = ScriptedProvider()
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()
        self.served = 0

    async def complete(self, request: ModelRequest, *, on_delta: Any = None) -> ModelResponse:
        self.served += 1
        self.entered.set()
        await self.gate.wait()
        return await self.inner.complete(request, on_delta=on_delta)


def sleeper(after: str = "model", seconds: float = 60) -> toren.Registry:
    async def agent(ctx: toren.Context, input: Any) -> Any:
        await ctx.sleep(seconds)
        if after == "return":
            return "woke"
        if after == "message":
            return await ctx.wait_for_message("go")
        reply = await ctx.model("scripted:echo", [{"role": "user", "content": "awake"}])
        await ctx.sleep(60)
        return reply.text

    reg = toren.Registry()
    reg.add("sleeper", agent)
    return reg


def deps_of(store: Any, reg: toren.Registry, clock: toren.ManualClock, **kw: Any) -> Any:
    provider = kw.pop("provider", None) or ScriptedProvider()
    return toren.TickDeps(
        store=store, agents=reg, providers={"scripted": provider}, clock=clock, **kw
    )


async def _types(store: Store, run_id: str) -> list[str]:
    return [e.type for e in await store.load_events(run_id)]


async def _chain_holds(store: Store, run_id: str) -> None:
    report = await toren.verify_run(store, run_id)
    assert report.ok and report.chain.linked == len(await store.load_events(run_id))


async def test_a_fired_timer_is_written_with_the_next_step(store: Store) -> None:
    clock = toren.ManualClock()
    reg = sleeper()
    commits = Commits(store)
    deps = deps_of(commits, reg, clock)
    run = await toren.start_run(store, reg, "sleeper", clock=clock)
    assert (await toren.tick(run.id, deps)).status == "waiting"
    # The sleep parks at once: its start is written with the park.
    assert commits.take()[-1] == ["TimerScheduled", "RunWaiting", "release:waiting"]

    await clock.advance(60)
    assert (await toren.tick(run.id, deps)).status == "waiting"
    # One commit for the timer's end and the model step, one for the next timer and park.
    assert commits.take() == [
        ["TimerFired", "ModelCallRecorded"],
        ["TimerScheduled", "RunWaiting", "release:waiting"],
    ]
    await clock.advance(60)
    done = await toren.tick(run.id, deps)
    assert done.status == "completed" and done.output
    # Nothing after it in the agent: the release carries it, ahead of the run's end.
    assert commits.take() == [["TimerFired", "RunCompleted", "release:completed"]]
    assert (await _types(store, run.id)).count("TimerFired") == 2
    await _chain_holds(store, run.id)


@pytest.mark.parametrize("after", ["return", "message"])
async def test_a_fired_timer_rides_on_the_release(store: Store, after: str) -> None:
    """The agent ends, or parks on a message, right after the sleep: the release writes the
    timer's end, before its own events, and a message then wakes the run as ever."""
    clock = toren.ManualClock()
    reg = sleeper(after)
    commits = Commits(store)
    deps = deps_of(commits, reg, clock)
    run = await toren.start_run(store, reg, "sleeper", clock=clock)
    assert (await toren.tick(run.id, deps)).status == "waiting"
    await clock.advance(60)
    commits.take()
    result = await toren.tick(run.id, deps)
    if after == "return":
        assert result.status == "completed" and result.output == "woke"
        assert commits.take() == [["TimerFired", "RunCompleted", "release:completed"]]
    else:
        assert result.status == "waiting"
        assert commits.take() == [["TimerFired", "RunWaiting", "release:waiting"]]
        await store.send_message(run.id, "go", "hello", now=clock.now())
        result = await toren.tick(run.id, deps)
        assert result.status == "completed" and result.output == "hello"
    assert (await _types(store, run.id)).count("TimerFired") == 1
    await _chain_holds(store, run.id)


async def test_a_timer_whose_end_was_lost_with_its_worker_fires_again(store: Store) -> None:
    """The wake's model call is in flight, its timer's end not yet written, when another
    worker takes the run over: the log has no ``TimerFired``; the new worker fires the timer
    and completes the run; the first worker's late write stores nothing. One of each event
    in the log; the call in flight was served again (as a step cut off in flight is), and
    nothing recorded was."""
    clock = toren.ManualClock()
    reg = sleeper()
    provider = Gated()
    w1 = deps_of(store, reg, clock, provider=provider, settings=SETTINGS, worker_id="w1")
    run = await toren.start_run(store, reg, "sleeper", clock=clock)
    assert (await toren.tick(run.id, w1)).status == "waiting"
    await clock.advance(60)

    provider.gate.clear()
    [lease] = await store.claim("w1", 1, now=clock.now(), ttl=30)
    first = asyncio.ensure_future(TickRunner(w1, lease, granted_at=lease_clock()).run())
    await provider.entered.wait()
    assert "TimerFired" not in await _types(store, run.id)  # not written on its own

    await clock.advance(31)  # w1's lease runs out
    [taken] = await store.claim("w2", 1, now=clock.now(), ttl=30)
    assert taken.worker_id == "w2" and taken.epoch == lease.epoch + 1
    w2 = deps_of(store, reg, clock, provider=Gated(), settings=SETTINGS, worker_id="w2")
    second = asyncio.ensure_future(TickRunner(w2, taken, granted_at=lease_clock()).run())
    while "ModelCallRecorded" not in await _types(store, run.id):
        assert not second.done(), second.result()
        await asyncio.sleep(0.001)
    provider.gate.set()
    assert (await first).status == "lease_lost"
    assert (await second).status == "waiting"
    types = await _types(store, run.id)
    assert types.count("TimerFired") == 1 and types.count("ModelCallRecorded") == 1
    assert types.index("TimerFired") < types.index("ModelCallRecorded")
    assert provider.served == 1  # the first worker's call: cut off by the takeover
    await _chain_holds(store, run.id)


async def test_a_refused_message_step_keeps_the_timer_for_the_next_write(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write that would carry the timer's end is refused (its message was consumed
    elsewhere, nothing stored): the timer's end is written with the next write."""
    clock = toren.ManualClock()
    reg = sleeper("message")
    commits = Commits(store)
    deps = deps_of(commits, reg, clock)
    run = await toren.start_run(store, reg, "sleeper", clock=clock)
    assert (await toren.tick(run.id, deps)).status == "waiting"
    await clock.advance(60)
    await store.send_message(run.id, "go", "taken elsewhere", now=clock.now())
    await store.send_message(run.id, "go", "second", now=clock.now())
    raced = _race(store, db_url, monkeypatch)
    commits.take()
    result = await toren.tick(run.id, deps)
    assert len(raced) == 1
    assert result.status == "completed" and result.output == "second"
    assert commits.take() == [
        ["TimerFired", "MessageReceived"],
        ["RunCompleted", "release:completed"],
    ]
    assert (await _types(store, run.id)).count("TimerFired") == 1
    await _chain_holds(store, run.id)


async def test_a_sleep_slept_in_place_writes_its_start_first(store: Store) -> None:
    """A sleep no longer than ``inline_wait`` is slept by the tick, not parked: its start
    is committed before it sleeps (a crash then must not start it again)."""
    clock = toren.ManualClock()
    reg = sleeper("return", seconds=1)
    commits = Commits(store)
    deps = deps_of(commits, reg, clock)
    run = await toren.start_run(store, reg, "sleeper", clock=clock)
    tick = asyncio.ensure_future(toren.tick(run.id, deps))
    while "TimerScheduled" not in await _types(store, run.id):
        assert not tick.done(), tick.result()
        await asyncio.sleep(0.001)
    assert commits.commits[-1] == ["TimerScheduled"]
    await clock.advance(1)
    result = await tick
    assert result.status == "completed" and result.output == "woke"
    assert commits.take()[-1] == ["TimerFired", "RunCompleted", "release:completed"]


async def test_a_timer_start_lost_before_its_park_starts_again(store: Store) -> None:
    """The park that would write the sleep's start fails (the lease moved): nothing of the
    sleep is in the log; the next holder starts it again, from its own clock, and it fires
    a full sleep later."""
    clock = toren.ManualClock()
    reg = sleeper("return")
    w1 = deps_of(store, reg, clock, settings=SETTINGS, worker_id="w1")
    run = await toren.start_run(store, reg, "sleeper", clock=clock)
    [lease] = await store.claim("w1", 1, now=clock.now() - 31, ttl=30)  # already run out
    [taken] = await store.claim("w2", 1, now=clock.now(), ttl=30)
    with pytest.raises(LeaseLost):  # its park, which carries the sleep's start
        await TickRunner(w1, lease, granted_at=lease_clock()).run()
    assert await _types(store, run.id) == ["RunStarted"]

    await clock.advance(10)
    w2 = deps_of(store, reg, clock, settings=SETTINGS, worker_id="w2")
    parked = await TickRunner(w2, taken, granted_at=lease_clock()).run()
    assert parked.status == "waiting" and parked.not_before == clock.now() + 60
    await clock.advance(60)
    done = await toren.tick(run.id, w2)
    assert done.status == "completed" and done.output == "woke"
    assert await _types(store, run.id) == [
        "RunStarted",
        "TimerScheduled",
        "RunWaiting",
        "TimerFired",
        "RunCompleted",
    ]
    await _chain_holds(store, run.id)


class GatedStore:
    """The store, whose first append after ``arm()`` waits for ``gate`` (holding the
    writer's lock meanwhile)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.armed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def append(self, lease: Lease, events: Any, **kw: Any) -> Any:
        if self.armed:
            self.armed = False
            self.entered.set()
            await self.gate.wait()
        return await self.store.append(lease, events, **kw)


async def test_a_timer_started_after_a_supersede_follows_its_invalidation(store: Store) -> None:
    """A branch supersedes a sleep and starts the new one (deferred) while another branch's
    write already waits for the writer's lock: that write must not carry the new timer's
    start ahead of the invalidation (found in review: the run then conflicted with its
    own log at every tick). The new start follows the invalidation, and the run ends."""
    clock = toren.ManualClock()
    go = asyncio.Event()

    async def v1(ctx: toren.Context, input: Any) -> Any:
        await ctx.gather(ctx.spawn("w"), ctx.sleep(60))

    async def w1(ctx: toren.Context, input: Any) -> Any:
        return await ctx.wait_for_message("go")

    async def v2(ctx: toren.Context, input: Any) -> Any:
        async def naps() -> None:
            await go.wait()
            await ctx.sleep(30)  # was 60: superseded

        await ctx.gather(ctx.spawn("w"), naps())
        return "done"

    async def w2(ctx: toren.Context, input: Any) -> Any:
        a, b = await ctx.gather(
            ctx.model("scripted:echo", [{"role": "user", "content": "y"}]),
            ctx.model("scripted:echo", [{"role": "user", "content": "x"}]),
        )
        return [a.text, b.text]

    r1, r2 = toren.Registry(), toren.Registry()
    r1.add("a", v1)
    r1.add("a", w1, process="w")
    r2.add("a", v2)
    r2.add("a", w2, process="w")
    run = await toren.start_run(store, r1, "a", clock=clock)
    assert (await toren.tick(run.id, deps_of(store, r1, clock))).status == "waiting"
    await store.send_message(run.id, "go", 1, now=clock.now())

    gated = GatedStore(store)
    gated.armed = True
    tick = asyncio.ensure_future(toren.tick(run.id, deps_of(gated, r2, clock)))
    await asyncio.wait_for(gated.entered.wait(), 30)  # the first model write holds the lock
    for _ in range(20):
        await asyncio.sleep(0)  # the second model write queues on the lock
    go.set()  # the sleep is superseded, and the new one deferred
    for _ in range(20):
        await asyncio.sleep(0)
    gated.gate.set()
    assert (await tick).status == "waiting"
    main1 = [
        e.type
        for e in await store.load_events(run.id)
        if e.type == "StreamInvalidated" or (e.stream == "main" and e.position == 1)
    ]
    assert main1 == ["TimerScheduled", "StreamInvalidated", "TimerScheduled"], main1

    await clock.advance(30)
    done = await toren.tick(run.id, deps_of(store, r2, clock))
    assert done.status == "completed" and done.output == "done"
    await _chain_holds(store, run.id)


async def test_a_burst_of_due_timers_is_claimed_in_batches_and_fires_on_shared_writes(
    store: Store, monkeypatch: Any
) -> None:
    """Issue 39's timers in bulk, in one piece: 40 runs parked on ``ctx.sleep``, all due at
    one instant, one worker. Its claims take many runs a statement; each run's
    ``TimerFired`` rides on its next step's write (no commit of its own); and on
    PostgreSQL the writes of different runs share statements (the batched append)."""
    clock = toren.ManualClock(1_700_000_000.0)
    reg = sleeper()
    deps = deps_of(store, reg, clock, settings=toren.Settings(poll_interval=0.02))
    runs = [await toren.start_run(store, reg, "sleeper", {}, clock=clock) for _ in range(40)]
    for run in runs:
        assert (await toren.tick(run.id, deps)).status == "waiting"
    claims: list[int] = []
    commits: dict[str, list[list[str]]] = {}
    real_claim, real_append = store.claim, store.append

    async def claim(*args: Any, **kw: Any) -> Any:
        leases = await real_claim(*args, **kw)
        if leases:
            claims.append(len(leases))
        return leases

    async def append(lease: Lease, events: Any, **kw: Any) -> Any:
        stored = await real_append(lease, events, **kw)
        commits.setdefault(lease.run_id, []).append([e.type for e in events])
        return stored

    monkeypatch.setattr(store, "claim", claim)
    monkeypatch.setattr(store, "append", append)
    batched_before = getattr(store, "batched_steps", 0)
    await clock.advance(61)  # every timer due at once
    async with toren.LocalWorkerRuntime(deps, concurrency=40):
        for _ in range(3000):
            if all(run.id in commits for run in runs):
                break
            await asyncio.sleep(0.01)
    assert sorted(commits) == sorted(run.id for run in runs)
    assert sum(claims) == len(runs) and max(claims) > 1, claims  # many runs a claim
    for run in runs:
        assert commits[run.id][0] == ["TimerFired", "ModelCallRecorded"]
        assert (await _types(store, run.id)).count("TimerFired") == 1
    if store.dialect == "postgres":
        assert store.batched_steps - batched_before >= 2  # type: ignore[attr-defined]
