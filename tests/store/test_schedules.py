"""Schedules on both databases, with a controllable clock: any number of schedulers fire
each nominal time once, the newest deploy's definition wins, and pause, resume,
trigger, backfill and delete do what docs/schedules.md says."""

from __future__ import annotations

import asyncio

import pytest

from toren.core.contract.clock import ManualClock
from toren.core.contract.schedule import ScheduleDef, ScheduleSpec, firing_key
from toren.core.drivers.scheduler import Scheduler
from toren.errors import InvalidInput, ScheduleNotFound
from toren.store import Store

T0 = 1_780_308_000.0  # 2026-06-01T10:00:00Z, a whole hour
EVERY_MINUTE = ScheduleSpec(every=60, overlap="allow_all")


def beat(spec: ScheduleSpec = EVERY_MINUTE, **kw: object) -> ScheduleDef:
    return ScheduleDef("tick", "beat", spec, input={"n": 1}, **kw)  # type: ignore[arg-type]


async def _runs(store: Store) -> list[tuple[str, float | None]]:
    return [(status, at) for _, status, at in await store.schedules.runs_of("tick/beat", limit=500)]


async def test_many_schedulers_fire_each_nominal_time_once(store: Store) -> None:
    clock = ManualClock(T0 - 30)
    await store.schedules.declare(
        [beat()], agents=["tick"], code_version="v1", started_at=T0 - 60, now=clock.now()
    )
    schedulers = [Scheduler(store.schedules, clock) for _ in range(4)]
    for _ in range(10):
        await clock.advance(60)
        started = await asyncio.gather(*(s.look() for s in schedulers))
        assert sum(started) == 1  # one of the four, whichever won the row
    runs = await _runs(store)
    assert sorted(at for _, at in runs) == [T0 + 60 * i for i in range(10)]
    assert sum(s.metrics.fires for s in schedulers) == 10
    # Each run carries its origin in the row and in RunStarted.
    row = await store.schedules.get("tick/beat")
    assert row is not None and row.fires == 10 and row.last_run_id is not None
    events = await store.load_events(row.last_run_id)
    assert events[0].payload.schedule == {  # type: ignore[attr-defined]
        "id": "tick/beat",
        "nominal": "2026-06-01T10:09:00Z",
    }
    run = await store.get_run(row.last_run_id)
    assert run is not None and run.idempotency_key == firing_key("tick/beat", T0 + 540)


async def test_the_newest_deploy_defines_the_schedule(store: Store) -> None:
    clock = ManualClock(T0)
    old, new = ScheduleSpec(every=60), ScheduleSpec(every=120)
    await store.schedules.declare(
        [beat(old)], agents=["tick"], code_version="v1", started_at=100.0, now=T0
    )
    await store.schedules.declare(
        [beat(new)], agents=["tick"], code_version="v2", started_at=200.0, now=T0
    )
    # The old deploy's workers, still running, declare again (a reload): they lose.
    await store.schedules.declare(
        [beat(old)], agents=["tick"], code_version="v1", started_at=100.0, now=T0
    )
    row = await store.schedules.get("tick/beat")
    assert row is not None and row.spec == new and row.code_version == "v2"
    # A rollback: v1's workers start after v2's, and win.
    await store.schedules.declare(
        [beat(old)], agents=["tick"], code_version="v1", started_at=300.0, now=T0
    )
    row = await store.schedules.get("tick/beat")
    assert row is not None and row.spec == old and row.code_version == "v1"
    # A newer deploy that no longer declares it removes it; an older one cannot bring
    # it back.
    await store.schedules.declare([], agents=["tick"], code_version="v3", started_at=400.0, now=T0)
    await store.schedules.declare(
        [beat(old)], agents=["tick"], code_version="v1", started_at=300.0, now=T0
    )
    assert [s.id for s in await store.schedules.all()] == []
    gone = await store.schedules.get("tick/beat")
    assert gone is not None and gone.removed
    await clock.advance(3600)
    assert await Scheduler(store.schedules, clock).look() == 0


async def test_pause_resume_trigger_backfill_delete(store: Store) -> None:
    clock = ManualClock(T0 - 1)
    created = await store.schedules.create(beat(), now=clock.now())
    assert created.source == "api" and created.next_fire_at == T0
    scheduler = Scheduler(store.schedules, clock)
    paused = await store.schedules.set_paused("tick/beat", True, "maintenance", now=clock.now())
    assert paused.paused and paused.note == "maintenance" and paused.upcoming(3) == []
    await clock.advance(600)
    assert await scheduler.look() == 0  # paused: nothing fires, nothing is caught up later
    resumed = await store.schedules.set_paused("tick/beat", False, "back", now=clock.now())
    assert resumed.next_fire_at == T0 + 600
    assert await scheduler.look() == 0
    await clock.advance(1)
    assert await scheduler.look() == 1
    # Trigger: a run now, outside the timeline.
    triggered = await scheduler.trigger("tick/beat")
    assert triggered.idempotency_key is not None and ":trigger:" in triggered.idempotency_key
    # Backfill an hour earlier: 60 times; again: nothing new. It does not re-run 10:10,
    # which fired on time.
    await clock.advance(1)  # a backfill's range lies in the past
    with pytest.raises(InvalidInput, match="not in the future"):
        await scheduler.backfill("tick/beat", T0, T0 + 3600)
    made, before, refused = await scheduler.backfill("tick/beat", T0 - 3000, T0 + 601)
    assert (made, before, refused) == (60, 1, 0)
    assert await scheduler.backfill("tick/beat", T0 - 3000, T0 + 601) == (0, 61, 0)
    nominal = sorted(at for _, at in await _runs(store) if at is not None)
    assert len(nominal) == len(set(nominal)) + 1  # the triggered run's "now" is its own
    await store.schedules.delete("tick/beat", now=clock.now())
    with pytest.raises(ScheduleNotFound):
        await scheduler.trigger("tick/beat")
    with pytest.raises(ScheduleNotFound):
        await store.schedules.set_paused("tick/beat", True, None, now=clock.now())


async def test_overlap_skip_is_decided_from_the_last_run(store: Store) -> None:
    clock = ManualClock(T0 - 1)
    await store.schedules.create(beat(ScheduleSpec(every=60)), now=clock.now())
    scheduler = Scheduler(store.schedules, clock)
    await clock.advance(1)
    assert await scheduler.look() == 1  # queued, not finished: "still running"
    await clock.advance(60)
    assert await scheduler.look() == 0
    row = await store.schedules.get("tick/beat")
    assert row is not None and row.skips == 1 and row.last_skip_reason is not None
    assert "still running" in row.last_skip_reason
    assert row.last_run_status == "queued"


async def test_a_two_hour_outage_fires_the_latest_time_once(store: Store) -> None:
    clock = ManualClock(T0 - 1)
    hourly = ScheduleDef("tick", "beat", ScheduleSpec(cron="0 * * * *"))
    await store.schedules.create(hourly, now=clock.now())
    await clock.advance(2 * 3600 + 1801)  # no worker from 10:00 to 12:30
    assert await Scheduler(store.schedules, clock).look() == 1
    assert [at for _, at in await _runs(store)] == [T0 + 7200]
    row = await store.schedules.get("tick/beat")
    assert row is not None and row.skips == 2 and row.next_fire_at == T0 + 3 * 3600


async def test_a_jittered_time_is_slept_for_not_polled(store: Store) -> None:
    """A time that is due but jittered is not looked at again until its moment (no busy
    loop), then fires."""
    from toren.core.contract.schedule import jitter_of

    clock = ManualClock(T0 - 1)
    spec = ScheduleSpec(every=3600, jitter=600)
    await store.schedules.create(beat(spec), now=clock.now())
    scheduler = Scheduler(store.schedules, clock)
    offset = jitter_of("tick/beat", T0, 600)
    await clock.advance(1)
    assert await scheduler.look() == 0
    assert await scheduler.sleep_for() == pytest.approx(min(1.0, offset))
    await clock.advance(offset)
    assert await scheduler.look() == 1
    assert await scheduler.sleep_for() == 1.0  # the next time is an hour away: POLL


async def _tick_all(store: Store, clock: ManualClock) -> None:
    """Run every queued run of the schedule to its end (the worker's part)."""
    import toren

    async def tick_agent(ctx: toren.Context, input: object) -> object:
        return {"at": await ctx.now()}

    reg = toren.Registry()
    reg.add("tick", tick_agent)
    deps = toren.TickDeps(store=store, agents=reg, clock=clock)
    for run_id, status, _ in await store.schedules.runs_of("tick/beat", limit=100):
        if status == "queued":
            assert (await toren.tick(run_id, deps)).status == "completed"


async def test_overlap_buffer_one_starts_the_waiting_time_when_the_run_ends(store: Store) -> None:
    clock = ManualClock(T0 - 1)
    await store.schedules.create(
        beat(ScheduleSpec(every=60, overlap="buffer_one")), now=clock.now()
    )
    scheduler = Scheduler(store.schedules, clock)
    await clock.advance(1)
    assert await scheduler.look() == 1  # 10:00 starts; it outlasts its interval
    for _ in range(2):  # 10:01 waits (buffered), 10:02 is skipped: one waits already
        await clock.advance(60)
        assert await scheduler.look() == 0
    row = await store.schedules.get("tick/beat")
    assert row is not None and row.buffered_at == T0 + 60 and row.skips == 1
    await _tick_all(store, clock)  # the 10:00 run ends
    assert await scheduler.look() == 1  # the buffered 10:01 starts now, as itself
    nominal = sorted(at for _, at in await _runs(store) if at is not None)
    assert nominal == [T0, T0 + 60]
    row = await store.schedules.get("tick/beat")
    assert row is not None and row.buffered_at is None


async def test_overlap_cancel_previous_cancels_the_running_run(store: Store) -> None:
    clock = ManualClock(T0 - 1)
    spec = ScheduleSpec(every=60, overlap="cancel_previous")
    await store.schedules.create(beat(spec), now=clock.now())
    scheduler = Scheduler(store.schedules, clock)
    await clock.advance(1)
    assert await scheduler.look() == 1
    first = (await store.schedules.get("tick/beat")).last_run_id  # type: ignore[union-attr]
    await clock.advance(60)
    assert await scheduler.look() == 1
    previous = await store.get_run(first)  # type: ignore[arg-type]
    assert previous is not None and previous.cancel_requested
    assert len(await _runs(store)) == 2


async def test_overlap_allow_all_starts_beside_the_running_run(store: Store) -> None:
    clock = ManualClock(T0 - 1)
    await store.schedules.create(beat(), now=clock.now())  # allow_all
    scheduler = Scheduler(store.schedules, clock)
    for _ in range(3):
        await clock.advance(60)
        assert await scheduler.look() == 1
    runs = await _runs(store)
    assert [status for status, _ in runs] == ["queued"] * 3  # three at once, none cancelled


async def test_a_deleted_schedule_can_be_made_again(store: Store) -> None:
    await store.schedules.create(beat(), now=T0)
    await store.schedules.delete("tick/beat", now=T0)
    again = await store.schedules.create(beat(ScheduleSpec(every=120)), now=T0 + 1)
    assert not again.removed and again.spec.every == 120


async def test_a_very_long_outage_fires_the_latest_time_only(store: Store) -> None:
    """More missed times than one look reads (a minutely schedule down for a day): no
    stale time fires on the way; the latest fires once."""
    clock = ManualClock(T0 - 1)
    spec = ScheduleSpec(cron="* * * * *", catch_up_window=2 * 86_400)
    await store.schedules.create(ScheduleDef("tick", "beat", spec), now=clock.now())
    await clock.advance(86_400 + 1)
    scheduler = Scheduler(store.schedules, clock)
    for _ in range(3):
        await scheduler.look()
    assert [at for _, at in await _runs(store)] == [T0 + 86_400]
