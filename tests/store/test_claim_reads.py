"""A claim reads what the tick needs of each run it leases, in its own statement
(``Lease.record``, ``Lease.last_seq``): the tick does not read the row again, and a kept
tick (the sticky cache) learns whether the log grew without reading it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import toren
from toren.errors import CorruptRow
from toren.store import Store
from toren.store.sqlite import SQLiteStore


async def _waiter(ctx: toren.Context, input: Any) -> Any:
    return await ctx.wait_for_message("go")


def _registry() -> toren.Registry:
    reg = toren.Registry()
    reg.add("waiter", _waiter)
    return reg


async def _sql(store: Store, sql: str, params: tuple[Any, ...]) -> None:
    await store._run(lambda cur: store._x(cur, sql, params))  # type: ignore[attr-defined]


async def test_a_claim_reads_the_row_as_it_left_it_and_the_last_seq(store: Store) -> None:
    reg = _registry()
    deps = toren.TickDeps(store=store, agents=reg)
    parked = await toren.start_run(store, reg, "waiter", {"q": "parked"})
    assert (await toren.tick(parked.id, deps)).status == "waiting"
    await toren.send_message(store, parked.id, "go", "yes")
    queued = await toren.start_run(store, reg, "waiter", {"q": "queued"})

    leases = await store.claim("w1", 10, now=toren.SystemClock().now(), ttl=30)
    assert {lease.run_id for lease in leases} == {parked.id, queued.id}
    for lease in leases:
        row = await store.get_run(lease.run_id)
        assert lease.record == row  # every column, as a read after the claim sees it
        assert row is not None and row.status == "running" and row.lease_owner == "w1"
        assert row.lease_epoch == lease.epoch
        seqs = [e.seq for e in await store.load_events(lease.run_id)]
        assert lease.last_seq == max(seqs)
    by_id = {lease.run_id: lease for lease in leases}
    assert by_id[parked.id].previous_status == "waiting"
    assert by_id[queued.id].previous_status == "queued"


async def test_a_row_that_cannot_be_read_holds_up_its_run_not_the_claim(store: Store) -> None:
    """The claim leases the run all the same, without its row (the tick reads it again
    and stops there, naming the column, as tests/store/test_corrupt_rows.py shows)."""
    reg = _registry()
    broken = await toren.start_run(store, reg, "waiter", {"q": 1})
    sound = await toren.start_run(store, reg, "waiter", {"q": 2})
    await _sql(store, "UPDATE runs SET input = ? WHERE id = ?", ("{broken", broken.id))

    leases = await store.claim("w1", 10, now=toren.SystemClock().now(), ttl=30)
    by_id = {lease.run_id: lease for lease in leases}
    assert set(by_id) == {broken.id, sound.id}
    assert by_id[broken.id].record is None and by_id[broken.id].last_seq is not None
    assert by_id[sound.id].record is not None and by_id[sound.id].record.input == {"q": 2}


async def test_a_large_input_stays_in_the_database_until_its_tick_reads_it(store: Store) -> None:
    """A claim of many runs must not read all their inputs at once (100 runs of 1 MB
    would be 100 MB in one statement): past ``CLAIMED_INPUT`` the row is left out and the
    tick reads it, whole, itself."""
    from toren.store.sql import CLAIMED_INPUT

    reg = _registry()
    deps = toren.TickDeps(store=store, agents=reg)
    large = await toren.start_run(store, reg, "waiter", {"text": "x" * CLAIMED_INPUT})
    small = await toren.start_run(store, reg, "waiter", {"text": "x" * 100})
    leases = await store.claim("w1", 10, now=toren.SystemClock().now(), ttl=30)
    by_id = {lease.run_id: lease for lease in leases}
    assert by_id[large.id].record is None and by_id[large.id].last_seq is not None
    assert by_id[small.id].record is not None
    assert by_id[small.id].record.input == {"text": "x" * 100}
    result = await toren.tick(large.id, deps, lease=by_id[large.id])
    assert result.status == "waiting"
    row = await store.get_run(large.id)
    assert row is not None and row.input == {"text": "x" * CLAIMED_INPUT}


async def test_a_tick_restarted_after_a_database_failure_reads_the_row_again(
    store: Store, monkeypatch: Any
) -> None:
    """A worker whose tick failed on the database (its lease still held) runs the run
    again under the same lease. The failed attempt had already added steps and tokens to
    the row; started from the row the claim read, the new tick would add them again (a
    tick corrects the row's totals from the log against the row it starts with)."""
    import asyncio
    import time

    from toren.errors import StorageError
    from toren.providers.scripted import ScriptedProvider

    async def agent(ctx: toren.Context, input: Any) -> Any:
        messages: list[dict[str, Any]] = [{"role": "system", "content": "count"}]
        for i in range(6):
            messages.append({"role": "user", "content": f"step {i}"})
            messages.append((await ctx.model("scripted:echo", messages)).message())
        return {"ok": True}

    reg = toren.Registry()
    reg.add("counter", agent)
    real_append = store.append
    calls = 0

    async def append(*args: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 4:  # the database fails under the fourth write, once
            raise StorageError("the database went away")
        return await real_append(*args, **kw)

    async def block(*args: Any, **kw: Any) -> Any:
        raise StorageError("the database went away")  # so recording the failure fails too

    monkeypatch.setattr(store, "append", append)
    monkeypatch.setattr(store, "block", block)
    deps = toren.TickDeps(store=store, agents=reg, providers={"scripted": ScriptedProvider()})
    run = await toren.start_run(store, reg, "counter", {})
    async with toren.LocalWorkerRuntime(deps):
        deadline = time.monotonic() + 30
        while (row := await store.get_run(run.id)) is None or row.status != "completed":
            assert time.monotonic() < deadline, "the run did not complete"
            await asyncio.sleep(0.01)
    assert calls > 4  # the failure happened, and the run went on after it
    events = await store.load_events(run.id)
    model_calls = [e.payload for e in events if e.type == "ModelCallRecorded"]
    assert row.steps == len(model_calls) == 6
    assert row.input_tokens == sum(p.input_tokens for p in model_calls)  # type: ignore[attr-defined]
    assert row.output_tokens == sum(p.output_tokens for p in model_calls)  # type: ignore[attr-defined]


async def test_a_claim_reads_the_oldest_message_of_the_inbox(store: Store) -> None:
    """``Lease.message``: the inbox's oldest unconsumed message, of any name, as the
    store's own read gives it; None for a run with an empty inbox. ``Lease.unread``: how
    many unconsumed messages, counted up to 2."""
    reg = _registry()
    deps = toren.TickDeps(store=store, agents=reg)
    parked = await toren.start_run(store, reg, "waiter", {"q": "parked"})
    assert (await toren.tick(parked.id, deps)).status == "waiting"
    first = await store.send_message(parked.id, "other", {"n": 1}, now=1.0)
    await store.send_message(parked.id, "go", {"n": 2}, now=2.0)
    await store.send_message(parked.id, "go", {"n": 3}, now=3.0)
    empty = await toren.start_run(store, reg, "waiter", {"q": "empty"})
    one = await toren.start_run(store, reg, "waiter", {"q": "one"})
    await store.send_message(one.id, "go", {"n": 4}, now=4.0)

    leases = await store.claim("w1", 10, now=toren.SystemClock().now(), ttl=30)
    by_id = {lease.run_id: lease for lease in leases}
    assert by_id[empty.id].message is None
    assert [by_id[r.id].unread for r in (empty, one, parked)] == [0, 1, 2]
    message = by_id[parked.id].message
    assert message is not None
    assert message == await store.next_message(parked.id, ["other", "go"])
    assert (message.id, message.name, message.payload, message.created_at) == (
        first,
        "other",
        {"n": 1},
        1.0,
    )


async def test_a_claim_leaves_out_a_consumed_message(store: Store) -> None:
    async def twice(ctx: toren.Context, input: Any) -> Any:
        return [await ctx.wait_for_message("go"), await ctx.wait_for_message("go")]

    reg = toren.Registry()
    reg.add("twice", twice)
    deps = toren.TickDeps(store=store, agents=reg)
    run = await toren.start_run(store, reg, "twice", {})
    await store.send_message(run.id, "go", "first", now=1.0)
    assert (await toren.tick(run.id, deps)).status == "waiting"  # took the first
    second = await store.send_message(run.id, "go", "second", now=2.0)
    (lease,) = await store.claim("w1", 10, now=toren.SystemClock().now(), ttl=30)
    assert lease.message is not None and lease.message.id == second
    done = await toren.tick(run.id, deps, lease=lease)
    assert done.status == "completed" and done.output == ["first", "second"]


async def test_a_large_or_unreadable_message_is_left_to_the_wait(store: Store) -> None:
    """Past ``CLAIMED_INPUT``, or not readable, the message is left out of the lease (the
    claim of many runs must not read many large messages at once; a bad row must not
    hold up the claim): the wait reads it itself, and meets the error there."""
    from toren.store.sql import CLAIMED_INPUT

    reg = _registry()
    deps = toren.TickDeps(store=store, agents=reg)
    large = await toren.start_run(store, reg, "waiter", {})
    await store.send_message(large.id, "go", "x" * CLAIMED_INPUT, now=1.0)
    broken = await toren.start_run(store, reg, "waiter", {})
    bad = await store.send_message(broken.id, "go", "fine", now=1.0)
    await _sql(store, "UPDATE inbox SET payload = ? WHERE id = ?", ("{broken", bad))

    leases = await store.claim("w1", 10, now=toren.SystemClock().now(), ttl=30)
    by_id = {lease.run_id: lease for lease in leases}
    assert set(by_id) == {large.id, broken.id}
    assert by_id[large.id].message is None and by_id[broken.id].message is None
    assert by_id[broken.id].record is not None  # the row itself is fine
    done = await toren.tick(large.id, deps, lease=by_id[large.id])
    assert done.status == "completed" and done.output == "x" * CLAIMED_INPUT
    stopped = await toren.tick(broken.id, deps, lease=by_id[broken.id])
    assert stopped.status == "error" and stopped.error is not None
    assert "inbox" in stopped.error["message"] and "payload" in stopped.error["message"]


@pytest.mark.parametrize("column", ["input", "name", "payload"])
async def test_text_that_is_not_utf8_holds_up_its_run_not_the_claim(
    tmp_path: Path, column: str
) -> None:
    """SQLite keeps whatever bytes it is given as text, and reading them back as text
    fails (PostgreSQL refuses them on the way in). A run's input or its oldest message's
    name or payload that is not UTF-8 used to fail every claim, and every worker's claims
    with it: the claim now leases that run without them, and its tick stops on the bad
    column, naming it, while the other runs go on."""
    store = SQLiteStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    await store.migrate()
    try:
        await _not_utf8(store, column)
    finally:
        await store.close()


async def _not_utf8(store: Store, column: str) -> None:
    reg = _registry()
    deps = toren.TickDeps(store=store, agents=reg)
    broken = await toren.start_run(store, reg, "waiter", {"q": 1})
    sound = await toren.start_run(store, reg, "waiter", {"q": 2})
    await toren.send_message(store, sound.id, "go", "yes")
    if column == "input":
        await _sql(store, "UPDATE runs SET input = CAST(x'ff' AS TEXT) WHERE id = ?", (broken.id,))
    else:
        bad = await store.send_message(broken.id, "go", "fine", now=1.0)
        await _sql(store, f"UPDATE inbox SET {column} = CAST(x'ff' AS TEXT) WHERE id = ?", (bad,))

    leases = await store.claim("w1", 10, now=toren.SystemClock().now(), ttl=30)
    by_id = {lease.run_id: lease for lease in leases}
    assert set(by_id) == {broken.id, sound.id}
    assert by_id[broken.id].record is None and by_id[broken.id].message is None
    assert by_id[broken.id].last_seq is not None
    assert by_id[sound.id].message is not None and by_id[sound.id].message.payload == "yes"
    done = await toren.tick(sound.id, deps, lease=by_id[sound.id])
    assert done.status == "completed" and done.output == "yes"
    if column == "name":  # a message of no name the run waits for: it waits on
        parked = await toren.tick(broken.id, deps, lease=by_id[broken.id])
        assert parked.status == "waiting"
        assert await store.claim("w1", 10, now=toren.SystemClock().now(), ttl=30) == []
        return
    if column == "input":  # the row itself: a corrupt row, left for a repair
        with pytest.raises(CorruptRow) as info:
            await toren.tick(broken.id, deps, lease=by_id[broken.id])
        assert info.value.details == {"column": "input"}
        reason = error = info.value.message
    else:  # in the agent's wait: the run is given back blocked, with the reason
        stopped = await toren.tick(broken.id, deps, lease=by_id[broken.id])
        assert stopped.status == "error" and stopped.error is not None
        assert stopped.error["code"] == "corrupt_row" and stopped.not_before is not None
        row = await store.get_run(broken.id)
        assert row is not None and row.blocked_error is not None
        assert row.blocked_error["code"] == "corrupt_row"
        reason, error = stopped.error["message"], stopped.error
    assert f"the {column} column" in reason and "not UTF-8" in reason
    assert "\ufffd" not in str(error)  # nor the text itself, which may hold a secret
