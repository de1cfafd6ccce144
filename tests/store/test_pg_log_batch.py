"""PostgreSQL reads the logs of the ticks that start in the same turn of the event loop
in one statement (``PostgresStore._log_tail``): a claim of a hundred due timers starts a
hundred ticks, each reading its log first. Each caller gets its own run's log, exactly as
a read alone gives it; a failed batch falls back to reads alone; a bad row fails only
the run it belongs to."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import toren
from tests.conftest import clone_pg_database, drop_pg_database, pg_url, require_pg
from tests.store.steps import value_event
from toren.errors import CorruptEventLog
from toren.store import postgres
from toren.store.postgres import PostgresStore


async def _idle(ctx: toren.Context, input: Any) -> Any:
    return None


@pytest.fixture
async def pg() -> AsyncIterator[PostgresStore]:
    require_pg()
    name = clone_pg_database()
    store = await toren.connect(pg_url(name))
    assert isinstance(store, PostgresStore)
    try:
        yield store
    finally:
        await store.close()
        drop_pg_database(name)


async def _runs(store: PostgresStore, lengths: list[int]) -> list[str]:
    """Runs whose logs have ``RunStarted`` and then ``n`` more events each."""
    reg = toren.Registry()
    reg.add("idle", _idle)
    ids = []
    for n in lengths:
        run_id = (await toren.start_run(store, reg, "idle", {})).id
        events = [value_event(run_id, i, i) for i in range(n)]
        if events:
            await store._run(lambda cur, ev=events: store._insert_events(cur, ev))
        ids.append(run_id)
    return ids


def _seqs(events: list[Any]) -> list[tuple[str, int, str]]:
    return [(e.run_id, e.seq, e.type) for e in events]


async def test_logs_asked_for_in_one_turn_are_read_in_one_statement(pg: PostgresStore) -> None:
    ids = await _runs(pg, [0, 1, 5, 40, 3])
    alone = {run_id: await pg.load_events(run_id) for run_id in ids}
    after = {run_id: (alone[run_id][1].seq if len(alone[run_id]) > 1 else 0) for run_id in ids}
    batched = pg.batched_logs
    together = await asyncio.gather(*(pg.load_events(run_id) for run_id in ids))
    assert pg.batched_logs == batched + len(ids)
    assert [_seqs(events) for events in together] == [_seqs(alone[r]) for r in ids]
    # Each with its own after_seq, in the same statement.
    tails = await asyncio.gather(*(pg.load_events(r, after_seq=after[r]) for r in ids))
    assert pg.batched_logs == batched + 2 * len(ids)
    assert [_seqs(t) for t in tails] == [
        [x for x in _seqs(alone[r]) if x[1] > after[r]] for r in ids
    ]
    # The payloads read in a batch are the payloads read alone.
    assert [[e.payload for e in events] for events in together] == [
        [e.payload for e in alone[r]] for r in ids
    ]


async def test_a_failed_batch_reads_each_log_alone(
    pg: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = await _runs(pg, [2, 3, 4])
    alone = [_seqs(await pg.load_events(r)) for r in ids]
    monkeypatch.setattr(postgres, "LOGS_MANY", "SELECT no_such_column FROM events")
    batched = pg.batched_logs
    together = await asyncio.gather(*(pg.load_events(r) for r in ids))
    assert [_seqs(t) for t in together] == alone
    assert pg.batched_logs == batched  # none of them came from the failed statement


async def test_the_same_run_twice_in_a_turn_is_read_alone(pg: PostgresStore) -> None:
    (run_id,) = await _runs(pg, [3])
    alone = _seqs(await pg.load_events(run_id))
    batched = pg.batched_logs
    first, second = await asyncio.gather(pg.load_events(run_id), pg.load_events(run_id))
    assert _seqs(first) == _seqs(second) == alone
    assert pg.batched_logs == batched


async def test_a_bad_row_fails_only_its_own_run(pg: PostgresStore) -> None:
    good, bad = await _runs(pg, [2, 2])
    await pg._run(
        lambda cur: pg._x(
            cur,
            "UPDATE events SET payload = ? WHERE run_id = ? AND type = 'ValueRecorded'",
            ("{broken", bad),
        )
    )
    results = await asyncio.gather(
        pg.load_events(good), pg.load_events(bad), return_exceptions=True
    )
    assert not isinstance(results[0], BaseException) and len(results[0]) == 3
    assert isinstance(results[1], CorruptEventLog) and bad in str(results[1])
