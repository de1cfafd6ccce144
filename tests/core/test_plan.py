"""The replay plan reports exactly what a real resume then invalidates."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

import toren
from toren.core.drivers.plan import plan_runs
from toren.providers.base import Usage
from toren.providers.scripted import ScriptedProvider
from toren.store import Store


def agent(prompt_at: int, prompt: str, n: int = 6):
    async def fn(ctx: toren.Context, input: Any) -> Any:
        msgs: list[dict[str, Any]] = []
        for i in range(n):
            msgs.append({"role": "user", "content": f"s{i}" + (prompt if i == prompt_at else "")})
            msgs.append((await ctx.model("scripted:echo", msgs)).message())
        await ctx.wait_for_message("go")
        return len(msgs)

    return fn


def price(_ref: str, usage: Usage) -> Decimal:
    return Decimal("0.001") * (usage.input_tokens + usage.output_tokens)


async def test_plan_is_clean_then_matches_the_real_invalidation(store: Store) -> None:
    provider = ScriptedProvider()
    a = toren.Registry()
    a.add("x", agent(3, "v1"), code_version="A")
    runs = [await toren.start_run(store, a, "x", {"i": i}) for i in range(3)]
    deps_a = toren.TickDeps(store=store, agents=a, providers={"scripted": provider}, pricing=price)
    for run in runs:
        assert (await toren.tick(run.id, deps_a)).status == "waiting"
    queued = await toren.start_run(store, a, "x", {"i": 99})  # never started: nothing recorded

    plans = await plan_runs(store, a)
    assert len(plans) == 4 and all(p.clean for p in plans)
    assert provider.served == 18  # planning executed nothing

    b = toren.Registry()
    b.add("x", agent(3, "v2 edited"), code_version="B")
    plans = {p.run_id: p for p in await plan_runs(store, b)}
    assert provider.served == 18
    assert plans[queued.id].clean
    for run in runs:
        plan = plans[run.id]
        assert not plan.clean
        (finding,) = plan.findings
        assert (finding.stream, finding.from_pos, finding.cause) == ("main", 3, "digest_mismatch")
        assert finding.suffix_model_calls == 3 and finding.written_by == ("A",)
        assert finding.suffix_cost_usd > 0

    # The real resume invalidates exactly what the plan said.
    deps_b = toren.TickDeps(store=store, agents=b, providers={"scripted": provider}, pricing=price)
    for run in runs:
        await store.send_message(run.id, "go", None, now=0)
        assert (await toren.tick(run.id, deps_b)).status == "completed"
        inv = [e for e in await store.load_events(run.id) if e.type == "StreamInvalidated"]
        finding = plans[run.id].findings[0]
        assert [
            (e.stream, e.payload.from_pos, e.payload.expected_digest, e.payload.actual_digest)
            for e in inv
        ] == [(finding.stream, finding.from_pos, finding.expected_digest, finding.actual_digest)]
    assert provider.served == 18 + 9


async def test_a_run_with_a_large_input_replays_cleanly(store: Store) -> None:
    """A list of runs carries a large input as a summary (its preview and size), not the
    value: the plan must replay such a run with its whole input, not with None."""
    provider = ScriptedProvider()

    async def fn(ctx: toren.Context, input: Any) -> Any:
        reply = await ctx.model("scripted:echo", [{"role": "user", "content": input["text"]}])
        await ctx.wait_for_message("go")
        return reply.text

    reg = toren.Registry()
    reg.add("big", fn, code_version="A")
    run = await toren.start_run(store, reg, "big", {"text": "x" * 10_000})
    deps = toren.TickDeps(store=store, agents=reg, providers={"scripted": provider})
    assert (await toren.tick(run.id, deps)).status == "waiting"

    (plan,) = await plan_runs(store, reg)
    assert plan.problem is None
    assert plan.clean and plan.replayed_steps == 1
    assert provider.served == 1


async def test_a_plan_pauses_the_cycle_collector_while_it_replays(store: Store) -> None:
    """A plan is all replay: the collector is off while its agent code re-runs (as in a
    tick's replay, ReplayGcPause), on again once the plan is made, and left alone with
    ``pause_gc_on_replay`` off."""
    import gc

    from toren.config import Settings

    collector_on: list[bool] = []

    async def fn(ctx: toren.Context, input: Any) -> Any:
        for i in range(3):
            collector_on.append(gc.isenabled())
            await ctx.model("scripted:echo", [{"role": "user", "content": f"s{i}"}])
        await ctx.wait_for_message("go")

    reg = toren.Registry()
    reg.add("x", fn)
    run = await toren.start_run(store, reg, "x", None)
    deps = toren.TickDeps(store=store, agents=reg, providers={"scripted": ScriptedProvider()})
    assert (await toren.tick(run.id, deps)).status == "waiting"
    assert gc.isenabled()

    collector_on.clear()
    (plan,) = await plan_runs(store, reg)
    assert plan.clean and plan.replayed_steps == 3
    assert collector_on == [False, False, False]
    assert gc.isenabled()

    collector_on.clear()
    off = toren.TickDeps(store=store, agents=reg, settings=Settings(pause_gc_on_replay=False))
    (plan,) = await plan_runs(store, reg, deps=off)
    assert plan.clean and collector_on == [True, True, True]


async def test_a_plan_tells_the_store_its_runs_recorded_steps(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a tick does: a run past ``LONG_LOG`` recorded steps has its log read the long
    way (on PostgreSQL, a thread of the pool), the plan the same."""
    from toren.store.sql import LONG_LOG

    reg = toren.Registry()
    reg.add("x", agent(1, "v1", n=2), code_version="A")
    run = await toren.start_run(store, reg, "x", None)
    deps = toren.TickDeps(store=store, agents=reg, providers={"scripted": ScriptedProvider()})
    assert (await toren.tick(run.id, deps)).status == "waiting"
    long_reads: list[str] = []
    real_long = store._long_log  # type: ignore[attr-defined]

    async def counted(run_id: str, after_seq: int) -> list[Any]:
        long_reads.append(run_id)
        return list(await real_long(run_id, after_seq))

    monkeypatch.setattr(store, "_long_log", counted)
    (plan,) = await plan_runs(store, reg)
    assert plan.clean and plan.replayed_steps == 2 and long_reads == []
    await store._run(  # type: ignore[attr-defined]
        lambda cur: store._x(cur, "UPDATE runs SET steps = ? WHERE id = ?", (LONG_LOG + 1, run.id))  # type: ignore[attr-defined]
    )
    (plan,) = await plan_runs(store, reg)
    assert plan.clean and plan.replayed_steps == 2 and long_reads == [run.id]
