"""Runs parked while something else happens to them, and databases that cannot be opened.

* A cancel requested while a worker holds the run must survive the run being parked: the
  run is given back claimable, so the next tick cancels it (it used to sit 'waiting'
  with no wake-up time, forever).
* PostgreSQL: a message sent while its run is being parked wakes it, whichever of the two
  transactions commits first (send_message locks the run row).
* SQLite: a file that is not a database, or a path whose directory cannot be made, gives a
  StorageError naming it; no caller waits forever.
* PostgreSQL: a database that does not exist, or a server that refuses the connection,
  gives a StorageError naming the cause and the URL without its password, at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import toren
from tests.conftest import clone_pg_database, drop_pg_database, pg_url, require_pg
from toren.errors import LeaseLost, SchemaError, StorageError
from toren.store import Store
from toren.store.base import Release
from toren.store.postgres import SEND_MESSAGE


async def _idle(ctx: toren.Context, input: Any) -> Any:
    return None


async def _new_run(store: Store) -> str:
    reg = toren.Registry()
    reg.add("idle", _idle)
    return (await toren.start_run(store, reg, "idle", {})).id


@pytest.mark.parametrize("park", ["message", "timer"])
async def test_a_cancel_requested_while_leased_survives_parking(store: Store, park: str) -> None:
    run_id = await _new_run(store)
    now = time.time()
    (lease,) = await store.claim("w1", 1, now=now, ttl=60)
    await store.request_cancel(run_id, now=now + 1)  # the user cancels; the worker holds it
    if park == "message":
        release = Release("waiting", waiting_for=["approval"])
    else:
        release = Release("waiting", not_before=now + 86_400)
    await store.release(lease, release, now=now + 2)
    row = await store.get_run(run_id)
    assert row.status == "waiting" and row.cancel_requested
    claimed = await store.claim("w2", 10, now=now + 3, ttl=60)
    assert [c.run_id for c in claimed] == [run_id]


async def test_a_run_parked_without_a_cancel_stays_parked(store: Store) -> None:
    run_id = await _new_run(store)
    now = time.time()
    (lease,) = await store.claim("w1", 1, now=now, ttl=60)
    await store.release(lease, Release("waiting", waiting_for=["approval"]), now=now + 1)
    assert await store.claim("w2", 10, now=now + 3600, ttl=60) == []
    assert (await store.get_run(run_id)).status == "waiting"


@pytest.mark.parametrize("name", ["approval", "other"])
async def test_a_message_sent_while_leased_wakes_the_run_it_parks(store: Store, name: str) -> None:
    """A message sent while the run is leased found it ``running`` and could not wake it;
    the park looks at the inbox for the names it waits for (only those)."""
    run_id = await _new_run(store)
    now = time.time()
    (lease,) = await store.claim("w1", 1, now=now, ttl=60)
    await store.send_message(run_id, name, 1, now=now + 1)
    await store.release(lease, Release("waiting", waiting_for=["approval"]), now=now + 2)
    row = await store.get_run(run_id)
    assert row.status == "waiting" and row.lease_owner is None
    claimed = await store.claim("w2", 10, now=now + 3, ttl=60)
    assert [c.run_id for c in claimed] == ([run_id] if name == "approval" else [])


async def test_a_park_on_the_inbox_whose_lease_moved_writes_nothing(store: Store) -> None:
    """The message park (two statements on PostgreSQL's inline lane) is fenced as every
    release is: a worker whose lease was taken over writes no event and leaves the row,
    its wake time included, as the new holder has it."""
    run_id = await _new_run(store)
    now = time.time()
    (old,) = await store.claim("w1", 1, now=now, ttl=1)
    (new,) = await store.claim("w2", 1, now=now + 5, ttl=60)  # w1's lease ran out
    await store.send_message(run_id, "approval", 1, now=now + 6)
    if hasattr(store, "lanes"):
        store.lanes.gate = _OpenGate()  # type: ignore[attr-defined]
    before = await store.get_run(run_id)
    with pytest.raises(LeaseLost):
        await store.release(old, Release("waiting", waiting_for=["approval"]), now=now + 7)
    row = await store.get_run(run_id)
    assert (row.status, row.lease_owner, row.not_before) == (
        "running",
        "w2",
        before.not_before,
    )
    assert new.epoch == row.lease_epoch


async def test_a_stale_park_on_the_inbox_leaves_the_new_holders_timer(store: Store) -> None:
    """A worker whose lease moved parks on a message that is there: its release writes
    nothing, and the run keeps the wake time the new holder gave it (a timer a day away),
    on both PostgreSQL paths as on SQLite."""
    run_id = await _new_run(store)
    now = time.time()
    (old,) = await store.claim("w1", 1, now=now, ttl=1)
    (new,) = await store.claim("w2", 1, now=now + 5, ttl=60)  # w1's lease ran out
    await store.send_message(run_id, "approval", 1, now=now + 6)  # running: no wake
    await store.release(new, Release("waiting", not_before=now + 86_400), now=now + 7)
    if hasattr(store, "lanes"):
        store.lanes.gate = _OpenGate()  # type: ignore[attr-defined]
    with pytest.raises(LeaseLost):
        await store.release(old, Release("waiting", waiting_for=["approval"]), now=now + 8)
    row = await store.get_run(run_id)
    assert (row.status, row.not_before) == ("waiting", now + 86_400)


@contextlib.asynccontextmanager
async def _claimed_on_postgres() -> AsyncIterator[tuple[Store, str, str, float, Any]]:
    """A fresh PostgreSQL database with one run, claimed by worker w1: (store, database
    name, run id, the claim's time, the lease)."""
    require_pg()
    name = clone_pg_database()
    store = await toren.connect(pg_url(name))
    try:
        run_id = await _new_run(store)
        now = time.time()
        (lease,) = await store.claim("w1", 1, now=now, ttl=60)
        yield store, name, run_id, now, lease
    finally:
        await store.close()
        drop_pg_database(name)


async def test_postgres_a_message_sent_while_the_run_parks_wakes_it_the_loops_way() -> None:
    """The park the loop's way (when the inline lane is busy or not open): the release
    and the wake statement in one pipeline on an async connection. The hard order, as
    inline: the sender holds the run's row (locked, message inserted but not committed)
    when the release starts, so the release waits for the row and its snapshot, taken
    before, cannot see the message; the wake statement's can."""
    async with _claimed_on_postgres() as (store, name, run_id, now, lease):
        store.lanes.try_inline_transaction = lambda statements: None  # type: ignore[method-assign]
        pipelined: list[int] = []
        transaction = store.lanes.transaction

        async def counted(statements: Any) -> Any:
            pipelined.append(len(statements))
            return await transaction(statements)

        store.lanes.transaction = counted  # type: ignore[method-assign]
        sender = psycopg.connect(pg_url(name))
        sender.execute(SEND_MESSAGE, (run_id, "approval", "1", now + 1, now + 1))
        parking = asyncio.create_task(
            store.release(lease, Release("waiting", waiting_for=["approval"]), now=now + 2)
        )
        with psycopg.connect(pg_url(name), autocommit=True) as admin:
            deadline = time.monotonic() + 30
            while not _lock_waits(admin) and not parking.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        assert not parking.done()  # it waits for the sender's row
        sender.commit()
        sender.close()
        await parking
        assert pipelined == [2]  # the release and the wake, in one round trip
        row = await store.get_run(run_id)
        assert row.status == "waiting"
        claimed = await store.claim("w2", 10, now=now + 3600, ttl=60)
        assert [c.run_id for c in claimed] == [run_id], f"not_before={row.not_before}"


async def _inline_lane_open(store: Any, run_id: str) -> None:
    """Wait for the store's inline lane, which opens in the background."""
    for _ in range(500):
        if store.lanes._inline is not None:
            return
        await store.get_run(run_id)
        await asyncio.sleep(0.01)


class _OpenGate:
    """The inline lane's gate, always open (a busy loop would close it; this test is about
    what the lane's statements see, not when the lane is taken)."""

    def open(self, loop: object) -> bool:
        return True

    def turned(self) -> None:
        pass


def _lock_waits(admin: psycopg.Connection[Any]) -> int:
    return admin.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0]  # type: ignore[index]


async def test_postgres_a_message_sent_while_the_run_parks_inline_wakes_it() -> None:
    """The park on the inline lane: one round trip, the release and then the wake
    statement. The hard order: the sender holds the run's row (locked, message inserted
    but not committed) when the release starts, so the release waits for the row and its
    snapshot, taken before, cannot see the message; the wake statement's can."""
    async with _claimed_on_postgres() as (store, name, run_id, now, lease):
        await _inline_lane_open(store, run_id)
        lane, _ = store.lanes._inline
        lane.execute("SET lock_timeout = '30s'")  # wait for the sender, do not defer
        # The sender: send_message's own statement, its transaction left open (the row
        # locked, the message inserted), committed only once the release waits for it.
        sender = psycopg.connect(pg_url(name))
        sender.execute(SEND_MESSAGE, (run_id, "approval", "1", now + 1, now + 1))

        def let_the_sender_go() -> None:  # the park blocks the loop, inline: a thread
            with psycopg.connect(pg_url(name), autocommit=True) as admin:
                deadline = time.monotonic() + 30
                while not _lock_waits(admin) and time.monotonic() < deadline:
                    time.sleep(0.005)
            sender.commit()

        watcher = threading.Thread(target=let_the_sender_go)
        watcher.start()
        store.lanes.gate = _OpenGate()  # type: ignore[assignment]  # the lane is free
        inline = store.lanes.try_inline_transaction
        went_inline: list[bool] = []
        store.lanes.try_inline_transaction = lambda statements: (  # type: ignore[method-assign]
            went_inline.append((done := inline(statements)) is not None) or done
        )
        await store.release(lease, Release("waiting", waiting_for=["approval"]), now=now + 2)
        watcher.join(30)
        sender.close()
        assert went_inline == [True]  # the release and the wake, in one round trip
        row = await store.get_run(run_id)
        assert row.status == "waiting"
        claimed = await store.claim("w2", 10, now=now + 3600, ttl=60)
        assert [c.run_id for c in claimed] == [run_id], f"not_before={row.not_before}"


@pytest.mark.parametrize("case", ["alone", "timeout", "message", "cancel"])
async def test_postgres_a_park_tells_the_workers_only_when_the_run_has_a_wake_time(
    case: str,
) -> None:
    """A run parked on its inbox alone is nobody's work until a message comes, and the
    sender's NOTIFY tells the workers then: its park sends none. A park that leaves a
    wake time (the wait's timeout, a message that came while the run ran, a cancel asked
    for meanwhile) does, so idle workers claim it, or sleep until it, at once."""
    async with _claimed_on_postgres() as (store, name, run_id, now, lease):
        await _inline_lane_open(store, run_id)
        store.lanes.gate = _OpenGate()  # type: ignore[assignment]
        told: list[None] = []
        plain_notify = store.notify

        async def notify() -> None:
            told.append(None)
            await plain_notify()

        store.notify = notify  # type: ignore[method-assign]
        if case == "message":  # found running: stored, not woken
            await store.send_message(run_id, "approval", 1, now=now + 1)
        if case == "cancel":
            await store.request_cancel(run_id, now=now + 1)
        told.clear()
        wake = now + 60 if case == "timeout" else None
        park = Release("waiting", not_before=wake, waiting_for=["approval"])
        await store.release(lease, park, now=now + 2)
        row = await store.get_run(run_id)
        assert row is not None and row.status == "waiting" and row.lease_owner is None
        assert len(told) == (0 if case == "alone" else 1)
        assert (row.not_before is None) is (case == "alone")


async def test_sqlite_a_file_that_is_not_a_database_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "toren.db"
    path.write_text("this is not a database\n" * 100)
    with pytest.raises(StorageError, match="not a database"):
        await asyncio.wait_for(toren.connect(f"sqlite:///{path}"), 30)


@pytest.mark.parametrize("call", ["read", "write"])
async def test_sqlite_a_path_that_cannot_be_made_is_an_error(tmp_path: Path, call: str) -> None:
    parent = tmp_path / "file"
    parent.write_text("a file, not a directory")
    store = toren.open_store(f"sqlite:///{parent}/sub/toren.db")
    try:
        with pytest.raises(StorageError, match="Not a directory"):
            if call == "read":
                await asyncio.wait_for(store.get_run("run_x"), 30)
            else:
                await asyncio.wait_for(store.migrate(), 30)
        # The database thread survived: a second call is answered too.
        with pytest.raises(StorageError):
            await asyncio.wait_for(store.get_run("run_y"), 30)
    finally:
        await asyncio.wait_for(store.close(), 30)


PASSWORD = "hunter2-not-shown"


def _unreachable_url(where: str) -> tuple[str, str]:
    """A URL with a password that cannot be opened, and the cause its error must name."""
    if where == "closed_port":
        with socket.socket() as sock:  # a loopback port nothing listens on once closed
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/toren", "Connection refused"
    require_pg()
    missing = f"toren_missing_{uuid.uuid4().hex[:10]}"
    url = pg_url(missing).replace("://postgres@", f"://postgres:{PASSWORD}@", 1)
    assert PASSWORD in url
    return url, f'database "{missing}" does not exist'


@pytest.mark.parametrize("where", ["missing_database", "closed_port"])
@pytest.mark.parametrize("first", ["connect", "read"])
async def test_postgres_an_unreachable_database_fails_at_once_with_its_cause(
    where: str, first: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Opening the store, or its first read, names the server's answer: not a pool that
    retried in the background until its timeout ("pool initialization incomplete"), nor a
    schema error, and never the password."""
    url, cause = _unreachable_url(where)
    store = toren.open_store(url)
    try:
        with pytest.raises(StorageError) as info:
            if first == "connect":
                await toren.connect(url)
            else:
                await store.get_run("run_x")
    finally:
        await store.close()
    message = info.value.message
    assert not isinstance(info.value, SchemaError)
    assert cause in message and "cannot connect to PostgreSQL at" in message
    assert url.replace(f":{PASSWORD}@", "@") in message
    assert PASSWORD not in message and PASSWORD not in caplog.text
    assert not [r for r in caplog.records if r.name.startswith("psycopg")]  # no retries


@pytest.mark.parametrize("lane", ["inline", "loop"])
async def test_postgres_a_pipelined_transaction_is_one_transaction_all_or_nothing(
    lane: str,
) -> None:
    """The lanes' transaction (inline, or the loop's way on the fast lane) is the
    pipeline's implicit one (no BEGIN and COMMIT): its statements share one transaction
    id, a later one sees an earlier one's writes, and a failing statement takes the
    earlier ones back with it. The connection is usable after the failure."""
    async with _claimed_on_postgres() as (store, name, run_id, now, lease):
        lanes = store.lanes
        if lane == "inline":
            await _inline_lane_open(store, run_id)
            lanes.gate = _OpenGate()  # type: ignore[assignment]

        async def transaction(statements: Any) -> Any:
            if lane == "inline":
                done = lanes.try_inline_transaction(statements)
                assert done is not None
                return done
            return await lanes.transaction(statements)

        mark = "UPDATE runs SET priority = %s WHERE id = %s RETURNING txid_current()"
        seen = "SELECT priority, txid_current() FROM runs WHERE id = %s"
        (first,), (second,) = await transaction([(mark, (7, run_id)), (seen, (run_id,))])
        assert second == (7, first[0])  # the write seen, in the same transaction
        failing = "SELECT 1 / (priority - 9) FROM runs WHERE id = %s"  # after the 9
        # The loop's way reports a StorageError, as its one-statement fetch does.
        error = psycopg.errors.DivisionByZero if lane == "inline" else StorageError
        with pytest.raises(error, match="division by zero"):
            await transaction([(mark, (9, run_id)), (failing, (run_id,))])
        row = await store.get_run(run_id)
        assert row is not None and row.priority == 7  # the failed transaction's 9 is gone
        # The connection is usable after the failure, outside any transaction.
        (again,), (seen_again,) = await transaction([(mark, (8, run_id)), (seen, (run_id,))])
        assert seen_again == (8, again[0])
        idle = psycopg.pq.TransactionStatus.IDLE
        if lane == "inline":
            assert lanes._inline[0].info.transaction_status == idle
        else:
            assert lanes._lane is not None  # kept: the failure left it idle
            assert lanes._lane[0].info.transaction_status == idle


async def test_postgres_every_lane_ends_a_transaction_left_idle() -> None:
    """Each connection a store opens (the thread pool's, the async pool's, the inline
    lane's) has the server end a transaction left open and idle for 10 s: a worker
    frozen between two statements of a transaction (a key's claim, say) would otherwise
    hold its locks, and every other worker's claims of that key, for as long as it is
    frozen."""
    async with _claimed_on_postgres() as (store, name, run_id, now, lease):
        await _inline_lane_open(store, run_id)
        lanes = store.lanes
        show = "SHOW idle_in_transaction_session_timeout"
        on_thread = await lanes.run(lambda cur: cur.execute(show).fetchone()[0], write=False)  # type: ignore[attr-defined]
        assert on_thread == "10s"
        assert await lanes.fetch(show, (), inline_ok=False) == [("10s",)]
        assert await lanes.transaction([(show, ())]) == [[("10s",)]]
        lanes.gate = _OpenGate()  # type: ignore[assignment]
        assert lanes.try_inline(show, ()) == [("10s",)]


async def test_postgres_a_park_the_loops_way_on_a_killed_connection_fails_and_the_next_goes_on() -> (
    None
):
    """The fast lane's connection killed by the server (an operator's
    pg_terminate_backend, a failover) under a park the loop's way: the park fails with a
    StorageError, having written nothing, the lane drops the connection, and the park
    tried again succeeds on a fresh one."""
    async with _claimed_on_postgres() as (store, name, run_id, now, lease):
        lanes = store.lanes
        lanes.try_inline_transaction = lambda statements: None  # type: ignore[method-assign]
        assert await lanes.fetch("SELECT 1", (), inline_ok=False) == [(1,)]  # opens the lane
        assert lanes._lane is not None
        (pid,) = await lanes.fetch("SELECT pg_backend_pid()", (), inline_ok=False)
        with psycopg.connect(pg_url(name), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid[0],))
        park = Release("waiting", waiting_for=["approval"])
        with pytest.raises(StorageError):
            await store.release(lease, park, now=now + 1)
        assert lanes._lane is None  # the broken connection went back to the pool
        row = await store.get_run(run_id)
        assert row is not None and row.status == "running" and row.lease_owner == "w1"
        await store.release(lease, park, now=now + 2)
        row = await store.get_run(run_id)
        assert row is not None and row.status == "waiting" and row.lease_owner is None


async def test_postgres_a_pipeline_the_loops_way_cut_short_commits_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pipelined transaction the loop's way that is cut short commits none of it:
    psycopg sends its Sync however the pipeline block is left, so a client-side error in
    a later statement, or a cancellation at any of its yields, would otherwise commit the
    statements queued before. And no connection is handed out again in pipeline mode
    (where writes would report success and never commit)."""
    async with _claimed_on_postgres() as (store, name, run_id, now, lease):
        with psycopg.connect(pg_url(name), autocommit=True) as admin:
            admin.execute("CREATE TABLE cut (tag text, k int)")
        lanes = store.lanes
        ins = "INSERT INTO cut VALUES (%s, %s)"

        def committed(k: int) -> list[str]:
            with psycopg.connect(pg_url(name), autocommit=True) as admin:
                rows = admin.execute("SELECT tag FROM cut WHERE k = %s ORDER BY tag", (k,))
                return [r[0] for r in rows.fetchall()]

        with pytest.raises(StorageError, match="cannot adapt"):
            await lanes.transaction([(ins, ("a", 1)), (ins, ("b", object()))])
        assert committed(1) == []
        assert lanes._lane is not None  # rolled back in place: the lane stays

        # A busy loop: psycopg yields to it at every wait (after 5 ms without one).
        monkeypatch.setattr(psycopg.waiting, "MAX_BUSY_TIME", 0.0)
        outcomes = set()
        for k in range(2, 16):
            task = asyncio.ensure_future(lanes.transaction([(ins, ("a", k)), (ins, ("b", k))]))
            for _ in range(k - 2):
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            outcomes.add(tuple(committed(k)))
        assert outcomes <= {(), ("a", "b")}
        assert () in outcomes  # some cancellations did land before the commit
        monkeypatch.undo()

        pooled = [
            await lanes._apool.getconn() for _ in range(lanes._apool.get_stats()["pool_size"])
        ]
        try:
            for i, conn in enumerate(pooled):
                assert conn.pgconn.pipeline_status == 0
                await conn.execute(ins, ("pooled", 100 + i))
        finally:
            for conn in pooled:
                await lanes._apool.putconn(conn)
        assert all(committed(100 + i) == ["pooled"] for i in range(len(pooled)))
