"""Runs parked while something else happens to them, and databases that cannot be opened.

* A cancel requested while a worker holds the run must survive the run being parked: the
  run is given back claimable, so the next tick cancels it (it used to sit 'waiting'
  with no wake-up time, forever).
* PostgreSQL: a message sent while its run is being parked wakes it, whichever of the two
  transactions commits first (send_message locks the run row).
* SQLite: a file that is not a database, or a path whose directory cannot be made, gives a
  StorageError naming it; no caller waits forever.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import toren
from tests.conftest import create_pg_database, drop_pg_database, pg_url, require_pg
from toren.errors import StorageError
from toren.store import Store
from toren.store.base import Release


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


async def test_postgres_a_message_sent_while_the_run_parks_wakes_it() -> None:
    require_pg()
    name = create_pg_database()
    store = await toren.connect(pg_url(name))
    try:
        run_id = await _new_run(store)
        now = time.time()
        (lease,) = await store.claim("w1", 1, now=now, ttl=60)
        held, go = threading.Event(), threading.Event()
        plain_x = store._x

        def holding_x(cur: Any, sql: str, params: Any = ()) -> Any:
            out = plain_x(cur, sql, params)
            if sql.startswith("UPDATE runs SET not_before = ? WHERE id = ? AND status"):
                held.set()  # send_message has inserted its message, not yet committed
                go.wait(30)
            return out

        store._x = holding_x  # type: ignore[method-assign]
        sender = asyncio.create_task(store.send_message(run_id, "approval", 1, now=now + 1))
        assert await asyncio.to_thread(held.wait, 30)
        store._x = plain_x  # type: ignore[method-assign]
        parking = asyncio.create_task(
            store.release(lease, Release("waiting", waiting_for=["approval"]), now=now + 1)
        )
        # Let the send commit once the park either finished or waits for the run's row.
        with psycopg.connect(pg_url(name), autocommit=True) as admin:
            while not parking.done():
                waits = admin.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                if waits.fetchone()[0]:  # type: ignore[index]
                    break
                await asyncio.sleep(0.01)
        go.set()
        await sender
        await parking
        row = await store.get_run(run_id)
        assert row.status == "waiting"
        claimed = await store.claim("w2", 10, now=now + 3600, ttl=60)
        assert [c.run_id for c in claimed] == [run_id], f"not_before={row.not_before}"
    finally:
        await store.close()
        drop_pg_database(name)


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
