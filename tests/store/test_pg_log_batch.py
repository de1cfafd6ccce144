"""PostgreSQL reads the logs of the ticks that start in the same turn of the event loop
in one statement (``PostgresStore._log_tail``): a claim of a hundred due timers starts a
hundred ticks, each reading its log first. Each caller gets its own run's log, exactly as
a read alone gives it; a failed batch falls back to reads alone; a bad row fails only
the run it belongs to. A log known to be long (a tick passes its run's recorded steps)
is read on a thread of the pool instead, the same log."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import toren
from tests.conftest import clone_pg_database, drop_pg_database, pg_url, require_pg
from tests.store.steps import value_event
from toren.errors import CorruptEventLog, StorageError
from toren.store import postgres
from toren.store.postgres import PostgresStore
from toren.store.sql import LONG_LOG


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


def _count_thread_jobs(pg: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every job handed to the sync pool's threads from now on (True for a write)."""
    jobs: list[bool] = []
    real_run = pg.lanes.run

    async def counted(fn: Any, *, write: bool = True) -> Any:
        jobs.append(write)
        return await real_run(fn, write=write)

    monkeypatch.setattr(pg.lanes, "run", counted)
    return jobs


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


async def test_a_log_known_to_be_long_is_read_on_a_pool_thread_the_same(
    pg: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    (run_id,) = await _runs(pg, [LONG_LOG + 50])
    loop_way = await pg.load_events(run_id)
    on_threads = _count_thread_jobs(pg, monkeypatch)
    long_way = await pg.load_events(run_id, at_least=LONG_LOG + 1)
    assert on_threads == [False]  # one read, on a thread, in no write transaction
    assert _seqs(long_way) == _seqs(loop_way)
    assert [e.payload for e in long_way] == [e.payload for e in loop_way]
    assert [e.chain for e in long_way] == [e.chain for e in loop_way]
    middle = loop_way[100].seq
    after = await pg.load_events(run_id, after_seq=middle, at_least=LONG_LOG + 1)
    assert _seqs(after) == _seqs(loop_way[101:])
    await pg.load_events(run_id, at_least=LONG_LOG)  # not past it: the loop's way
    assert len(on_threads) == 2


async def test_a_tick_tells_the_store_its_runs_recorded_steps(
    pg: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tick's hint is the run's ``steps``: past ``LONG_LOG`` the log takes the long
    read; the tick goes on the same (here: the agent runs and completes)."""
    reg = toren.Registry()
    reg.add("idle", _idle)
    deps = toren.TickDeps(store=pg, agents=reg, providers={})
    long_reads: list[str] = []
    real_long = pg._long_log

    async def counted(run_id: str, after_seq: int) -> list[Any]:
        long_reads.append(run_id)
        return await real_long(run_id, after_seq)

    monkeypatch.setattr(pg, "_long_log", counted)
    short, long = await _runs(pg, [3, 3])
    await pg._run(lambda cur: pg._x(cur, "UPDATE runs SET steps = ? WHERE id = ?", (1000, long)))
    assert (await toren.tick(short, deps)).status == "completed"
    assert long_reads == []
    assert (await toren.tick(long, deps)).status == "completed"
    assert long_reads == [long]


async def test_long_reads_on_threads_are_capped_and_fail_as_the_loops_way_does(
    pg: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most ``_long_reads_max`` long logs are read on threads at once (they hold
    threads and connections claims need); the others go the loop's way, the same log.
    A failed read on a thread is a ``StorageError``, as the loop's way gives it."""
    first, second = await _runs(pg, [LONG_LOG + 5, LONG_LOG + 5])
    alone = [_seqs(await pg.load_events(r)) for r in (first, second)]
    on_threads = _count_thread_jobs(pg, monkeypatch)
    monkeypatch.setattr(pg, "_long_reads_max", 1)
    together = await asyncio.gather(
        *(pg.load_events(r, at_least=LONG_LOG + 1) for r in (first, second))
    )
    assert [_seqs(t) for t in together] == alone
    assert on_threads == [False]  # the second went the loop's way
    assert pg._long_reads == 0

    monkeypatch.setattr(
        postgres, "LOG_ROWS", "SELECT no_such_column FROM events WHERE run_id = ? AND seq > ?"
    )
    with pytest.raises(StorageError, match="no_such_column"):
        await pg.load_events(first, at_least=LONG_LOG + 1)
    assert len(on_threads) == 2 and pg._long_reads == 0
