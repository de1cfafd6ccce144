"""Retention on both backends: prune deletes finished runs whole (events, inbox, the
message bodies nobody else references) and never touches runs in flight or waiting;
export -> prune -> import restores events and bodies byte for byte; prune is safe while
live workers write."""

from __future__ import annotations

import asyncio
import io
import json
import time
from typing import Any

import pytest

import toren
from toren.config import LeaseSettings, RetentionSettings
from toren.core.drivers.history import load_messages
from toren.errors import InvalidInput
from toren.providers.base import ToolSpec
from toren.providers.scripted import ScriptedProvider
from toren.store import Store
from toren.store.retention import (
    export_runs,
    finished_ids,
    import_runs,
    prune,
    prune_batch,
    sweep_blobs,
)
from toren.store.sql import EVENT_COLUMNS

SYSTEM = {"role": "system", "content": "You answer in one line."}


def chat_agent(steps: int, *, wait: bool = False):
    """A growing conversation (a shared system prompt, a tool spec, per-run messages);
    with ``wait``, it parks on a message before its last step."""

    async def agent(ctx: toren.Context, input: Any) -> Any:
        messages: list[dict[str, Any]] = [SYSTEM]
        tools = [ToolSpec("lookup", "Look a thing up", {"type": "object"})]
        for i in range(steps):
            if wait and i == steps - 1:
                await ctx.wait_for_message("go")
            messages.append({"role": "user", "content": f"{input['who']} asks {i}"})
            reply = await ctx.model("scripted:echo", messages, tools=tools)
            messages.append(reply.message())
        return {"turns": steps}

    return agent


def registry() -> toren.Registry:
    reg = toren.Registry()
    reg.add("chat", chat_agent(4))
    reg.add("parked", chat_agent(3, wait=True))
    return reg


def deps(
    store: Store, reg: toren.Registry, latency: float = 0.0, **settings: Any
) -> toren.TickDeps:
    base = toren.Settings(lease=LeaseSettings(ttl=3.0, heartbeat=0.2), poll_interval=0.05)
    provider = ScriptedProvider({"default": {"text": "ok {last_user}"}, "latency": latency})
    return toren.TickDeps(
        store=store,
        agents=reg,
        providers={"scripted": provider},
        settings=base.with_(**settings),
    )


async def rows(store: Store, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    sql_store: Any = store

    def tx(cur: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in sql_store._x(cur, sql, params).fetchall()]

    result: list[tuple[Any, ...]] = await sql_store._run(tx, write=False)
    return result


async def referenced_bodies(store: Store) -> set[str]:
    """Every body some stored event references (list nodes walked to the end)."""
    found: set[str] = set()
    for (payload,) in await rows(
        store, "SELECT payload FROM events WHERE type = 'ModelCallRecorded'"
    ):
        body = json.loads(payload)
        found.update(body["tools"])
        node = body["message_list"]
        while node is not None:
            found.add(node)
            (text,) = (await rows(store, "SELECT body FROM blobs WHERE hash = ?", (node,)))[0]
            chain = json.loads(text)
            found.update(chain["items"])
            node = chain["prev"]
    return found


async def finished_and_parked(store: Store, reg: toren.Registry, n: int) -> tuple[list[str], str]:
    d = deps(store, reg)
    done = []
    for i in range(n):
        run = await toren.start_run(store, reg, "chat", {"who": f"user{i}"})
        assert (await toren.tick(run.id, d)).status == "completed"
        done.append(run.id)
    # Two finished runs with the same input share every body: nobody else references them.
    twin = await toren.start_run(store, reg, "chat", {"who": "user0"})
    assert (await toren.tick(twin.id, d)).status == "completed"
    done.append(twin.id)
    parked = await toren.start_run(store, reg, "parked", {"who": "someone"})
    assert (await toren.tick(parked.id, d)).status == "waiting"
    return done, parked.id


async def test_export_prune_import_round_trip_is_byte_identical(store: Store) -> None:
    reg = registry()
    finished, parked = await finished_and_parked(store, reg, 3)
    events_sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? ORDER BY seq"
    before_events = {r: await rows(store, events_sql, (r,)) for r in finished}
    all_blobs = dict(await rows(store, "SELECT hash, body FROM blobs"))
    parked_events = await rows(store, events_sql, (parked,))
    assert sum(len(v) for v in before_events.values()) > 20

    archive = io.StringIO()
    ids = finished_ids(store, before=time.time() + 1, statuses=("completed",))
    assert await export_runs(store, ids, archive) == len(finished)

    result = await prune(store, before=time.time() + 1, batch=2)
    assert result.runs == len(finished) and result.batches == 2
    assert result.events == sum(len(v) for v in before_events.values())
    assert await sweep_blobs(store) > 0
    for run_id in finished:
        assert await store.get_run(run_id) is None
        assert await store.load_events(run_id) == []
    # The parked run is untouched, its log whole and every body it references present.
    assert (await store.get_run(parked)).status == "waiting"  # type: ignore[union-attr]
    assert await rows(store, events_sql, (parked,)) == parked_events
    # No body is left that no event references, and none that one does is gone.
    stored = {h for (h,) in await rows(store, "SELECT hash FROM blobs")}
    assert stored == await referenced_bodies(store)
    assert len(stored) < len(all_blobs)

    archive.seek(0)
    imported = await import_runs(store, archive)
    assert imported.runs == len(finished) and not imported.skipped
    for run_id, expected in before_events.items():
        assert await rows(store, events_sql, (run_id,)) == expected
        # The chain came back with the events (an `events` column since 0.2): it holds.
        report = await toren.verify_run(store, run_id)
        assert report.ok and report.chain.linked == len(expected), report.to_dict()
    restored = dict(await rows(store, "SELECT hash, body FROM blobs"))
    assert {h: all_blobs[h] for h in restored} == restored
    assert set(restored) == set(all_blobs)
    # The restored logs read back whole: every model call's messages are there.
    for event in await store.load_events(finished[0]):
        if event.type == "ModelCallRecorded":
            messages = await load_messages(store, event.payload.message_list)  # type: ignore[attr-defined]
            assert messages[0] == SYSTEM

    # Importing again skips what is there.
    archive.seek(0)
    again = await import_runs(store, archive)
    assert again.runs == 0 and len(again.skipped) == len(finished)

    # The parked run still finishes, its bodies intact, new steps store theirs.
    await store.send_message(parked, "go", None, now=time.time())
    assert (await toren.tick(parked, deps(store, reg))).status == "completed"


async def test_prune_touches_only_finished_runs_older_than_the_cutoff(store: Store) -> None:
    reg = registry()
    finished, parked = await finished_and_parked(store, reg, 2)
    queued = await toren.start_run(store, reg, "chat", {"who": "later"})
    # Nothing finished before an hour ago.
    assert (await prune_batch(store, before=time.time() - 3600)).runs == 0
    # Only failed runs asked for: none.
    assert (await prune_batch(store, before=time.time() + 1, statuses=("failed",))).runs == 0
    with pytest.raises(InvalidInput, match="'waiting' cannot be pruned"):
        await prune_batch(store, before=time.time() + 1, statuses=("waiting",))
    done = await prune_batch(store, before=time.time() + 1, limit=1000)
    assert sorted(done.run_ids) == sorted(finished)
    assert (await store.get_run(parked)) is not None
    assert (await store.get_run(queued.id)) is not None


async def test_import_rejects_what_is_not_an_export(store: Store) -> None:
    with pytest.raises(InvalidInput, match="not a toren export header"):
        await import_runs(store, ['{"type": "run"}'])
    with pytest.raises(InvalidInput, match="line 2 is not JSON"):
        await import_runs(store, ['{"toren_export": 1}', "{nope"])
    # A column holds what a column can (text, a number, null); nothing reaches the store
    # otherwise, and the error names the line and the column.
    nested = json.dumps({"type": "run", "row": {"id": "run_x", "input": {"a": 1}}})
    with pytest.raises(InvalidInput, match="line 2: column 'input' of the run record holds dict"):
        await import_runs(store, ['{"toren_export": 1}', nested])
    assert await store.get_run("run_x") is None
    seqless = json.dumps({"type": "event", "row": {"run_id": "run_x"}})
    run = json.dumps({"type": "run", "row": {"id": "run_x"}})
    with pytest.raises(InvalidInput, match="line 3: the event record has no 'seq'"):
        await import_runs(store, ['{"toren_export": 1}', run, seqless])


async def test_prune_while_live_workers_write(db_url: str) -> None:
    """Two workers step live runs (sharing the system prompt and tool spec with the runs
    being pruned) while prune deletes finished ones in small batches: every live run
    completes with its whole log readable, nothing live is touched."""
    reg = registry()
    held = asyncio.Event()
    waiting: list[str] = []

    async def gated(ctx: toren.Context, input: Any) -> Any:
        messages: list[dict[str, Any]] = [SYSTEM]
        tools = [ToolSpec("lookup", "Look a thing up", {"type": "object"})]
        for i in range(12):
            if i == 6:
                await ctx.tool("hold", {})
            messages.append({"role": "user", "content": f"{input['who']} asks {i}"})
            messages.append((await ctx.model("scripted:echo", messages, tools=tools)).message())
        return {"turns": 12}

    async def hold() -> str:
        waiting.append("x")
        await held.wait()
        return "released"

    reg.add("long", gated, tools={"hold": toren.ToolDef("hold", hold, ToolSpec("hold"))})
    setup = await toren.connect(db_url)
    try:
        finished, parked = await finished_and_parked(setup, reg, 30)
    finally:
        await setup.close()

    stores = [await toren.connect(db_url) for _ in range(3)]
    pruner = stores[2]
    workers = [
        toren.LocalWorkerRuntime(deps(s, reg, latency=0.02), concurrency=20) for s in stores[:2]
    ]
    cutoff = time.time()  # the live runs below finish after it: never pruned
    try:
        for w in workers:
            await w.start()
        live = [
            (await toren.start_run(stores[0], reg, "long", {"who": f"live{i}"})).id
            for i in range(30)
        ]
        # Every live run is mid-way (six steps written, holding its lease); released, they
        # all write their next six steps while the prune below runs.
        deadline = time.monotonic() + 60
        while len(waiting) < len(live) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert len(waiting) == len(live)
        held.set()
        pruned = 0
        while pruned < len(finished):
            done = await prune_batch(pruner, before=cutoff, limit=1)
            pruned += done.runs
            assert set(done.run_ids) <= set(finished)
        await sweep_blobs(pruner)
        finals = [await toren.wait_for_run(pruner, r, timeout=120) for r in live]
        assert [f.status for f in finals] == ["completed"] * len(live)
    finally:
        for w in workers:
            await w.stop()
        for s in stores[:2]:
            await s.close()
    try:
        assert (await pruner.get_run(parked)).status == "waiting"  # type: ignore[union-attr]
        for run_id in finished:
            assert await pruner.get_run(run_id) is None
        for run_id in [*live, parked]:
            for event in await pruner.load_events(run_id):
                if event.type == "ModelCallRecorded":
                    await load_messages(pruner, event.payload.message_list)  # type: ignore[attr-defined]
        stored = {h for (h,) in await rows(pruner, "SELECT hash FROM blobs")}
        assert stored >= await referenced_bodies(pruner)
    finally:
        await pruner.close()


async def test_a_worker_prunes_with_the_retention_setting(store: Store) -> None:
    reg = registry()
    finished, parked = await finished_and_parked(store, reg, 5)
    settings = {"retention": RetentionSettings(finished_after=0.0, batch=2, pause=0.01)}
    async with toren.LocalWorkerRuntime(deps(store, reg, **settings)) as worker:
        deadline = time.monotonic() + 30
        while worker.metrics.pruned_runs < len(finished) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert worker.metrics.pruned_runs == len(finished)
    assert (await store.get_run(parked)) is not None


async def test_a_body_stored_again_by_another_run_outlives_its_first_writer(
    store: Store,
) -> None:
    """The race prune must not lose: a live run stores a body that a pruned run stored
    first (the same system prompt), at the moment that run is pruned. The store counts
    the second writer, and prune deletes only bodies nobody else stored."""
    reg = registry()
    finished, _ = await finished_and_parked(store, reg, 2)
    owned = await rows(  # finished[1] asks what no other run asks
        store, "SELECT hash, body FROM blobs WHERE run_id = ? AND shares = 0", (finished[1],)
    )
    assert owned
    h, body = owned[0]
    sql_store: Any = store
    from toren.store.sql import insert_blobs_sql

    # A live run's step stores the same body (what the engine's append does).
    await sql_store._run(
        lambda cur: sql_store._x(cur, insert_blobs_sql(1), (h, body, len(body), "run_live"))
    )
    await prune(store, before=time.time() + 1)
    assert await rows(store, "SELECT hash FROM blobs WHERE hash = ?", (h,)) == [(h,)]


async def test_a_worker_keeps_a_bounded_number_of_tick_results(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that ticks runs for a month must not keep every run's result."""
    from toren.core.drivers import worker as worker_module

    monkeypatch.setattr(worker_module, "RESULTS_KEPT", 2)
    reg = registry()
    async with toren.LocalWorkerRuntime(deps(store, reg)) as worker:
        runs = [await toren.start_run(store, reg, "chat", {"who": f"w{i}"}) for i in range(5)]
        for run in runs:
            assert (await toren.wait_for_run(store, run.id, timeout=30)).status == "completed"
        deadline = time.monotonic() + 10
        while worker.metrics.ticks["completed"] < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    assert worker.metrics.ticks["completed"] == 5
    assert len(worker.results) == 2  # 5 without the bound


async def test_a_fork_keeps_its_source_until_the_fork_is_gone(store: Store) -> None:
    """A fork's copied steps reference the message bodies its source stored: prune keeps
    the source while the fork exists, then takes it once the fork is pruned."""
    reg = registry()
    d = deps(store, reg)
    source = await toren.start_run(store, reg, "chat", {"who": "source"})
    assert (await toren.tick(source.id, d)).status == "completed"
    fork = await toren.fork_run(store, reg, source.id, at="main:2")
    assert (await toren.tick(fork.id, d)).status == "completed"
    # Both finished: one pass takes the fork only; every body it references is still there.
    first = await prune_batch(store, before=time.time() + 1, limit=1000)
    assert first.run_ids == [fork.id]
    assert await store.get_run(source.id) is not None
    stored = {h for (h,) in await rows(store, "SELECT hash FROM blobs")}
    assert await referenced_bodies(store) <= stored
    # With the fork gone, the source goes too, and no body is left behind.
    second = await prune_batch(store, before=time.time() + 1, limit=1000)
    assert second.run_ids == [source.id]
    await sweep_blobs(store)
    assert await rows(store, "SELECT hash FROM blobs") == []
