"""Concurrency keys on both databases: at most `limit` runs of a key run or wait at once,
the others wait `queued` with their reason and place, start by priority then in order,
and a start's conflict policy (enqueue, reject, cancel_previous) does what it says."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import toren
from toren.config import LeaseSettings
from toren.core.contract.flow import Concurrency, parse_key
from toren.core.drivers.runs import start
from toren.errors import ConcurrencyConflict, InvalidInput
from toren.store import Store


def settings() -> toren.Settings:
    return toren.Settings(lease=LeaseSettings(ttl=2.0, heartbeat=0.1), poll_interval=0.05)


async def ticket(ctx: toren.Context, input: Any) -> Any:
    """Holds its slot while it waits for a person's answer."""
    return {"answer": await ctx.wait_for_message("done")}


def registry(concurrency: Concurrency | None) -> toren.Registry:
    reg = toren.Registry()
    reg.add("ticket", ticket, concurrency=concurrency)
    return reg


def test_a_key_is_the_value_at_its_path() -> None:
    by_customer = Concurrency(limit=2, key=parse_key("input.customer.id"))
    assert by_customer.key_for("t", "main", {"customer": {"id": 42}}) == "t/main:42"
    assert by_customer.key_for("t", "main", {"customer": {"id": "c-7"}}) == "t/main:c-7"
    assert by_customer.key_for("t", "main", {"other": 1}) == "t/main:<missing>"
    assert Concurrency(limit=1).key_for("t", "main", {"customer": 1}) == "t/main"
    for bad in ("customer_id", "input.", "input..a", "inputs.a"):
        with pytest.raises(ValueError, match="a path into the run's input"):
            parse_key(bad)


async def _statuses(store: Store, ids: list[str]) -> list[str]:
    return [(await store.get_run(i)).status for i in ids]  # type: ignore[union-attr]


async def _settle(store: Store, ids: list[str], expected: list[str]) -> None:
    """Poll until the runs have the ``expected`` statuses (a bound against a hang)."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        statuses = await _statuses(store, ids)
        if statuses == expected:
            return
        assert asyncio.get_running_loop().time() < deadline, statuses
        await asyncio.sleep(0.05)


async def test_at_most_the_limit_of_a_key_holds_a_slot(store: Store) -> None:
    reg = registry(Concurrency(limit=2, key=("customer",)))
    a = [
        (await toren.start_run(store, reg, "ticket", {"customer": "a", "n": i})).id
        for i in range(4)
    ]
    b = [
        (await toren.start_run(store, reg, "ticket", {"customer": "b", "n": i})).id
        for i in range(3)
    ]
    deps = toren.TickDeps(store=store, agents=reg, settings=settings())
    async with toren.LocalWorkerRuntime(deps, concurrency=50):
        # FIFO per key, two of each key at once.
        await _settle(
            store,
            a + b,
            ["waiting", "waiting", "queued", "queued"] + ["waiting", "waiting", "queued"],
        )
        # A queued run says why it waits, and where it stands.
        third = await store.get_run(a[2])
        assert third is not None
        place = await store.queued_because(third)
        assert place is not None and (place.key, place.limit, place.holding, place.position) == (
            "ticket/main:a",
            2,
            2,
            1,
        )
        assert "at its limit of 2" in place.reason()
        assert (await store.queued_because(await store.get_run(a[3]))).position == 2  # type: ignore[arg-type, union-attr]
        # One run of key a ends: the next of key a starts (and key b is untouched).
        await toren.send_message(store, a[0], "done", "ok")
        await _settle(
            store,
            a + b,
            ["completed", "waiting", "waiting", "queued"] + ["waiting", "waiting", "queued"],
        )
        # Nothing else moves: still two of each key.
        await asyncio.sleep(0)
        assert (await _statuses(store, a + b)).count("waiting") == 4


async def test_priority_first_then_order(store: Store) -> None:
    reg = registry(None)
    first = await start(store, reg, "ticket", {}, concurrency_key="desk", concurrency_limit=1)
    low = await start(store, reg, "ticket", {}, concurrency_key="desk", concurrency_limit=1)
    high = await start(
        store, reg, "ticket", {}, concurrency_key="desk", concurrency_limit=1, priority=5
    )
    ids = [first.run.id, low.run.id, high.run.id]
    deps = toren.TickDeps(store=store, agents=reg, settings=settings())
    async with toren.LocalWorkerRuntime(deps, concurrency=50):
        await _settle(store, ids, ["queued", "queued", "waiting"])  # priority 5 first
        await toren.send_message(store, ids[2], "done", 1)
        await _settle(store, ids, ["waiting", "queued", "completed"])  # then in order
        await toren.send_message(store, ids[0], "done", 1)
        await _settle(store, ids, ["completed", "waiting", "completed"])


async def test_a_start_key_needs_a_limit(store: Store) -> None:
    reg = registry(None)
    with pytest.raises(InvalidInput, match="must give its limit too"):
        await start(store, reg, "ticket", {}, concurrency_key="desk")
    with pytest.raises(InvalidInput, match="1 to 1000000"):
        await start(store, reg, "ticket", {}, concurrency_key="d", concurrency_limit=0)


async def test_on_conflict_reject_and_cancel_previous(store: Store) -> None:
    reject = registry(Concurrency(limit=5, key=("ticket",), on_conflict="reject"))
    first = await toren.start_run(store, reject, "ticket", {"ticket": "T-1"})
    with pytest.raises(ConcurrencyConflict, match="T-1") as refused:
        await toren.start_run(store, reject, "ticket", {"ticket": "T-1"})
    assert refused.value.runs == [first.id]
    other = await toren.start_run(store, reject, "ticket", {"ticket": "T-2"})  # another key
    assert other.status == "queued"

    cancel = registry(Concurrency(limit=1, key=("ticket",), on_conflict="cancel_previous"))
    again = await toren.start_run(store, cancel, "ticket", {"ticket": "T-1"})
    before = await store.get_run(first.id)
    assert before is not None and before.cancel_requested
    assert again.status == "queued"


async def test_a_deploy_changes_or_removes_the_limit_of_queued_runs(store: Store) -> None:
    """A new code version with another limit applies it to the runs still queued, without
    restarting anything; one that no longer declares a limit releases them."""
    v1 = registry(Concurrency(limit=1))
    ids = [(await toren.start_run(store, v1, "ticket", {"n": i})).id for i in range(5)]
    async with toren.LocalWorkerRuntime(
        toren.TickDeps(store=store, agents=v1, settings=settings())
    ):
        await _settle(store, ids, ["waiting"] + ["queued"] * 4)
    v2 = toren.Registry()
    v2.add("ticket", ticket, code_version="v2", concurrency=Concurrency(limit=3))
    async with toren.LocalWorkerRuntime(
        toren.TickDeps(store=store, agents=v2, settings=settings())
    ):
        await _settle(store, ids, ["waiting"] * 3 + ["queued"] * 2)
        queued = await store.get_run(ids[3])
        assert queued is not None and queued.concurrency_limit == 3
    v3 = toren.Registry()
    v3.add("ticket", ticket, code_version="v3")
    async with toren.LocalWorkerRuntime(
        toren.TickDeps(store=store, agents=v3, settings=settings())
    ):
        await _settle(store, ids, ["waiting"] * 5)


async def test_keys_at_their_limit_do_not_starve_the_others(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More full keys than one claim looks at: a key with room further on still starts."""
    from toren.store import flow

    monkeypatch.setattr(flow, "KEYS", 2)
    reg = registry(Concurrency(limit=1, key=("customer",)))
    full = []
    for c in ("a", "b", "c"):  # each: one holder (waiting), one queued behind it
        full.append((await toren.start_run(store, reg, "ticket", {"customer": c})).id)
    deps = toren.TickDeps(store=store, agents=reg, settings=settings())
    async with toren.LocalWorkerRuntime(deps, concurrency=50):
        await _settle(store, full, ["waiting"] * 3)
        behind = [(await toren.start_run(store, reg, "ticket", {"customer": c})).id for c in "abc"]
        late = (await toren.start_run(store, reg, "ticket", {"customer": "z"})).id
        await _settle(store, [*behind, late], ["queued"] * 3 + ["waiting"])


async def test_cancelling_a_queued_run_of_a_full_key_ends_it(store: Store) -> None:
    reg = registry(Concurrency(limit=1))
    holder = (await toren.start_run(store, reg, "ticket", {})).id
    queued = (await toren.start_run(store, reg, "ticket", {})).id
    deps = toren.TickDeps(store=store, agents=reg, settings=settings())
    async with toren.LocalWorkerRuntime(deps, concurrency=50):
        await _settle(store, [holder, queued], ["waiting", "queued"])
        await store.request_cancel(queued, now=0.0)
        await _settle(store, [holder, queued], ["waiting", "cancelled"])
