"""SQLite commits a write of lease bookkeeping alone (a claim, a renewal) without waiting
for the disk (``synchronous=NORMAL`` for that transaction), and every other write at the
store's level (``FULL`` by default): on the loop's connection, on the database thread's,
and in a group that holds both kinds. A store opened at ``synchronous=normal`` changes
nothing. What each transaction ran at is read off SQLite's own statement trace."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.store.sqlite_jobs import count_thread_jobs
from toren.core.contract.records import Release, RunStatus
from toren.store import sql
from toren.store.sqlite import SQLiteStore


@pytest.fixture(autouse=True)
def _gate_stays_open(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The inline gate's 5 ms since the loop's last turn, made a minute: a slow machine
    must not send a lone write to the thread for want of time."""
    monkeypatch.setattr(sql, "INLINE_FOR", 60.0)
    yield


class Levels:
    """Every write transaction the store begins, with the ``synchronous`` level its
    connection was at then, and the statements it ran until its commit."""

    def __init__(self, store: SQLiteStore, opened: str) -> None:
        self.transactions: list[tuple[str, list[str]]] = []
        self._level: dict[int, str] = {}
        self._open_tx: dict[int, tuple[str, list[str]]] = {}
        self._opened = opened
        open_ = store._open

        def traced(busy_ms: int) -> sqlite3.Connection:
            conn = open_(busy_ms)
            key = id(conn)
            self._level[key] = opened
            conn.set_trace_callback(lambda statement: self._saw(key, statement))
            return conn

        store._open = traced  # type: ignore[method-assign]

    def _saw(self, key: int, statement: str) -> None:
        if statement.startswith("PRAGMA synchronous="):
            self._level[key] = statement.split("=", 1)[1].strip().upper()
        elif statement == "BEGIN IMMEDIATE":
            self._open_tx[key] = (self._level[key], [])
        elif statement in ("COMMIT", "ROLLBACK") and key in self._open_tx:
            self.transactions.append(self._open_tx.pop(key))
        elif key in self._open_tx:
            self._open_tx[key][1].append(statement)

    def of(self, table_write: str) -> list[str]:
        """The levels of the transactions that ran a statement starting so."""
        return [
            level
            for level, statements in self.transactions
            if any(s.startswith(table_write) for s in statements)
        ]


async def _idle(ctx: toren.Context, input: Any) -> Any:
    return None


async def _store(tmp_path: Path, query: str = "") -> tuple[SQLiteStore, Levels, str]:
    store = SQLiteStore(f"sqlite:///{tmp_path / 'db.sqlite'}{query}")
    levels = Levels(store, "NORMAL" if query else "FULL")
    await store.migrate()
    reg = toren.Registry()
    reg.add("idle", _idle)
    run_id = (await toren.start_run(store, reg, "idle", {})).id
    return store, levels, run_id


_CLAIM = "UPDATE runs SET lease_owner"
_RENEW = "UPDATE runs SET lease_expires_at"
_MESSAGE = "INSERT INTO inbox"
_RELEASE = "UPDATE runs SET status"


async def test_a_claim_and_a_renewal_commit_without_the_disk_and_every_other_write_with_it(
    tmp_path: Path,
) -> None:
    store, levels, run_id = await _store(tmp_path)
    try:
        now = time.time()
        (lease,) = await store.claim("w1", 1, now=now, ttl=30.0, only=run_id)
        assert await store.renew_lease(lease, expires_at=now + 60)
        await store.renew("w1", [run_id], expires_at=now + 90)
        await store.send_message(run_id, "next", {"n": 1}, now=now)
        await store.release(lease, Release(status=RunStatus.RUNNING), now=now)
        assert levels.of(_CLAIM) == ["NORMAL"]
        assert levels.of(_RENEW) == ["NORMAL", "NORMAL"]
        assert levels.of(_MESSAGE) == ["FULL"]  # a durable write after relaxed ones
        assert levels.of(_RELEASE) == ["FULL"]
        # Every transaction was one of these, and the run's creation was durable too.
        assert levels.of("INSERT INTO runs") == ["FULL"]
    finally:
        await store.close()


async def test_a_group_holding_a_claim_and_another_write_commits_with_the_disk(
    tmp_path: Path,
) -> None:
    store, levels, run_id = await _store(tmp_path)
    try:
        now = time.time()
        # Two writes started in one turn of the loop share one transaction.
        await asyncio.gather(
            store.claim("w1", 1, now=now, ttl=30.0, only=run_id),
            store.send_message(run_id, "next", {"n": 1}, now=now),
        )
        shared = [
            level
            for level, statements in levels.transactions
            if any(s.startswith(_CLAIM) for s in statements)
            and any(s.startswith(_MESSAGE) for s in statements)
        ]
        assert shared == ["FULL"]
        # A lone claim after it relaxes again.
        await store.renew("w1", [run_id], expires_at=now + 90)
        assert levels.of(_RENEW) == ["NORMAL"]
    finally:
        await store.close()


async def test_the_database_thread_sets_the_level_of_its_own_connection(tmp_path: Path) -> None:
    """A write the loop's connection cannot begin (another process holds the write lock)
    is done by the database thread, which waits for the lock: a claim there is relaxed,
    the next write there durable again."""
    store, levels, run_id = await _store(tmp_path)
    other = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None)
    handed = count_thread_jobs(store)
    try:
        now = time.time()
        for write in (
            store.claim("w1", 1, now=now, ttl=30.0, only=run_id),
            store.send_message(run_id, "next", {"n": 1}, now=now),
        ):
            other.execute("BEGIN IMMEDIATE")  # the write lock, held elsewhere
            before = len(handed)
            task = asyncio.ensure_future(write)

            async def reached_the_thread(before: int = before) -> None:
                while len(handed) == before:
                    await asyncio.sleep(0)

            await asyncio.wait_for(reached_the_thread(), 30)
            other.execute("COMMIT")
            await task
        assert handed == [True, True]
        assert levels.of(_CLAIM) == ["NORMAL"]
        assert levels.of(_MESSAGE) == ["FULL"]
    finally:
        other.close()
        await store.close()


async def test_a_store_at_synchronous_normal_runs_every_write_at_its_own_level(
    tmp_path: Path,
) -> None:
    store, levels, run_id = await _store(tmp_path, "?synchronous=normal")
    try:
        now = time.time()
        (lease,) = await store.claim("w1", 1, now=now, ttl=30.0, only=run_id)
        await store.send_message(run_id, "next", {"n": 1}, now=now)
        assert levels.of(_CLAIM) == ["NORMAL"]
        assert levels.of(_MESSAGE) == ["NORMAL"]
        assert {level for level, _ in levels.transactions} == {"NORMAL"}
    finally:
        await store.close()


async def _takes_a_message(ctx: toren.Context, input: Any) -> Any:
    message = await ctx.wait_for_message("next")
    return {"message": message, "at": await ctx.now()}


async def test_a_message_receipt_and_a_park_commit_without_the_disk(tmp_path: Path) -> None:
    """A wake's receipt (its ``MessageReceived`` and the inbox row it consumes) is undone
    by a power loss only with everything after it (the WAL is written in order; the next
    durable commit, here the clock step, makes it durable too): the run then takes the
    same message again. A park undone leaves the run running under a lease whose holder
    died with the machine: it is taken over, replayed and parks again. So both commit at
    NORMAL; the step after the receipt and the run's end at FULL."""
    store = SQLiteStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    levels = Levels(store, "FULL")
    await store.migrate()
    reg = toren.Registry()
    reg.add("takes", _takes_a_message)
    deps = toren.TickDeps(store=store, agents=reg)
    try:
        run_id = (await toren.start_run(store, reg, "takes", {})).id
        assert (await toren.tick(run_id, deps)).status == "waiting"
        await toren.send_message(store, run_id, "next", "hello")
        done = await toren.tick(run_id, deps)
        assert done.status == "completed" and done.output["message"] == "hello"
        assert levels.of("UPDATE inbox SET consumed_seq") == ["NORMAL"]
        # RunStarted, the park, the clock step, the run's end, in order.
        writes = [
            level
            for level, statements in levels.transactions
            if any(s.startswith("INSERT INTO events") for s in statements)
            and not any(s.startswith("UPDATE inbox") for s in statements)
        ]
        assert writes == ["FULL", "NORMAL", "FULL", "FULL"]
        assert levels.of(_RELEASE) == ["NORMAL", "FULL"]  # the park, the run's end
        assert [e.type for e in await store.load_events(run_id)] == [
            "RunStarted",
            "RunWaiting",
            "MessageReceived",
            "ValueRecorded",
            "RunCompleted",
        ]
    finally:
        await store.close()
