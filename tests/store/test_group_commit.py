"""Group commit: the steps of many runs requested in the same turn of the event loop are
committed together (SQLite: one transaction, a savepoint each; PostgreSQL: one statement),
yet each run learns its own outcome: a stale lease or a conflicting copy fails that run's
step alone, nothing of it is written, and every other run's step lands whole and in order.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import toren
from tests.store.steps import value_event
from toren.core.contract.digest import message_hash
from toren.core.contract.events import ValueRecorded
from toren.errors import LeaseLost
from toren.store import Store
from toren.store.base import Lease, RunDelta


async def _idle(ctx: toren.Context, input: Any) -> Any:
    return None


async def _values(store: Store, run_id: str) -> list[tuple[int, Any]]:
    return [
        (e.seq, e.payload.value)
        for e in await store.load_events(run_id)
        if isinstance(e.payload, ValueRecorded)
    ]


@pytest.mark.parametrize("with_clash", [False, True], ids=["stale-lease", "stale-and-clash"])
async def test_a_batch_of_steps_keeps_each_runs_own_outcome(store: Store, with_clash: bool) -> None:
    reg = toren.Registry()
    reg.add("idle", _idle)
    runs = [(await toren.start_run(store, reg, "idle", {"i": i})).id for i in range(6)]
    now = time.time()
    leases = {lease.run_id: lease for lease in await store.claim("w1", 6, now=now, ttl=60)}
    assert set(leases) == set(runs)
    stale, clash, *good = runs
    if with_clash:  # the clashing run already has its step 0 (another worker's copy)
        await store.append(leases[clash], [value_event(clash, 0, "theirs")], now=now)

    bodies = {run_id: f'{{"content":"hello {run_id}","role":"user"}}' for run_id in runs}
    keys = {run_id: message_hash({"role": "user", "content": f"hello {run_id}"}) for run_id in runs}

    # A body every run sends (a shared system prompt): the stale run, first in the batch,
    # sends it too, and must not take it down with its own rejected step.
    shared = {
        message_hash(
            {"role": "system", "content": "shared"}
        ): '{"content":"shared","role":"system"}'
    }

    def step(run_id: str) -> Any:
        if run_id == stale:
            lease = leases[run_id]
            old = Lease(run_id, lease.worker_id, lease.epoch - 1)
            return store.append(old, [value_event(run_id, 0, 1)], blobs=shared, now=now)
        if run_id == clash and with_clash:
            return store.append(leases[run_id], [value_event(run_id, 0, "mine")], now=now)
        delta = RunDelta(steps=2, input_tokens=7) if run_id == good[0] else None
        return store.append(
            leases[run_id],
            [value_event(run_id, 0, "a"), value_event(run_id, 1, "b")],
            blobs={keys[run_id]: bodies[run_id], **shared},
            delta=delta,
            now=now,
        )

    # Started together: every append is requested in the same turn of the loop.
    results = await asyncio.gather(*(step(r) for r in runs), return_exceptions=True)
    outcome = dict(zip(runs, results, strict=True))

    assert isinstance(outcome[stale], LeaseLost)
    assert await _values(store, stale) == []
    if with_clash:
        assert isinstance(outcome[clash], LeaseLost)
        assert [v for _, v in await _values(store, clash)] == ["theirs"]
    else:
        good.append(clash)
        # PostgreSQL: one statement carried every run's step (the stale one wrote nothing).
        assert getattr(store, "batched_steps", len(runs)) == len(runs)

    for run_id in good:
        stored = outcome[run_id]
        assert isinstance(stored, list), stored
        assert [e.position for e in stored] == [0, 1]
        assert stored[0].seq < stored[1].seq  # in order, as a lone append
        assert await _values(store, run_id) == [(e.seq, e.payload.value) for e in stored]  # type: ignore[attr-defined]
        assert await store.get_blobs([keys[run_id]]) != {}
    assert set(await store.get_blobs(list(shared))) == set(shared)
    record = await store.get_run(good[0])
    assert record is not None and record.steps == 2 and record.input_tokens == 7
