"""A step consumes only a message of its own run, once, and a refused step writes nothing.

The engine takes a message id from ``next_message(run_id, ...)``, so it always names a
message of the leased run; the store checks it anyway (defence in depth, as the lease
fence is): consuming another run's message fails the step instead of stealing it.

A refused consume is not a lost lease: the store answers ``MessageConsumed`` (the lease
holds; the engine takes the next message, tests/core/test_refused_consume.py), and
``LeaseLost`` only when the lease fence fails, which it checks first.

A step that takes a message may carry the run's pending totals (a flush was due). When
the step is refused (its message was consumed already, or is another run's), the totals
must not reach the run row either: the row's totals are the sum of what the log records,
and the refused step recorded nothing. PostgreSQL writes such a step in one statement
(``PostgresStore._consume_one``) whose data-modifying parts all run to completion, so
there the totals must be gated on the message as the events are; SQLite rolls the whole
transaction back.
"""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

import toren
from tests.conftest import clone_pg_database, drop_pg_database, pg_url, require_pg
from tests.store.steps import value_event
from tests.store.test_park_and_open import _new_run
from toren.errors import LeaseLost, MessageConsumed
from toren.store import Store
from toren.store.base import RunDelta, RunRecord


async def test_a_step_cannot_consume_another_runs_message(store: Store) -> None:
    mine, other = await _new_run(store), await _new_run(store)
    now = time.time()
    message_id = await store.send_message(other, "approval", {"ok": True}, now=now)
    (lease,) = await store.claim("w1", 1, now=now, ttl=60, only=mine)
    with pytest.raises(MessageConsumed, match=str(message_id)) as refused:
        await store.append(lease, [value_event(mine, 0, 1)], consume_inbox=message_id, now=now + 1)
    assert refused.value.message_id == message_id
    written = [e.type for e in await store.load_events(mine)]
    assert written == ["RunStarted"]  # the step's event was rolled back with it
    left = await store.next_message(other, ["approval"])
    assert left is not None and left.id == message_id


async def test_a_step_consumes_its_own_runs_message_once(store: Store) -> None:
    run_id = await _new_run(store)
    now = time.time()
    message_id = await store.send_message(run_id, "approval", 1, now=now)
    (lease,) = await store.claim("w1", 1, now=now, ttl=60)
    await store.append(lease, [value_event(run_id, 0, 1)], consume_inbox=message_id, now=now + 1)
    assert await store.next_message(run_id, ["approval"]) is None
    with pytest.raises(MessageConsumed):
        await store.append(
            lease, [value_event(run_id, 1, 2)], consume_inbox=message_id, now=now + 2
        )


@pytest.mark.parametrize("totals", [False, True])
async def test_a_step_whose_lease_moved_is_lease_lost_even_if_its_message_is_gone(
    store: Store, totals: bool
) -> None:
    """The lease is checked before the message: a worker whose run was claimed by another
    (the epoch moved) learns that, not that its message was consumed. With and without
    totals due (PostgreSQL writes the two in differently fenced statements)."""
    run_id = await _new_run(store)
    now = time.time()
    message_id = await store.send_message(run_id, "approval", 1, now=now)
    (stale,) = await store.claim("w1", 1, now=now, ttl=60)
    (lease,) = await store.claim("w2", 1, now=now + 61, ttl=60)
    assert lease.epoch > stale.epoch
    await store.append(lease, [value_event(run_id, 0, 1)], consume_inbox=message_id, now=now + 62)
    due = RunDelta(input_tokens=1, steps=1) if totals else None
    with pytest.raises(LeaseLost) as lost:
        await store.append(
            stale, [value_event(run_id, 1, 2)], consume_inbox=message_id, delta=due, now=now + 63
        )
    assert "no longer holds the lease" in lost.value.message


def _totals(run: RunRecord | None) -> tuple[object, ...]:
    assert run is not None
    return (
        run.input_tokens,
        run.output_tokens,
        run.cost_nanousd,
        run.saved_nanousd,
        run.steps,
        run.invalidations,
        run.code_version,
        run.updated_at,
    )


@pytest.mark.parametrize("message", ["consumed already", "another run's"])
async def test_a_refused_step_that_takes_a_message_writes_no_totals(
    store: Store, message: str
) -> None:
    run_id, other = await _new_run(store), await _new_run(store)
    now = time.time()
    (lease,) = await store.claim("w1", 1, now=now, ttl=60, only=run_id)
    if message == "consumed already":
        message_id = await store.send_message(run_id, "approval", 1, now=now)
        flushed = RunDelta(input_tokens=3, output_tokens=4, cost_nanousd=5, steps=1)
        await store.append(
            lease,
            [value_event(run_id, 0, 1)],
            consume_inbox=message_id,
            delta=flushed,
            now=now + 1,
        )
        before = await store.get_run(run_id)
        assert before is not None and (before.input_tokens, before.steps) == (3, 1)
    else:
        message_id = await store.send_message(other, "approval", 1, now=now)
        before = await store.get_run(run_id)
    written = [e.seq for e in await store.load_events(run_id)]

    due = RunDelta(
        input_tokens=100,
        output_tokens=200,
        cost_nanousd=300,
        saved_nanousd=400,
        steps=5,
        invalidations=6,
        code_version="v-refused",
    )
    with pytest.raises(MessageConsumed, match=str(message_id)):
        await store.append(
            lease, [value_event(run_id, 1, 2)], consume_inbox=message_id, delta=due, now=now + 2
        )

    assert _totals(await store.get_run(run_id)) == _totals(before)
    assert [e.seq for e in await store.load_events(run_id)] == written
    # The lease still holds and the next step (with the same totals) is written whole.
    await store.append(lease, [value_event(run_id, 1, 3)], delta=due, now=now + 3)
    after = await store.get_run(run_id)
    assert after is not None and after.steps == before.steps + 5
    assert after.code_version == "v-refused"


async def test_postgres_a_step_that_loses_its_message_meanwhile_writes_no_totals() -> None:
    """The race itself: another transaction holds the message row when the step's
    statement arrives and consumes the message before it lets go. The statement has
    passed its lease check by then, and waits on the message row inside it."""
    require_pg()
    name = clone_pg_database()
    store = await toren.connect(pg_url(name))
    try:
        run_id = await _new_run(store)
        now = time.time()
        message_id = await store.send_message(run_id, "approval", 1, now=now)
        (lease,) = await store.claim("w1", 1, now=now, ttl=60)
        before = await store.get_run(run_id)
        due = RunDelta(input_tokens=100, output_tokens=200, cost_nanousd=300, steps=5)
        with (
            psycopg.connect(pg_url(name)) as other,
            psycopg.connect(pg_url(name), autocommit=True) as admin,
        ):
            other.execute("SELECT id FROM inbox WHERE id = %s FOR UPDATE", (message_id,))
            step = asyncio.create_task(
                store.append(
                    lease,
                    [value_event(run_id, 0, 1)],
                    consume_inbox=message_id,
                    delta=due,
                    now=now + 1,
                )
            )
            while not step.done():  # until the step's statement waits for the message row
                waiting = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                ).fetchone()
                if waiting is not None and waiting[0]:
                    break
                await asyncio.sleep(0.01)
            assert not step.done()  # it cannot finish while the message row is held
            other.execute("UPDATE inbox SET consumed_seq = 0 WHERE id = %s", (message_id,))
            other.commit()
        with pytest.raises(MessageConsumed, match=str(message_id)):
            await step
        assert _totals(await store.get_run(run_id)) == _totals(before)
        assert [e.type for e in await store.load_events(run_id)] == ["RunStarted"]
    finally:
        await store.close()
        drop_pg_database(name)
