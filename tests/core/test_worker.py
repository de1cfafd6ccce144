"""LocalWorkerRuntime: concurrency, prompt wake-up, lease recovery, drain, cancellation,
and the invalidation-storm guard."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import toren
from toren.config import LeaseSettings
from toren.providers.base import ToolSpec
from toren.providers.scripted import ScriptedProvider, read_ledger
from toren.store import Store, open_store

ROOT = Path(__file__).parents[2]


def settings(**kw: Any) -> toren.Settings:
    base = toren.Settings(lease=LeaseSettings(ttl=2.0, heartbeat=0.1), poll_interval=0.05)
    return base.with_(**kw)


def steps_agent(n: int, tag: str = "v1"):
    async def agent(ctx: toren.Context, input: Any) -> Any:
        texts = []
        for i in range(n):
            r = await ctx.model("scripted:echo", [{"role": "user", "content": f"{tag} {i}"}])
            texts.append(r.text)
        return texts

    return agent


async def test_many_runs_concurrently_in_one_worker(store: Store) -> None:
    reg = toren.Registry()
    reg.add("slow", steps_agent(3))
    provider = ScriptedProvider({"default": {"text": "{last_user}"}, "latency": 0.05})
    deps = toren.TickDeps(
        store=store, agents=reg, providers={"scripted": provider}, settings=settings()
    )
    runs = [await toren.start_run(store, reg, "slow", {"i": i}) for i in range(40)]
    async with toren.LocalWorkerRuntime(deps, concurrency=40) as worker:
        peak = 0
        finals = []
        for run in runs:
            peak = max(peak, len(worker.active_runs))
            finals.append(await toren.wait_for_run(store, run.id, timeout=60))
    assert all(f.status == "completed" for f in finals)
    assert provider.served == 120
    # 40 runs x 3 calls x 50 ms would take 6 s one at a time; many were in flight at once.
    assert worker.metrics.ticks["completed"] == 40


async def test_a_worker_for_one_run_claims_no_other(store: Store) -> None:
    """``toren run``'s in-process worker (``only=``) takes its own run and leaves the
    others, even an older one that a plain worker would claim first."""
    reg = toren.Registry()
    reg.add("steps", steps_agent(2))
    provider = ScriptedProvider({"default": {"text": "{last_user}"}})
    deps = toren.TickDeps(
        store=store, agents=reg, providers={"scripted": provider}, settings=settings()
    )
    older = await toren.start_run(store, reg, "steps", {"i": 0})
    mine = await toren.start_run(store, reg, "steps", {"i": 1})
    async with toren.LocalWorkerRuntime(deps, concurrency=1, only=mine.id) as worker:
        final = await toren.wait_for_run(store, mine.id, timeout=30)
        await worker.stop()
    assert final.status == "completed"
    other = await store.get_run(older.id)
    assert other is not None and other.status == "queued" and other.lease_owner is None
    assert [e.type for e in await store.load_events(older.id)] == ["RunStarted"]
    assert provider.served == 2


async def test_new_runs_wake_an_idle_worker(db_url: str) -> None:
    """With a one-minute polling interval, only the wake-up signal can get the run going
    before the test's timeout: in-process on SQLite, LISTEN/NOTIFY across connections on
    PostgreSQL."""
    worker_store = await toren.connect(db_url)
    starter = worker_store if db_url.startswith("sqlite") else await toren.connect(db_url)
    reg = toren.Registry()
    reg.add("one", steps_agent(1))
    deps = toren.TickDeps(
        store=worker_store,
        agents=reg,
        providers={"scripted": ScriptedProvider()},
        settings=settings(poll_interval=60.0),
    )
    try:
        async with toren.LocalWorkerRuntime(deps):
            await asyncio.sleep(0.2)  # let the worker go idle (and LISTEN)
            run = await toren.start_run(starter, reg, "one")
            final = await toren.wait_for_run(starter, run.id, timeout=20)
            assert final.status == "completed"
    finally:
        if starter is not worker_store:
            await starter.close()
        await worker_store.close()


async def test_expired_lease_is_recovered_by_another_worker(store: Store) -> None:
    reg = toren.Registry()
    reg.add("one", steps_agent(2))
    run = await toren.start_run(store, reg, "one")
    clock = toren.ManualClock(1_900_000_000.0)
    # A worker claimed the run and died: its lease simply stops being renewed.
    dead = await store.claim("dead-worker", 1, now=clock.now(), ttl=5)
    assert [lease.run_id for lease in dead] == [run.id]
    deps = toren.TickDeps(
        store=store,
        agents=reg,
        providers={"scripted": ScriptedProvider()},
        clock=clock,
        settings=settings(),
    )
    assert (await toren.tick(run.id, deps)).status == "not_claimed"  # still leased
    await clock.advance(6)
    result = await toren.tick(run.id, deps)
    assert result.status == "completed"
    final = await store.get_run(run.id)
    assert final is not None and final.lease_recoveries == 1
    # The dead worker can never write again: its fencing token is stale.
    from toren.core.contract.events import RunWaiting, make_event
    from toren.errors import LeaseLost

    with pytest.raises(LeaseLost):
        await store.append(dead[0], [make_event(run.id, RunWaiting())], now=clock.now())


async def test_cancel_a_running_run_via_heartbeat(store: Store) -> None:
    started = asyncio.Event()

    async def hang(**_: Any) -> str:
        started.set()
        await asyncio.sleep(60)
        return "never"

    async def agent(ctx: toren.Context, input: Any) -> Any:
        return await ctx.tool("hang")

    reg = toren.Registry()
    reg.add("h", agent, tools={"hang": toren.ToolDef("hang", hang, ToolSpec("hang"))})
    deps = toren.TickDeps(store=store, agents=reg, settings=settings())
    run = await toren.start_run(store, reg, "h")
    async with toren.LocalWorkerRuntime(deps):
        await started.wait()
        await store.request_cancel(run.id, now=deps.clock.now())
        final = await toren.wait_for_run(store, run.id, timeout=20)
    assert final.status == "cancelled"
    assert [e.type for e in await store.load_events(run.id)] == ["RunStarted", "RunCancelled"]


async def test_drain_releases_unfinished_runs(store: Store) -> None:
    started = asyncio.Event()

    async def slow(**_: Any) -> str:
        started.set()
        await asyncio.sleep(30)
        return "late"

    async def agent(ctx: toren.Context, input: Any) -> Any:
        await ctx.model("scripted:echo", [{"role": "user", "content": "first"}])
        return await ctx.tool("slow")

    reg = toren.Registry()
    reg.add("d", agent, tools={"slow": toren.ToolDef("slow", slow, ToolSpec("slow"))})
    provider = ScriptedProvider()
    deps = toren.TickDeps(
        store=store, agents=reg, providers={"scripted": provider}, settings=settings()
    )
    run = await toren.start_run(store, reg, "d")
    worker = toren.LocalWorkerRuntime(deps)
    await worker.start()
    await started.wait()
    await worker.stop(drain_window=0.2)
    released = await store.get_run(run.id)
    assert released is not None and released.lease_owner is None and released.status == "running"
    # Another worker picks it up at once and re-runs only the in-flight step.
    fast = toren.Registry()
    fast.add("d", agent, tools={"slow": toren.ToolDef("slow", lambda: "quick", ToolSpec("slow"))})
    deps2 = toren.TickDeps(
        store=store, agents=fast, providers={"scripted": provider}, settings=settings()
    )
    async with toren.LocalWorkerRuntime(deps2):
        final = await toren.wait_for_run(store, run.id, timeout=20)
    assert final.status == "completed" and final.output == "quick" and provider.served == 1


def test_sigterm_drains_a_worker_process(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/w.db"
    ledger = tmp_path / "ledger.jsonl"

    async def setup() -> str:
        store = await toren.connect(db)
        from tests.core.crash_worker import registry

        run = await toren.start_run(store, registry(), "fifty")
        await store.close()
        return run.id

    run_id = asyncio.run(setup())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.core.crash_worker", db, str(ledger), run_id, "0.2"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = asyncio.run(_wait_ledger(ledger, 2))
        assert deadline
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    from tests.core.crash_worker import DRAINED

    assert code == DRAINED  # it stopped on the signal, mid-run, and exited on its own

    async def check() -> None:
        store = open_store(db)
        run = await store.get_run(run_id)
        await store.close()
        assert run is not None and run.lease_owner is None  # leases released, not left to expire

    asyncio.run(check())
    assert len(read_ledger(ledger)) < 50


async def _wait_ledger(ledger: Path, n: int) -> bool:
    for _ in range(2000):
        if len(read_ledger(ledger)) >= n:
            return True
        await asyncio.sleep(0.01)
    return False


async def test_a_restarted_worker_with_a_stable_id_takes_its_runs_back(store: Store) -> None:
    """Like DBOS's executor id: a worker restarting under the same id knows its previous
    process is dead, so its runs need not wait for their leases to expire."""
    reg = toren.Registry()
    reg.add("one", steps_agent(2))
    run = await toren.start_run(store, reg, "one")
    dead = await store.claim("host-a", 1, now=toren.SystemClock().now(), ttl=3600)
    assert [lease.run_id for lease in dead] == [run.id]  # held for an hour by a dead process
    deps = toren.TickDeps(
        store=store,
        agents=reg,
        providers={"scripted": ScriptedProvider()},
        settings=settings(),
        worker_id="host-a",
    )
    async with toren.LocalWorkerRuntime(deps):
        final = await toren.wait_for_run(store, run.id, timeout=20)
    assert final.status == "completed" and final.lease_recoveries == 1
    # Registering the same id again (a second restart) works too.
    deps2 = toren.TickDeps(store=store, agents=reg, settings=settings(), worker_id="host-a")
    async with toren.LocalWorkerRuntime(deps2):
        pass


async def test_a_heartbeat_stalled_before_its_renewal_sets_the_expiry_from_after_the_stall(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heartbeat first writes the worker's own row and looks for gone workers, then
    renews its runs' leases. A stall before the renewal (a SIGSTOP, a GC pause, a slow
    statement) must not leave the database's expiry earlier than the tick's local
    deadline, which counts from when the renewal is sent: the expiry is ``now + ttl``
    with ``now`` read after the stall, or another worker could claim the run while its
    holder still believes it has the lease and starts an effect (a tool run twice, a
    concurrency key over its limit)."""
    started, done = asyncio.Event(), asyncio.Event()

    async def slow(**_: Any) -> str:
        started.set()
        await done.wait()
        return "done"

    async def agent(ctx: toren.Context, input: Any) -> Any:
        return await ctx.tool("slow")

    reg = toren.Registry()
    reg.add("s", agent, tools={"slow": toren.ToolDef("slow", slow, ToolSpec("slow"))})
    clock = toren.ManualClock(start=time.time())
    ttl = 60.0
    deps = toren.TickDeps(
        store=store,
        agents=reg,
        clock=clock,
        settings=settings(lease=LeaseSettings(ttl=ttl, heartbeat=3600)),
    )
    run = await toren.start_run(store, reg, "s")
    real_heartbeat = store.heartbeat_worker

    async def stalled(*args: Any, **kw: Any) -> Any:
        await clock.advance(15.0)  # a stall in the first statement: a quarter of the lease
        return await real_heartbeat(*args, **kw)

    async with toren.LocalWorkerRuntime(deps, concurrency=1) as worker:
        await started.wait()
        real_look = worker._take_over_gone

        async def stalled_look() -> None:
            await clock.advance(15.0)  # and one in the look for gone workers
            await real_look()

        monkeypatch.setattr(store, "heartbeat_worker", stalled)
        monkeypatch.setattr(worker, "_take_over_gone", stalled_look)
        try:
            await worker.heartbeat()
            row = await store.get_run(run.id)
        finally:
            done.set()  # the tool returns: the runtime's exit does not wait on it
        assert row is not None and row.lease_owner == worker.worker_id
        assert row.lease_expires_at is not None
        assert row.lease_expires_at >= clock.now() + ttl, (row.lease_expires_at, clock.now())
        final = await toren.wait_for_run(store, run.id, timeout=30)
    assert final.status == "completed"


async def test_a_worker_that_lost_its_lease_stops_the_step_in_flight(store: Store) -> None:
    """The lease ran out (a long GC pause, a partition) and another worker took the run:
    the next heartbeat sees it is no longer held and stops the tick here, so the tool in
    flight is not paid for twice (the other worker runs it again)."""
    started, stopped = asyncio.Event(), asyncio.Event()

    async def slow(**_: Any) -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.set()
            raise
        return "never"

    async def agent(ctx: toren.Context, input: Any) -> Any:
        return await ctx.tool("slow")

    reg = toren.Registry()
    reg.add("s", agent, tools={"slow": toren.ToolDef("slow", slow, ToolSpec("slow"))})
    # Heartbeats are driven by hand below: the loop's interval is out of the way.
    deps = toren.TickDeps(
        store=store, agents=reg, settings=settings(lease=LeaseSettings(ttl=60, heartbeat=3600))
    )
    run = await toren.start_run(store, reg, "s")
    # One slot, held by the run: the worker cannot claim the run back itself when the
    # expiry below wakes it (NOTIFY), before the other worker does.
    async with toren.LocalWorkerRuntime(deps, concurrency=1) as worker:
        await started.wait()
        now = deps.clock.now()
        await store.expire_leases(worker.worker_id, now=now)
        taken = await store.claim("other-worker", 1, now=now, ttl=60, only=run.id)
        assert [lease.run_id for lease in taken] == [run.id]
        await worker.heartbeat()
        await asyncio.wait_for(stopped.wait(), timeout=30)
    row = await store.get_run(run.id)
    assert row is not None and row.lease_owner == "other-worker"
    assert [e.type for e in await store.load_events(run.id)] == ["RunStarted"]
