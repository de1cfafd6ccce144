"""PostgreSQL's inline lane: a lone run's statement runs on the event loop's own thread,
blocking it, when the loop has nothing else to do. It must never keep the loop waiting on
something it can bound: a row lock held by another transaction makes it give up (having
done nothing) and wait through the loop instead, with the step committed exactly once. A
broken lane fails one statement at most, then opens again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import toren
from tests.conftest import clone_pg_database, drop_pg_database, pg_url, require_pg
from tests.store.steps import value_event
from toren.core.contract.events import ValueRecorded
from toren.errors import LeaseLost, StorageError
from toren.store import _pg_conn
from toren.store.base import Lease
from toren.store.postgres import PostgresStore


async def _idle(ctx: toren.Context, input: Any) -> Any:
    return None


async def _values(store: PostgresStore, run_id: str) -> list[Any]:
    events = await store.load_events(run_id)
    return [e.payload.value for e in events if isinstance(e.payload, ValueRecorded)]


class _Open:
    """A gate that is always open: the test decides when the lane is tried."""

    def open(self, loop: Any) -> bool:
        return True

    def turned(self) -> None:
        pass


async def _open_lane(store: PostgresStore) -> None:
    await store.get_run("none")  # the first statement starts opening the lane
    assert store.lanes._inline_opening is not None
    await store.lanes._inline_opening
    assert store.lanes._inline is not None


@pytest.fixture
async def pg() -> AsyncIterator[tuple[PostgresStore, str]]:
    require_pg()
    name = clone_pg_database()
    store = await toren.connect(pg_url(name))
    assert isinstance(store, PostgresStore)
    try:
        yield store, pg_url(name)
    finally:
        await store.close()
        drop_pg_database(name)


async def _lone_run(store: PostgresStore) -> Lease:
    reg = toren.Registry()
    reg.add("idle", _idle)
    run = await toren.start_run(store, reg, "idle")
    (lease,) = await store.claim("w1", 1, now=time.time(), ttl=60)
    assert lease.run_id == run.id
    return lease


async def test_a_lone_runs_steps_commit_inline(pg: tuple[PostgresStore, str]) -> None:
    store, _ = pg
    await _open_lane(store)
    lease = await _lone_run(store)
    before = store.inline_statements
    for position in range(40):
        await store.append(lease, [value_event(lease.run_id, position, position)], now=time.time())
    # Inline but for one step every few milliseconds (a turn of the loop).
    assert store.inline_statements - before >= 10, store.inline_statements
    assert await _values(store, lease.run_id) == list(range(40))  # each once, in order


async def test_a_locked_run_row_does_not_block_the_loop(pg: tuple[PostgresStore, str]) -> None:
    import psycopg

    store, url = pg
    await _open_lane(store)
    lease = await _lone_run(store)
    store.lanes.gate = _Open()  # type: ignore[assignment]
    await store.append(lease, [value_event(lease.run_id, 0, 0)], now=time.time())
    assert store.inline_statements > 0

    # Another transaction holds the run's row; the step's lease check must wait for it.
    holder = psycopg.connect(url)
    holder.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (lease.run_id,))
    pid = holder.info.backend_pid

    def end_holder() -> None:  # failsafe only: a blocked loop fails the test, not hangs it
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    failsafe = threading.Timer(30.0, end_holder)
    failsafe.start()
    try:
        step = asyncio.create_task(
            store.append(lease, [value_event(lease.run_id, 1, 1)], now=time.time())
        )
        turns = 0
        while turns < 100 and not step.done():
            await asyncio.sleep(0.001)  # the loop keeps turning while the step waits
            turns += 1
        assert turns == 100 and not step.done()
        # It gave up on the lock (not on the statement timeout, which would have blocked
        # the loop ten times longer), then waited through the loop.
        assert store.inline_deferred == {"lock_timeout": 1}
        holder.commit()
        (stored,) = await step
    finally:
        failsafe.cancel()
        holder.close()
    assert stored.position == 1 and stored.seq is not None
    assert await _values(store, lease.run_id) == [0, 1]


async def test_a_broken_lane_fails_one_statement_then_opens_again(
    pg: tuple[PostgresStore, str],
) -> None:
    import psycopg

    store, url = pg
    await _open_lane(store)
    lease = await _lone_run(store)
    store.lanes.gate = _Open()  # type: ignore[assignment]
    await store.append(lease, [value_event(lease.run_id, 0, 0)], now=time.time())
    assert store.lanes._inline is not None
    pid = store.lanes._inline[0].info.backend_pid
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    with pytest.raises(StorageError) as failed:
        await store.append(lease, [value_event(lease.run_id, 1, 1)], now=time.time())
    assert isinstance(failed.value.__cause__, psycopg.OperationalError)
    assert store.lanes._inline is None  # dropped

    # Nothing of it was written: the step goes again (the loop's way while the lane opens).
    await store.append(lease, [value_event(lease.run_id, 1, 1)], now=time.time())
    assert store.lanes._inline_opening is not None
    await store.lanes._inline_opening
    before = store.inline_statements
    await store.append(lease, [value_event(lease.run_id, 2, 2)], now=time.time())
    assert store.inline_statements == before + 1
    assert await _values(store, lease.run_id) == [0, 1, 2]


async def test_a_failed_open_is_retried(
    pg: tuple[PostgresStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = pg
    monkeypatch.setitem(_pg_conn._INLINE_CONNECT, "connect_timeout", "not a number")
    await store.get_run("none")  # starts opening the lane, which fails
    opening = store.lanes._inline_opening
    if opening is not None:
        await opening
    assert store.lanes._inline is None and store.lanes._inline_opening is None  # failed; may retry
    assert store.lanes._inline_retry_at > time.monotonic()
    await store.get_run("none")
    assert store.lanes._inline_opening is None  # not before the retry delay

    monkeypatch.delitem(_pg_conn._INLINE_CONNECT, "connect_timeout")
    store.lanes._inline_retry_at = 0.0  # the delay has passed
    await _open_lane(store)


async def test_a_conflict_on_the_flush_path_is_lease_lost(
    pg: tuple[PostgresStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = pg
    await _open_lane(store)
    lease = await _lone_run(store)
    await store.append(lease, [value_event(lease.run_id, 0, 0)], now=time.time())
    flushed: list[bool] = []
    original = PostgresStore._append_inline

    def spy(job: Any) -> bool:
        flushed.append(done := original(store, job))
        return done

    monkeypatch.setattr(store._batcher, "_inline", spy)  # the batcher's flush calls it
    # Something else ready in this turn: the step is queued, then committed alone from the
    # flush, where the clash with slot 0 must surface. The flush takes the inline lane only
    # if the loop is idle by then, which another ready callback (the pool's own upkeep, a
    # socket's, under load) would break: the flush is told it is idle, the append is not.
    monkeypatch.setattr(_pg_conn, "loop_is_idle", lambda loop: True)
    asyncio.get_running_loop().call_soon(lambda: None)
    with pytest.raises(LeaseLost):
        await store.append(lease, [value_event(lease.run_id, 0, 0)], now=time.time())
    assert flushed == [True]
    assert await _values(store, lease.run_id) == [0]
