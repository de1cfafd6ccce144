"""SQLite's short reads by key (a run's row, its next message) run inline on the loop's
connection when the loop is idle, as a lone write does: no hand-off to the database thread
and back. A read the loop's connection cannot do takes the thread and answers the same."""

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
