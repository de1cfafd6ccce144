"""A message step whose message is consumed under it keeps its lease.

``ctx.wait_for_message`` reads the run's next message (``next_message``), then writes
the step that receives it, consuming the message in the same write. If another writer
consumed the message in between, the store refuses the step (``MessageConsumed``): the
lease still holds, so the step takes the next message in the same tick, or, with none
left, the run parks (its lease released) until one is sent. Only a write whose lease
fence failed (another worker claimed the run: its epoch moved) ends the tick as
``lease_lost``. Before this, a refused consume ended the tick as ``lease_lost`` too, and
the worker left the run claimed until its lease ran out: a silent stall of the lease's
TTL for a run waiting for a message.

The race is arranged deterministically: the tick's read (``TickState.next_message``) is
wrapped so that the message it returns is consumed by another writer (its own committed
transaction) before the step writes. The read is answered by the claim (``Lease.message``,
the inbox's oldest message, read in the claim's statement) or by the store; both are
raced.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

import toren
from tests.core.test_message_step_totals import _consume_elsewhere, _race
from toren.core.contract.values import RunStatus, TickStatus
from toren.core.drivers.tickstate import TickState
from toren.store import Store
from toren.store.base import InboxMessage


async def _waits(ctx: toren.Context, input: Any) -> Any:
    return await ctx.wait_for_message("go", timeout=input)


def _deps(store: Store, clock: toren.ManualClock) -> tuple[toren.Registry, toren.TickDeps]:
    reg = toren.Registry()
    reg.add("waits", _waits)
    return reg, toren.TickDeps(store=store, agents=reg, clock=clock)


async def _received(store: Store, run_id: str) -> list[tuple[Any, int]]:
    """The messages the run's log says it received: (payload, inbox id)."""
    return [
        (e.payload.payload, e.payload.inbox_id)  # type: ignore[attr-defined]
        for e in await store.load_events(run_id)
        if e.type == "MessageReceived"
    ]


async def _chain_holds(store: Store, run_id: str) -> None:
    """The write the store refused stored nothing and did not move the tick's link in the
    run's event chain: every event links to the one before it (docs/event-log.md)."""
    report = await toren.verify_run(store, run_id)
    assert report.ok and not report.chain.breaks, report.to_dict()
    assert report.chain.linked == len(await store.load_events(run_id))


@pytest.mark.parametrize("timeout", [None, 3600.0])
async def test_a_message_consumed_under_the_step_parks_the_run_and_releases_it(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch, timeout: float | None
) -> None:
    clock = toren.ManualClock()
    reg, deps = _deps(store, clock)
    run = await toren.start_run(store, reg, "waits", timeout, clock=clock)
    taken = await store.send_message(run.id, "go", "first", now=clock.now())
    raced = _race(store, db_url, monkeypatch)

    first = await toren.tick(run.id, deps)
    assert raced == [taken]
    assert first.status == TickStatus.WAITING, first.error
    row = await store.get_run(run.id)
    assert row is not None and row.status == RunStatus.WAITING
    assert row.lease_owner is None and row.waiting_for == ["go"]
    assert await _received(store, run.id) == []

    # The next message wakes the run at once: no lease to run out first.
    second = await store.send_message(run.id, "go", "second", now=clock.now())
    done = await toren.tick(run.id, deps)
    assert done.status == TickStatus.COMPLETED and done.output == "second"
    assert await _received(store, run.id) == [("second", second)]
    await _chain_holds(store, run.id)


@pytest.mark.parametrize("read_by", ["claim", "store"])
async def test_a_message_consumed_under_the_step_takes_the_next_one_in_the_same_tick(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch, read_by: str
) -> None:
    clock = toren.ManualClock()
    reg, deps = _deps(store, clock)
    run = await toren.start_run(store, reg, "waits", clock=clock)
    taken = await store.send_message(run.id, "go", "first", now=clock.now())
    second = await store.send_message(run.id, "go", "second", now=clock.now())
    (lease,) = await store.claim("w1", 1, now=clock.now(), ttl=60, only=run.id)
    assert lease.message is not None and lease.message.id == taken
    if read_by == "store":  # a claim that did not read the inbox
        lease = replace(lease, message=None)
    store_reads = _count_store_reads(store, monkeypatch)
    raced = _race(store, db_url, monkeypatch)

    result = await toren.tick(run.id, deps, lease=lease)
    # The claim answered the first read, or the store did; the store the second.
    assert store_reads == [["go"]] * (1 if read_by == "claim" else 2)
    assert raced == [taken]
    assert result.status == TickStatus.COMPLETED and result.output == "second"
    assert result.executed == 1
    # Each message is received once: the first by the other writer, the second here.
    assert await _received(store, run.id) == [("second", second)]
    row = await store.get_run(run.id)
    assert row is not None and row.lease_owner is None
    assert await store.next_message(run.id, ["go"]) is None
    await _chain_holds(store, run.id)


def _count_store_reads(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The names of each read of the inbox the store answers."""
    plain_next = store.next_message
    reads: list[list[str]] = []

    async def counted(run_id: str, names: Any) -> InboxMessage | None:
        reads.append(list(names))
        return await plain_next(run_id, names)

    monkeypatch.setattr(store, "next_message", counted)
    return reads


@pytest.mark.parametrize("consumed", [True, False])
async def test_a_step_whose_lease_moved_still_ends_lease_lost(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch, consumed: bool
) -> None:
    """Another worker claimed the run (its lease ran out: the epoch moved) while the step
    was reading its message, whether or not the message is consumed too: the lease is
    lost, and the tick stops without writing anything."""
    clock = toren.ManualClock()
    reg, deps = _deps(store, clock)
    run = await toren.start_run(store, reg, "waits", clock=clock)
    await store.send_message(run.id, "go", "first", now=clock.now())
    plain_next = TickState.next_message
    claimed: list[Any] = []

    async def claimed_meanwhile(state: TickState, name: str, **kw: Any) -> InboxMessage | None:
        message = await plain_next(state, name, **kw)
        if message is not None and not claimed:
            later = clock.now() + deps.settings.lease.ttl + 1
            claimed.extend(await store.claim("w2", 1, now=later, ttl=60, only=state.run_id))
            if consumed:
                _consume_elsewhere(db_url, message.id)
        return message

    monkeypatch.setattr(TickState, "next_message", claimed_meanwhile)
    result = await toren.tick(run.id, deps)
    assert [lease.run_id for lease in claimed] == [run.id]
    assert result.status == TickStatus.LEASE_LOST
    assert result.error is not None and result.error["code"] == "lease_lost"
    row = await store.get_run(run.id)
    assert row is not None and row.lease_owner == "w2"
    assert row.lease_epoch == claimed[0].epoch
    assert await _received(store, run.id) == []
    if not consumed:  # still there for the worker that holds the run now
        assert await store.next_message(run.id, ["go"]) is not None


async def test_an_inbox_that_offers_a_refused_message_again_stops_the_tick(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store whose reads keep offering the message its write refused (a stale read,
    say) would make the step take it again and again: the tick stops instead, as for
    any store failure under a step, and the run is given back blocked."""
    clock = toren.ManualClock()
    reg, deps = _deps(store, clock)
    run = await toren.start_run(store, reg, "waits", clock=clock)
    await store.send_message(run.id, "go", "first", now=clock.now())
    plain_next = TickState.next_message
    stale: list[InboxMessage] = []
    reads: list[int] = []

    async def stale_next(state: TickState, name: str, **kw: Any) -> InboxMessage | None:
        if not stale:
            message = await plain_next(state, name, **kw)
            assert message is not None
            _consume_elsewhere(db_url, message.id)
            stale.append(message)
        reads.append(stale[0].id)
        return stale[0]

    monkeypatch.setattr(TickState, "next_message", stale_next)
    result = await toren.tick(run.id, deps)
    assert result.status == TickStatus.ERROR
    assert result.error is not None and result.error["code"] == "storage_error"
    assert "again after refusing it" in result.error["message"]
    assert reads == [stale[0].id] * 2  # refused once, then offered again: stopped
    row = await store.get_run(run.id)
    assert row is not None and row.lease_owner is None and row.blocked_error is not None
    assert await _received(store, run.id) == []


async def test_a_worker_releases_a_run_whose_message_was_consumed_under_its_step(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: the worker's tick parks the run (released, not left claimed), so the
    next message is taken at once. The clock never moves: a run left claimed could only
    go on once its lease ran out, which it never does here."""
    clock = toren.ManualClock(time.time())
    reg, deps = _deps(store, clock)
    deps.settings = toren.Settings(poll_interval=0.05)
    run = await toren.start_run(store, reg, "waits", clock=clock)
    taken = await store.send_message(run.id, "go", "first", now=clock.now())
    raced = _race(store, db_url, monkeypatch)
    async with toren.LocalWorkerRuntime(deps) as worker:
        deadline = time.monotonic() + 20
        while run.id not in worker.results:  # the worker's first tick of the run
            assert time.monotonic() < deadline, "timed out waiting for the first tick"
            await asyncio.sleep(0.01)
        assert raced == [taken]
        assert worker.results[run.id].status == TickStatus.WAITING
        row = await store.get_run(run.id)
        assert row is not None and row.status == RunStatus.WAITING and row.lease_owner is None
        second = await store.send_message(run.id, "go", "second", now=clock.now())
        final = await toren.wait_for_run(store, run.id, timeout=30)
    assert final.status == RunStatus.COMPLETED and final.output == "second"
    assert await _received(store, run.id) == [("second", second)]
