"""A run held by a worker that is gone is taken over without waiting out its lease when
that is known safely (a worker on this host whose process no longer exists; a worker that
deregistered); otherwise the holder and the end of its lease are shown."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

import toren
from toren.config import LeaseSettings, Settings
from toren.core.drivers.takeover import gone_in, take_over_gone, why_gone
from toren.store import Store
from toren.store.base import WorkerInfo

LONG = 3600.0  # a lease no test could wait out


async def _done(ctx: toren.Context, input: Any) -> Any:
    return "done"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: the pid no longer exists
    return proc.pid


async def _held_by(store: Store, info: WorkerInfo) -> str:
    reg = toren.Registry()
    reg.add("a", _done)
    run = await toren.start_run(store, reg, "a")
    await store.register_worker(info)
    (lease,) = await store.claim(info.id, 1, now=time.time(), ttl=LONG, only=run.id)
    assert lease.run_id == run.id
    return run.id


async def _completes(store: Store, run_id: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        row = await store.get_run(run_id)
        assert row is not None
        if row.status == "completed":
            return
        assert time.monotonic() < deadline, f"run still {row.status}, held by {row.lease_owner}"
        await asyncio.sleep(0.02)


def _worker(store: Store) -> toren.LocalWorkerRuntime:
    reg = toren.Registry()
    reg.add("a", _done)
    settings = Settings(poll_interval=0.05, lease=LeaseSettings(ttl=LONG, heartbeat=0.2))
    return toren.LocalWorkerRuntime(toren.TickDeps(store=store, agents=reg, settings=settings))


@pytest.mark.parametrize("how", ["process_gone", "deregistered"])
async def test_the_run_of_a_gone_worker_is_taken_over_at_once(store: Store, how: str) -> None:
    old = time.time() - 60
    if how == "process_gone":
        info = WorkerInfo("w-dead", "v1", old, old, hostname=socket.gethostname(), pid=_dead_pid())
    else:
        info = WorkerInfo("w-left", "v1", old, 0.0, draining=True, hostname="elsewhere", pid=1)
    run_id = await _held_by(store, info)
    async with _worker(store):
        await _completes(store, run_id)
    row = await store.get_run(run_id)
    assert row is not None and row.lease_recoveries == 1


async def test_a_holder_that_may_be_alive_is_waited_for_and_the_wait_is_shown(
    store: Store,
) -> None:
    now = time.time()
    cases = {
        # Another host: its process cannot be looked at.
        "w-far": WorkerInfo("w-far", "v1", now - 60, now - 60, hostname="far-away", pid=4242),
        # This host, its process alive (this very process): perhaps just slow.
        "w-here": WorkerInfo(
            "w-here", "v1", now - 60, now - 60, hostname=socket.gethostname(), pid=_alive_pid()
        ),
    }
    runs = {wid: await _held_by(store, info) for wid, info in cases.items()}
    assert await take_over_gone(store, me="me", now=time.time(), heartbeat=0.2) == []
    for wid, run_id in runs.items():
        row = await store.get_run(run_id)
        assert row is not None and row.lease_owner == wid
        lease = row.to_dict()["lease"]
        assert lease["worker"] == wid and lease["expires_at"] > time.time() + LONG / 2


def _alive_pid() -> int:
    import os

    return os.getpid()


def test_a_fresh_heartbeat_is_never_taken_for_a_dead_worker() -> None:
    """A worker of another PID namespace under the same host name still heartbeats."""
    now = time.time()
    info = WorkerInfo("w", "v1", now, now, hostname=socket.gethostname(), pid=_dead_pid())
    assert why_gone(info, hostname=socket.gethostname(), now=now, heartbeat=5.0) is None
    assert why_gone(info, hostname=socket.gethostname(), now=now + 11, heartbeat=5.0)


async def test_a_holder_killed_a_moment_ago_is_gone_within_two_heartbeats(store: Store) -> None:
    """``toren runs resume`` right after a crash: the holder's process on this host no
    longer exists, but it heartbeated less than two intervals ago. ``gone_in`` says how
    long until it counts as gone (never for a live process or another host), and then
    its run is taken over, without waiting out its lease."""
    now = time.time()
    here = socket.gethostname()
    dead = WorkerInfo("w-killed", "v1", now - 60, now - 0.1, hostname=here, pid=_dead_pid())
    alive = WorkerInfo("w-alive", "v1", now - 60, now - 0.1, hostname=here, pid=_alive_pid())
    far = WorkerInfo("w-far", "v1", now - 60, now - 0.1, hostname="far-away", pid=4242)
    runs = {info.id: await _held_by(store, info) for info in (dead, alive, far)}
    heartbeat = 0.5
    soon = await gone_in(store, "w-killed", now=now, heartbeat=heartbeat)
    assert soon is not None and 0.8 <= soon <= 2 * heartbeat
    assert await gone_in(store, "w-alive", now=now, heartbeat=heartbeat) is None
    assert await gone_in(store, "w-far", now=now, heartbeat=heartbeat) is None
    assert await gone_in(store, "w-nobody", now=now, heartbeat=heartbeat) is None
    assert await take_over_gone(store, me="me", now=now, heartbeat=heartbeat) == []
    later = now + soon + 0.01
    assert await gone_in(store, "w-killed", now=later, heartbeat=heartbeat) == 0.0
    freed = await take_over_gone(store, me="me", now=later, heartbeat=heartbeat)
    assert [wid for wid, _ in freed] == ["w-killed"]
    for wid, run_id in runs.items():  # the killed one's lease ends now, the others hold
        row = await store.get_run(run_id)
        assert row is not None and row.lease_expires_at is not None
        assert (float(row.lease_expires_at) <= later) == (wid == "w-killed")
