"""PostgreSQL's inline lane: a lone run's statement runs on the event loop's own thread,
blocking it, when the loop has nothing else to do. It must never keep the loop waiting on
something unbounded: a row lock held by another transaction makes it give up (it did
nothing) and wait through the loop instead, with the step committed exactly once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import toren
from tests.conftest import create_pg_database, drop_pg_database, pg_url, require_pg
from toren.core.events import Event, ValueRecorded, make_event
from toren.core.replay import step_slot
from toren.store.postgres import PostgresStore


async def _idle(ctx: toren.Context, input: Any) -> Any:
    return None


def _value(run_id: str, position: int) -> Event:
    return make_event(
        run_id,
        ValueRecorded(what="random", value=position),
        stream="main",
        position=position,
        slot=step_slot("main", 0, position),
        digest=f"d{position}",
        created_at=time.time(),
    )


async def _values(store: PostgresStore, run_id: str) -> list[Any]:
    events = await store.load_events(run_id)
    return [e.payload.value for e in events if isinstance(e.payload, ValueRecorded)]


@pytest.fixture
async def pg() -> AsyncIterator[tuple[PostgresStore, str]]:
    require_pg()
    name = create_pg_database()
    store = await toren.connect(pg_url(name))
    assert isinstance(store, PostgresStore)
    try:
        yield store, pg_url(name)
    finally:
        await store.close()
        drop_pg_database(name)


async def _lone_run(store: PostgresStore) -> Any:
    reg = toren.Registry()
    reg.add("idle", _idle)
    run = await toren.start_run(store, reg, "idle")
    (lease,) = await store.claim("w1", 1, now=time.time(), ttl=60)
    assert lease.run_id == run.id
    return lease


async def test_a_lone_runs_steps_commit_inline(pg: tuple[PostgresStore, str]) -> None:
    store, _ = pg
    lease = await _lone_run(store)
    for position in range(40):
        await store.append(lease, [_value(lease.run_id, position)], now=time.time())
    # The lane opens in the background after the first statement; from then on a lone
    # step goes inline, except once every few milliseconds (a turn of the loop).
    assert store.inline_statements >= 10, store.inline_statements
    assert await _values(store, lease.run_id) == list(range(40))  # each once, in order


async def test_a_locked_run_row_does_not_block_the_loop(pg: tuple[PostgresStore, str]) -> None:
    import psycopg

    store, url = pg
    lease = await _lone_run(store)
    for position in range(10):
        await store.append(lease, [_value(lease.run_id, position)], now=time.time())
    assert store.inline_statements > 0  # the lane is open

    # Another transaction holds the run's row; the step's lease check must wait for it.
    holder = psycopg.connect(url)
    holder.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (lease.run_id,))
    # Failsafe only: were the loop blocked for good, the holder is ended after 30 s (its
    # lock let go), and the assertions below fail instead of the test hanging.
    pid = holder.info.backend_pid

    def end_holder() -> None:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    failsafe = threading.Timer(30.0, end_holder)
    failsafe.start()
    try:
        store._gate.turned()  # the gate open, so the step tries the inline lane first
        step = asyncio.create_task(store.append(lease, [_value(lease.run_id, 10)], now=time.time()))
        turns = 0
        while turns < 100 and not step.done():
            await asyncio.sleep(0.001)  # the loop keeps turning while the step waits
            turns += 1
        assert turns == 100 and not step.done()
        assert store.inline_deferred == 1
        holder.commit()
        (stored,) = await step
    finally:
        failsafe.cancel()
        holder.close()
    assert stored.position == 10 and stored.seq is not None
    assert await _values(store, lease.run_id) == list(range(11))
