"""SQLite's short reads by key (a run's row, its next message, the first events of its
log) run inline on the loop's connection when the loop is idle, as a lone write does: no
hand-off to the database thread and back. A read the loop's connection cannot do takes
the thread and answers the same; a log longer than ``INLINE_LOG`` is read again, whole,
on the thread."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.store.sqlite_jobs import count_thread_jobs
from toren.errors import StorageError
from toren.store import sql
from toren.store.sql import INLINE_LOG, LONG_LOG
from toren.store.sqlite import SQLiteStore


@pytest.fixture(autouse=True)
def _gate_stays_open(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The inline gate's 5 ms since the loop's last turn, made a minute: a slow machine
    must not send these reads to the thread for want of time."""
    monkeypatch.setattr(sql, "INLINE_FOR", 60.0)
    yield


async def _idle(ctx: toren.Context, input: Any) -> Any:
    return None


async def _store_with_message(tmp_path: Path) -> tuple[SQLiteStore, str]:
    store = SQLiteStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    await store.migrate()
    reg = toren.Registry()
    reg.add("idle", _idle)
    run_id = (await toren.start_run(store, reg, "idle", {"x": 1})).id
    await store.send_message(run_id, "next", {"text": "hello"}, now=time.time())
    return store, run_id


async def test_a_runs_row_and_next_message_are_read_without_the_database_thread(
    tmp_path: Path,
) -> None:
    store, run_id = await _store_with_message(tmp_path)
    try:
        jobs = count_thread_jobs(store)
        store._gate.turned()  # the loop took a turn just now and nothing else is ready
        run = await store.get_run(run_id)
        message = await store.next_message(run_id, ["next"])
        assert run is not None and run.id == run_id
        assert message is not None and message.payload == {"text": "hello"}
        assert jobs == []
        assert store._loop_cur is not None and not store._loop_cur.connection.in_transaction
    finally:
        await store.close()


async def test_a_read_the_loops_connection_cannot_do_takes_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, run_id = await _store_with_message(tmp_path)
    try:
        # The loop's connection cannot be opened now (a lock the WAL switch needs, say).
        store._loop_cur = store._loop_conn = None
        opened = store._open

        def refuse_without_waiting(busy_ms: int) -> sqlite3.Connection:
            if busy_ms == 0:
                raise sqlite3.OperationalError("database is locked")
            return opened(busy_ms)

        monkeypatch.setattr(store, "_open", refuse_without_waiting)
        jobs = count_thread_jobs(store)
        store._gate.turned()
        message = await store.next_message(run_id, ["next"])
        assert message is not None and message.payload == {"text": "hello"}
        assert jobs == [False]  # one read, on the thread
    finally:
        await store.close()


async def test_a_write_cut_short_is_rolled_back_by_an_inline_read(tmp_path: Path) -> None:
    store, run_id = await _store_with_message(tmp_path)
    try:
        cur = store._loop_cursor()
        cur.execute("BEGIN IMMEDIATE")  # as a write an interrupt cut short leaves it
        cur.execute("DELETE FROM inbox")
        jobs = count_thread_jobs(store)
        store._gate.turned()
        message = await store.next_message(run_id, ["next"])
        assert message is not None and message.payload == {"text": "hello"}  # not deleted
        assert jobs == []
        assert not cur.connection.in_transaction  # the write lock is free again
    finally:
        await store.close()


async def test_a_corrupt_row_read_inline_is_an_error_and_leaves_no_transaction(
    tmp_path: Path,
) -> None:
    store, run_id = await _store_with_message(tmp_path)
    try:
        await store._run(lambda cur: cur.execute("UPDATE inbox SET payload = '{not json'"))
        jobs = count_thread_jobs(store)
        store._gate.turned()
        with pytest.raises(StorageError, match="inbox"):
            await store.next_message(run_id, ["next"])
        assert jobs == []  # raised by the inline read, not by a second try on the thread
        assert store._loop_cur is not None and not store._loop_cur.connection.in_transaction
        store._gate.turned()
        await store._run(lambda cur: cur.execute("DELETE FROM inbox"))  # writes still go
        assert await store.next_message(run_id, ["next"]) is None
    finally:
        await store.close()


async def test_an_inline_read_holds_no_snapshot_after_it(tmp_path: Path) -> None:
    """A read inline is its statement alone (no ``BEGIN``/``COMMIT``): once its one row is
    fetched, its snapshot is over, so a checkpoint can take the whole WAL back. Checked
    by a ``TRUNCATE`` checkpoint from another connection after each read (it reports
    ``busy`` while any reader holds a snapshot: the control shows it does)."""
    store, run_id = await _store_with_message(tmp_path)
    other = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None, timeout=0.05)
    try:

        def checkpoint_busy() -> int:
            other.execute("UPDATE runs SET updated_at = updated_at + 1")  # a WAL frame
            return int(other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0])

        assert checkpoint_busy() == 0
        jobs = count_thread_jobs(store)
        store._gate.turned()
        assert await store.get_run(run_id) is not None
        assert checkpoint_busy() == 0
        store._gate.turned()
        assert await store.next_message(run_id, ["next"]) is not None
        assert checkpoint_busy() == 0
        store._gate.turned()
        assert await store.next_message(run_id, ["none such"]) is None
        assert checkpoint_busy() == 0
        assert jobs == []
        # The control: a reader that keeps a statement open holds its snapshot.
        cur = store._loop_cursor()
        cur.execute("SELECT name FROM sqlite_master").fetchone()  # of many rows
        assert checkpoint_busy() == 1
    finally:
        other.close()
        await store.close()


async def _log_of(store: SQLiteStore, run_id: str, values: int) -> None:
    """``values`` more events in the run's log, written outside any lease."""
    from tests.store.steps import value_event

    start = len(await store.load_events(run_id))
    events = [value_event(run_id, start + i, i) for i in range(values)]
    for i in range(0, len(events), 50):
        await store._run(lambda cur, chunk=events[i : i + 50]: store._insert_events(cur, chunk))


@pytest.mark.parametrize("extra", [0, INLINE_LOG - 1, INLINE_LOG, INLINE_LOG + 1, 3 * INLINE_LOG])
async def test_a_short_log_is_read_inline_and_a_long_one_finished_on_the_thread(
    tmp_path: Path, extra: int
) -> None:
    """Up to ``INLINE_LOG`` events, the log is one read on the loop's connection; past
    it, the whole log is one read on the database thread. Either
    way the events are the log, each once, in seq order, and ``after_seq`` and ``limit``
    mean what they mean."""
    store, run_id = await _store_with_message(tmp_path)
    try:
        await _log_of(store, run_id, extra)
        store._gate.turned()
        on_thread = await store._event_rows(
            "SELECT seq FROM events WHERE run_id = ? ORDER BY seq", (run_id,)
        )
        seqs = [int(r[0]) for r in on_thread]
        jobs = count_thread_jobs(store)
        store._gate.turned()
        events = await store.load_events(run_id)
        assert [e.seq for e in events] == seqs
        assert jobs == ([] if len(seqs) <= INLINE_LOG else [False])
        assert store._loop_cur is not None and not store._loop_cur.connection.in_transaction
        middle = seqs[len(seqs) // 2]
        store._gate.turned()
        assert [e.seq for e in await store.load_events(run_id, after_seq=middle)] == [
            s for s in seqs if s > middle
        ]
        store._gate.turned()
        assert [e.seq for e in await store.load_events(run_id, limit=2)] == seqs[:2]
    finally:
        await store.close()


async def test_a_log_known_to_be_long_skips_the_inline_head(tmp_path: Path) -> None:
    """A tick that knows its run recorded more than ``LONG_LOG`` steps says so
    (``at_least``): the log is one read on the thread, without a head read inline
    first that would come back too long; a log said to be shorter reads as before."""
    store, run_id = await _store_with_message(tmp_path)
    try:
        await _log_of(store, run_id, 2 * INLINE_LOG)
        store._gate.turned()
        whole = await store.load_events(run_id)
        inline_reads: list[str] = []
        real_head = store._log_head_inline

        def counted(run: str, after_seq: int) -> list[Any] | None:
            inline_reads.append(run)
            return real_head(run, after_seq)

        store._log_head_inline = counted  # type: ignore[method-assign]
        jobs = count_thread_jobs(store)
        store._gate.turned()
        known = await store.load_events(run_id, at_least=LONG_LOG + 1)
        assert [(e.seq, e.payload) for e in known] == [(e.seq, e.payload) for e in whole]
        assert inline_reads == [] and jobs == [False]
        store._gate.turned()
        await store.load_events(run_id, at_least=LONG_LOG)
        assert inline_reads == [run_id] and jobs == [False, False]
    finally:
        await store.close()


async def test_a_long_log_is_one_snapshot_whatever_is_deleted_during_its_read(
    tmp_path: Path,
) -> None:
    """A log read as its first events inline and its rest on the thread would be two
    snapshots: a retention delete between them (``toren runs prune``) left the first 64
    events, a log cut short with nothing to say so. A long log is read whole on the
    thread: it is all of the log or none of it."""
    store, run_id = await _store_with_message(tmp_path)
    try:
        await _log_of(store, run_id, 3 * INLINE_LOG)
        whole = len(await store.load_events(run_id))
        real_tail = store._log_tail

        async def deleted_first(run: str, after_seq: int) -> list[Any]:
            await store._run(lambda cur: cur.execute("DELETE FROM events WHERE run_id = ?", (run,)))
            return await real_tail(run, after_seq)

        store._log_tail = deleted_first  # type: ignore[method-assign]
        store._gate.turned()
        events = await store.load_events(run_id)
        assert whole > INLINE_LOG and events == []
    finally:
        await store.close()
