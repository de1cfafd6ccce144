"""``ctx.usage`` on replay is the usage as of the step being replayed, as the live run saw
it there, not the run's final total. Agent code that decides on it (the built-in loop's
``max_cost_usd``) must take the same branch on every replay, or a resumed run ends
differently from the run it resumes."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import toren
from toren.providers.base import Usage
from toren.providers.scripted import ScriptedProvider
from toren.store import Store

PRICE = Decimal("0.6")  # per call


def price(model: str, usage: Usage) -> Decimal:
    return PRICE


def budgeted(seen: list[tuple[Decimal, int]]) -> Any:
    async def agent(ctx: toren.Context, input: Any) -> Any:
        for i in range(2):
            seen.append((ctx.usage.cost_usd, ctx.usage.steps))
            if ctx.usage.cost_usd >= Decimal("1.0"):
                raise toren.LimitExceeded("over budget", limit="max_cost_usd")
            await ctx.model("scripted:echo", [{"role": "user", "content": f"turn {i}"}])
        seen.append((ctx.usage.cost_usd, ctx.usage.steps))
        await ctx.wait_for_message("go")
        return "done"

    return agent


async def test_a_resumed_run_sees_the_usage_of_its_replay_position(store: Store) -> None:
    seen: list[tuple[Decimal, int]] = []
    reg = toren.Registry()
    reg.add("budgeted", budgeted(seen))
    deps = toren.TickDeps(
        store=store, agents=reg, providers={"scripted": ScriptedProvider()}, pricing=price
    )
    run = await toren.start_run(store, reg, "budgeted")
    assert (await toren.tick(run.id, deps)).status == "waiting"
    live = list(seen)
    assert live == [(Decimal(0), 0), (PRICE, 1), (2 * PRICE, 2)]

    seen.clear()
    await toren.send_message(store, run.id, "go")
    result = await toren.tick(run.id, deps)
    # Live, the budget check before the second call saw $0.60 and went on; replay must
    # see the same, not the $1.20 the run has spent by now (which failed the run).
    assert result.status == "completed", result.error
    assert seen == live
    stored = await store.get_run(run.id)
    assert stored is not None and stored.cost_usd == 2 * PRICE and stored.steps == 2


def spender(seen: list[Decimal]) -> Any:
    async def spend(ctx: toren.Context, input: Any) -> Any:
        for i in range(2):
            seen.append(ctx.usage.cost_usd)
            if ctx.usage.cost_usd >= Decimal("1.0"):
                raise toren.LimitExceeded("over budget", limit="max_cost_usd")
            await ctx.model("scripted:echo", [{"role": "user", "content": f"turn {i}"}])
        if input.get("then_wait"):  # keeps a child stream open, so a tick re-runs it
            await ctx.wait_for_message("more")
        return "spent"

    return spend


async def test_a_branch_replaying_beside_a_live_one_sees_its_own_position(store: Store) -> None:
    """The tick's replay phase ends at its first live step: here the message wait of one
    gathered branch (or its child stream), while the other branch still replays. That
    branch must still see the usage of its replay position, not the final total."""
    for via_child in (False, True):
        seen: list[Decimal] = []
        spend = spender(seen)

        async def agent(
            ctx: toren.Context, input: Any, spend: Any = spend, via_child: bool = via_child
        ) -> Any:
            work = ctx.spawn("spend", {"then_wait": True}) if via_child else spend(ctx, {})
            await asyncio.gather(ctx.wait_for_message("go"), work)
            return "done"

        reg = toren.Registry()
        reg.add("gathered", agent)
        reg.add("gathered", spend, process="spend")
        deps = toren.TickDeps(
            store=store, agents=reg, providers={"scripted": ScriptedProvider()}, pricing=price
        )
        run = await toren.start_run(store, reg, "gathered")
        assert (await toren.tick(run.id, deps)).status == "waiting"
        live = list(seen)
        assert live == [Decimal(0), PRICE]
        seen.clear()
        await toren.send_message(store, run.id, "go")
        result = await toren.tick(run.id, deps)
        assert result.status == ("waiting" if via_child else "completed"), result.error
        assert seen == live, via_child


def test_usage_a_failure_reports_counts_only_token_counts() -> None:
    from toren.core.drivers.steps import _reported_usage

    assert _reported_usage({"usage": {"input_tokens": 30, "output_tokens": 2}}) == Usage(30, 2)
    for junk in (None, "many", -5, 2.5, True, [1]):
        assert _reported_usage({"usage": {"input_tokens": junk, "output_tokens": junk}}) == Usage()
    assert _reported_usage({"usage": "lots"}) == Usage()
    assert _reported_usage(None) == Usage()
