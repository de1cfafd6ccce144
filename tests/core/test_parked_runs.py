"""Parked runs cost nothing, and wake through the database's notification path (issue 24).

* A run parked on a message holds no task, no lease and no slot in the worker; a message
  wakes it (both backends).
* PostgreSQL: with a poll interval of an hour, a message sent through another connection
  wakes the parked run, and the worker's counters say the claim that found it followed a
  NOTIFY (never a poll).
* Timers: many runs due at the same instant, two worker processes: every run is claimed
  exactly once (its lease epoch, one tick in its log), both workers take a share, and
  claims followed the timer's due time (``store.next_due``). On PostgreSQL the workers
  poll once an hour, so none woke by polling; SQLite has no cross-process signal, so its
  workers learn of new timers by their (default) poll and then sleep until the due time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import toren
from tests.conftest import clone_pg_database, drop_pg_database, pg_url, require_pg
from toren.store import Release, Store

ROOT = Path(__file__).resolve().parents[2]
GUARD = 120.0  # s: a hang guard only; nothing here is timed


async def approval(ctx: toren.Context, input: Any) -> Any:
    return {"got": await ctx.wait_for_message("go")}


def _registry() -> toren.Registry:
    reg = toren.Registry()
    reg.add("approval", approval)
    return reg


async def _until(check: Any) -> None:
    deadline = time.monotonic() + GUARD
    while not await check():
        assert time.monotonic() < deadline, "the hang guard ran out"
        await asyncio.sleep(0.02)


def _ticks(worker: toren.LocalWorkerRuntime) -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if "_tick" in repr(t.get_coro())]


async def test_a_parked_run_holds_nothing_in_the_worker(store: Store) -> None:
    reg = _registry()
    deps = toren.TickDeps(store=store, agents=reg, settings=toren.Settings(poll_interval=0.05))
    async with toren.LocalWorkerRuntime(deps) as worker:
        run = await toren.start_run(store, reg, "approval", {})

        async def parked() -> bool:
            row = await store.get_run(run.id)
            return row is not None and row.status == "waiting" and not worker.active_runs

        await _until(parked)
        row = await store.get_run(run.id)
        assert row is not None
        assert (row.lease_owner, row.lease_expires_at) == (None, None)
        assert worker.active_runs == [] and _ticks(worker) == []
        await toren.send_message(store, run.id, "go", {"ok": True})

        async def done() -> bool:
            row = await store.get_run(run.id)
            return row is not None and row.status == "completed"

        await _until(done)
    row = await store.get_run(run.id)
    assert row is not None and row.output == {"got": {"ok": True}}


async def test_postgres_a_message_wakes_a_parked_run_through_notify() -> None:
    require_pg()
    name = clone_pg_database()
    url = pg_url(name)
    store, sender = await toren.connect(url), await toren.connect(url)
    try:
        reg = _registry()
        # Polling once an hour: only a NOTIFY can make this worker claim within the test.
        deps = toren.TickDeps(store=store, agents=reg, settings=toren.Settings(poll_interval=3600))
        async with toren.LocalWorkerRuntime(deps) as worker:

            async def listening() -> bool:
                return bool(getattr(store, "listening", False))

            await _until(listening)
            run = await toren.start_run(sender, reg, "approval", {})

            async def parked() -> bool:
                row = await store.get_run(run.id)
                return row is not None and row.status == "waiting" and not worker.active_runs

            await _until(parked)
            claimed = worker.metrics.claimed["notify"]
            heard = store.notifications  # type: ignore[attr-defined]
            await toren.send_message(sender, run.id, "go", 1)

            async def done() -> bool:
                row = await store.get_run(run.id)
                return row is not None and row.status == "completed"

            await _until(done)
            assert worker.metrics.claimed["notify"] == claimed + 1
            assert store.notifications > heard  # type: ignore[attr-defined]
            assert worker.metrics.wakes["poll"] == 0
            assert worker.metrics.wakes["timer"] == 0
    finally:
        await sender.close()
        await store.close()
        drop_pg_database(name)


def _spawn(url: str, concurrency: int, poll: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.core.timer_worker", url, str(concurrency), str(poll)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


async def test_many_timers_due_at_once_are_each_claimed_once_across_two_workers(
    db_url: str,
) -> None:
    from tests.core.timer_worker import registry

    count, concurrency = 200, 20
    store = await toren.connect(db_url)
    procs: list[subprocess.Popen[str]] = []
    try:
        reg = registry()
        ids = [(await toren.start_run(store, reg, "clock", {})).id for _ in range(count)]
        # Parked as the engine parks a sleeping run: leased first, so no worker takes one
        # before its timer is set.
        now = time.time()
        leases = await store.claim("parker", count, now=now, ttl=3600)
        assert len(leases) == count
        postgres = db_url.startswith("postgresql")
        procs = [_spawn(db_url, concurrency, 3600.0 if postgres else 0.25) for _ in range(2)]
        for proc in procs:
            assert proc.stdout is not None
            assert (await asyncio.to_thread(proc.stdout.readline)).strip() == "ready"
        due = time.time() + 5.0
        for lease in leases:
            await store.release(lease, Release("waiting", not_before=due), now=time.time())
        parked_in_time = time.time() < due  # else some were due already when parked

        async def all_done() -> bool:
            rows = [await store.get_run(i) for i in ids]
            return all(r is not None and r.status == "completed" for r in rows)

        await _until(all_done)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        counters = []
        for proc in procs:
            out, _ = await asyncio.to_thread(proc.communicate, timeout=GUARD)
            assert proc.returncode == 0
            counters.append(json.loads(out.strip().splitlines()[-1]))
        for run_id in ids:
            row = await store.get_run(run_id)
            assert row is not None
            # Claimed by the parker (epoch 1), then exactly once by a worker (epoch 2).
            assert (row.lease_epoch, row.lease_recoveries) == (2, 0)
            types = [e.type for e in await store.load_events(run_id)]
            assert types.count("RunCompleted") == 1 and types.count("RunStarted") == 1
        shares = [sum(c["claimed"].values()) for c in counters]
        assert sum(shares) == count and all(s > 0 for s in shares), counters
        if postgres:
            assert all(c["wakes"].get("poll", 0) == 0 for c in counters), counters
        if parked_in_time:
            assert sum(c["claimed"].get("timer", 0) for c in counters) > 0, counters
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        await store.close()
