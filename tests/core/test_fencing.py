"""Fencing before effects, in process: the gate before a live step and the epoch-fenced
renewal it uses (the real-process scenarios are in test_stalled_worker.py)."""

from __future__ import annotations

from typing import Any

import toren
from toren.config import LeaseSettings
from toren.core.agent_api.program import ToolDef
from toren.core.drivers.fencing import LeaseFence, lease_clock
from toren.core.drivers.tick import TickRunner
from toren.providers.base import ToolSpec
from toren.store.base import Lease, Store

SETTINGS = toren.Settings(lease=LeaseSettings(ttl=30.0, heartbeat=5.0))


def mailer(sent: list[str]) -> toren.Registry:
    async def send(to: str) -> str:
        sent.append(to)
        return "ok"

    async def main(ctx: toren.Context, input: Any) -> Any:
        return await ctx.tool("send", {"to": input["to"]})

    reg = toren.Registry()
    reg.add("m", main, tools={"send": ToolDef("send", send, ToolSpec("send"))})
    return reg


async def test_renew_lease_is_fenced_by_epoch(store: Store) -> None:
    reg = mailer([])
    run = await toren.start_run(store, reg, "m", {"to": "a"})
    [old] = await store.claim("w1", 1, now=100.0, ttl=30)
    assert await store.renew_lease(old, expires_at=200.0)
    # The lease ran out and the same worker claimed the run again: a new epoch.
    [new] = await store.claim("w1", 1, now=300.0, ttl=30)
    assert new.epoch == old.epoch + 1
    assert not await store.renew_lease(old, expires_at=400.0)
    assert await store.renew_lease(new, expires_at=400.0)
    row = await store.get_run(run.id)
    assert row is not None and row.lease_expires_at == 400.0
    # Another worker's claim: neither of w1's leases renews.
    [other] = await store.claim("w2", 1, now=500.0, ttl=30)
    assert not await store.renew_lease(new, expires_at=600.0)
    assert other.worker_id == "w2" and await store.renew_lease(other, expires_at=600.0)


async def test_a_late_renewal_never_moves_an_expiry_earlier(store: Store) -> None:
    """A heartbeat's renewal names runs by owner, not by lease: one that lands after the
    same worker released the run and claimed it again (a delayed statement) must not cut
    the new lease short of the deadline its tick counts from the claim."""
    reg = mailer([])
    run = await toren.start_run(store, reg, "m", {"to": "a"})
    [lease] = await store.claim("w1", 1, now=100.0, ttl=30)
    assert await store.renew(lease.worker_id, [run.id], expires_at=200.0) == ({run.id}, set())
    row = await store.get_run(run.id)
    assert row is not None and row.lease_expires_at == 200.0
    # The late one, sent before the renewal above: held still, the expiry kept.
    assert await store.renew(lease.worker_id, [run.id], expires_at=150.0) == ({run.id}, set())
    row = await store.get_run(run.id)
    assert row is not None and row.lease_expires_at == 200.0
    assert await store.renew(lease.worker_id, [run.id], expires_at=250.0) == ({run.id}, set())
    row = await store.get_run(run.id)
    assert row is not None and row.lease_expires_at == 250.0


async def test_a_tick_past_its_deadline_stops_before_the_effect(store: Store) -> None:
    sent: list[str] = []
    reg = mailer(sent)
    deps = toren.TickDeps(store=store, agents=reg, settings=SETTINGS, worker_id="w1")
    run = await toren.start_run(store, reg, "m", {"to": "a"})
    now = deps.clock.now()
    [stale] = await store.claim("w1", 1, now=now - 100, ttl=30)  # expired long ago
    [taken] = await store.claim("w2", 1, now=now, ttl=30)
    # w1 "thaws": its local deadline passed while it was frozen.
    runner = TickRunner(deps, stale, granted_at=lease_clock() - 100)
    result = await runner.run()
    assert result.status == "lease_lost" and sent == []
    assert "stalled past its lease" in (result.error or {}).get("message", "")
    assert [e.type for e in await store.load_events(run.id)] == ["RunStarted"]
    # The new owner runs the step, once.
    result = await TickRunner(deps, taken, granted_at=lease_clock()).run()
    assert result.status == "completed" and sent == ["a"]


async def test_a_due_lease_still_held_is_renewed_and_the_step_runs(store: Store) -> None:
    sent: list[str] = []
    reg = mailer(sent)
    deps = toren.TickDeps(store=store, agents=reg, settings=SETTINGS, worker_id="w1")
    run = await toren.start_run(store, reg, "m", {"to": "b"})
    now = deps.clock.now()
    [lease] = await store.claim("w1", 1, now=now - 29, ttl=30)  # 1 s left: within the margin
    result = await TickRunner(deps, lease, granted_at=lease_clock() - 29).run()
    assert result.status == "completed" and sent == ["b"]
    row = await store.get_run(run.id)
    assert row is not None and row.lease_owner is None  # released when it finished


def test_the_deadline_counts_from_when_the_claim_was_sent() -> None:
    fence = LeaseFence(Lease("r", "w", 1), ttl=2.0, margin=0.5, granted_at=lease_clock())
    assert not fence.due() and 1.4 < fence.remaining() <= 2.0
    fence.renewed(lease_clock() - 1.8)  # an older renewal never moves the deadline back
    assert not fence.due()
    unknown = LeaseFence(Lease("r", "w", 1), ttl=2.0, margin=0.5, granted_at=None)
    assert unknown.due()  # a lease of unknown age is proven before its first step
    assert SETTINGS.lease.fence_margin == 10.0
    assert LeaseSettings(ttl=2.0, heartbeat=0.5).fence_margin == 2.0 / 3
    assert LeaseSettings(ttl=10.0, heartbeat=4.0).fence_margin == 2.0
    assert LeaseSettings(ttl=2.0, heartbeat=0.5, margin=0.1).fence_margin == 0.1
