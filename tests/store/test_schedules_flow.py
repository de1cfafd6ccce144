"""Schedules meet the rest of the runtime, on both databases: a firing goes through the
agent's ``concurrency:`` like any start (a keyed limit queues it; ``on_conflict: reject``
makes it a recorded skip, once); a schedule whose agent is not in the newest deploy is
orphaned, visibly, and comes back with it; a buffered time waiting for its run costs no
write per look; a batch of firings is applied in a few statements."""

from __future__ import annotations

from typing import Any

import pytest

import toren
from toren.core.contract.clock import ManualClock
from toren.core.contract.flow import Concurrency
from toren.core.contract.schedule import ScheduleDef, ScheduleSpec
from toren.core.drivers.scheduler import Scheduler
from toren.errors import ConcurrencyConflict, InvalidInput
from toren.store import Store

T0 = 1_780_308_000.0  # 2026-06-01T10:00:00Z
EVERY_MINUTE = ScheduleSpec(every=60, overlap="allow_all")


def agents(concurrency: Concurrency | None = None) -> toren.Registry:
    async def tick(ctx: toren.Context, input: Any) -> Any:
        return {"at": await ctx.now()}

    reg = toren.Registry()
    reg.add("tick", tick, concurrency=concurrency)
    return reg


async def _runs(store: Store, sid: str = "tick/beat") -> list[Any]:
    found = []
    for run_id, _, _ in await store.schedules.runs_of(sid, limit=100):
        run = await store.get_run(run_id)
        assert run is not None
        found.append(run)
    return sorted(found, key=lambda r: r.scheduled_for)


async def test_a_firing_takes_its_agents_keyed_limit(store: Store) -> None:
    clock = ManualClock(T0 - 1)
    limit = Concurrency(limit=1, key=("customer",))
    await store.schedules.create(
        ScheduleDef("tick", "beat", EVERY_MINUTE, input={"customer": "acme"}), now=clock.now()
    )
    scheduler = Scheduler(store.schedules, clock, agents(limit))
    for _ in range(2):
        await clock.advance(60)
        assert await scheduler.look() == 1
    runs = await _runs(store)
    assert [(r.concurrency_key, r.concurrency_limit) for r in runs] == [("tick/main:acme", 1)] * 2
    # The limit holds: one claim takes the first, the second stays queued behind it.
    leases = await store.claim("w1", 10, now=clock.now(), ttl=30)
    assert [lease.run_id for lease in leases] == [runs[0].id]
    queued = await store.get_run(runs[1].id)
    assert queued is not None and queued.status == "queued"
    why = await store.queued_because(queued)
    assert why is not None and why.position == 1 and why.holding == 1


async def test_a_firing_its_agent_rejects_is_a_recorded_skip_once(store: Store) -> None:
    clock = ManualClock(T0 - 1)
    reject = Concurrency(limit=1, on_conflict="reject")
    await store.schedules.create(ScheduleDef("tick", "beat", EVERY_MINUTE), now=clock.now())
    scheduler = Scheduler(store.schedules, clock, agents(reject))
    await clock.advance(1)
    assert await scheduler.look() == 1  # 10:00 starts (queued: unfinished)
    await clock.advance(60)
    assert await scheduler.look() == 0  # 10:01: the key is busy, the agent refuses
    row = await store.schedules.get("tick/beat")
    assert row is not None
    assert (row.fires, row.skips, row.last_skip_at) == (1, 1, T0 + 60)
    assert row.last_skip_reason is not None and "on_conflict: reject" in row.last_skip_reason
    assert row.next_fire_at == T0 + 120 and row.last_fired_at == T0
    shown = row.to_dict()
    assert shown["last_skip"]["reason"] == row.last_skip_reason  # type: ignore[index]
    # Decided once: the next looks do nothing (no error, no retry of 10:01).
    for _ in range(3):
        assert await scheduler.look() == 0
    assert scheduler.metrics.lost_races == 0
    assert sum(scheduler.metrics.skips.values()) == 1
    assert len(await _runs(store)) == 1
    # A trigger is a person's start: refused as a start from the API would be.
    with pytest.raises(ConcurrencyConflict):
        await scheduler.trigger("tick/beat")
    # A backfill starts what the key allows and counts the rest as refused.
    assert await scheduler.backfill("tick/beat", T0 - 180, T0) == (0, 0, 3)


async def test_cancel_previous_concurrency_cancels_the_running_run(store: Store) -> None:
    clock = ManualClock(T0 - 1)
    cancel = Concurrency(limit=1, on_conflict="cancel_previous")
    await store.schedules.create(ScheduleDef("tick", "beat", EVERY_MINUTE), now=clock.now())
    scheduler = Scheduler(store.schedules, clock, agents(cancel))
    await clock.advance(1)
    assert await scheduler.look() == 1
    await clock.advance(60)
    assert await scheduler.look() == 1
    first, second = await _runs(store)
    assert first.cancel_requested and not second.cancel_requested


async def test_a_buffered_time_is_not_rewritten_while_it_waits(store: Store) -> None:
    clock = ManualClock(T0 - 1)
    spec = ScheduleSpec(every=60, overlap="buffer_one")
    await store.schedules.create(ScheduleDef("tick", "beat", spec), now=clock.now())
    scheduler = Scheduler(store.schedules, clock)
    await clock.advance(1)
    assert await scheduler.look() == 1
    await clock.advance(60)
    assert await scheduler.look() == 0  # 10:01 is buffered: one write
    row = await store.schedules.get("tick/beat")
    assert row is not None and row.buffered_at == T0 + 60
    for _ in range(3):  # looks while the 10:00 run goes on: nothing to write
        await clock.advance(5)
        assert await scheduler.look() == 0
    again = await store.schedules.get("tick/beat")
    assert again == row


async def test_a_schedule_of_an_agent_the_newest_deploy_lacks_is_orphaned(store: Store) -> None:
    clock = ManualClock(T0 - 1)
    yaml = ScheduleDef("tick", "beat", EVERY_MINUTE)
    await store.schedules.declare(
        [yaml], agents=["tick"], code_version="v1", started_at=100.0, now=clock.now()
    )
    await store.schedules.create(ScheduleDef("tick", "api", EVERY_MINUTE), now=clock.now())
    # v2 no longer has the agent `tick` at all.
    await store.schedules.declare(
        [], agents=["other"], code_version="v2", started_at=200.0, now=clock.now()
    )
    for sid in ("tick/beat", "tick/api"):
        row = await store.schedules.get(sid)
        assert row is not None and not row.removed
        assert row.orphaned is not None and "'tick' is not in code version 'v2'" in row.orphaned
        shown = row.to_dict()
        assert shown["orphaned"] == row.orphaned
        assert shown["next_fire_at"] is None and shown["upcoming"] == []
    listed = {s.id: s.orphaned for s in await store.schedules.all()}
    assert listed.keys() == {"tick/beat", "tick/api"} and all(listed.values())
    scheduler = Scheduler(store.schedules, clock)
    await clock.advance(600)
    assert await scheduler.look() == 0
    assert await store.schedules.next_due() is None  # nothing to wake up for
    with pytest.raises(InvalidInput, match="not in code version"):
        await scheduler.trigger("tick/beat")
    # An older deploy's worker (a reload) does not bring them back ...
    await store.schedules.declare(
        [yaml], agents=["tick"], code_version="v1", started_at=100.0, now=clock.now()
    )
    row = await store.schedules.get("tick/api")
    assert row is not None and row.orphaned is not None
    # ... a newer deploy with the agent does, from now on (no catch-up of the gap).
    await store.schedules.declare(
        [yaml], agents=["tick"], code_version="v3", started_at=300.0, now=clock.now()
    )
    for sid in ("tick/beat", "tick/api"):
        row = await store.schedules.get(sid)
        assert row is not None and row.orphaned is None and row.next_fire_at == T0 + 600
    await clock.advance(1)
    assert await scheduler.look() == 2
    assert [r.scheduled_for for r in await _runs(store)] == [T0 + 600]


async def test_a_batch_of_firings_is_a_few_statements(store: Store) -> None:
    """200 schedules due at once: one look, one transaction; its statements do not grow
    with the number of firings. A time a backfill already ran is recorded, not run again."""
    clock = ManualClock(T0 - 1)
    for i in range(200):
        await store.schedules.create(ScheduleDef("tick", f"s{i:03d}", EVERY_MINUTE), now=T0 - 1)
    scheduler = Scheduler(store.schedules, clock)
    await clock.advance(2)  # 10:00 is due for all 200; a backfill runs it for s007 first
    assert await scheduler.backfill("tick/s007", T0, T0 + 1) == (1, 0, 0)
    (backfilled, _, _), *_ = await store.schedules.runs_of("tick/s007", limit=5)
    statements: list[str] = []
    original = store._x  # type: ignore[attr-defined]

    def counted(cur: Any, sql: str, params: Any = ()) -> Any:
        statements.append(sql.split()[0])
        return original(cur, sql, params)

    store._x = counted  # type: ignore[attr-defined]
    try:
        assert await scheduler.look() == 200
    finally:
        del store._x  # type: ignore[attr-defined]
    assert len(statements) <= 6, statements
    assert await scheduler.look() == 0
    for i in (0, 7, 199):
        row = await store.schedules.get(f"tick/s{i:03d}")
        assert row is not None and row.fires == 1 and row.next_fire_at == T0 + 60
    assert len(await store.schedules.runs_of("tick/s007", limit=5)) == 1
    row = await store.schedules.get("tick/s007")
    assert row is not None and row.last_run_id == backfilled


async def test_a_catch_up_of_several_times_in_one_batch(store: Store) -> None:
    """An ``every`` given as an int, three times missed, catch-up all: the times are
    floats and ints mixed (the row's next time, then computed ones); all three start."""
    clock = ManualClock(T0 - 1)
    spec = ScheduleSpec(every=60, catch_up="all", overlap="allow_all")
    for name in ("a", "b"):
        await store.schedules.create(ScheduleDef("tick", name, spec), now=clock.now())
    await clock.advance(121 + 0.5)
    assert await Scheduler(store.schedules, clock).look() == 6
    for name in ("a", "b"):
        runs = await _runs(store, f"tick/{name}")
        assert [r.scheduled_for for r in runs] == [T0, T0 + 60, T0 + 120]
