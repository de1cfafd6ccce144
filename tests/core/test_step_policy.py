"""The tick and the dry run of ``toren plan`` share one step policy and cannot disagree.

Both drivers ask the journal what a step does; what the journal needs of the agent's
declarations (may a tool call reuse a superseded identical call?) is decided in one pure
module, ``toren.core.contract.policy``. Here a run records a model call and a side-effecting tool
call side by side; new code changes the prompt, which invalidates the stream, and calls the
tool identically. The plan and the real resume must ask the journal the same question and
get the same answer, for every declaration of the tool; the tool's real calls show the
answer was acted on.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest

import toren
from toren.core.agent_api.program import Limits, ToolDef
from toren.core.contract import policy
from toren.core.contract.journal import Journal, Run, Supersede
from toren.core.contract.values import StepKind
from toren.core.drivers.plan import plan_runs
from toren.providers.base import ToolSpec
from toren.providers.scripted import ScriptedProvider
from toren.store import Store

# (declaration, whether an identical call after an invalidation reuses the recorded result)
DECLARATIONS = {
    "side_effects": ({}, True),
    "reexecute": ({"reexecute": True}, False),
    "free_of_side_effects": ({"side_effects": False}, False),
    "free_and_reexecute": ({"side_effects": False, "reexecute": True}, False),
}


@pytest.mark.parametrize("declared", sorted(DECLARATIONS))
async def test_plan_and_tick_take_the_same_reuse_decision(
    store: Store, declared: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    options, reuses = DECLARATIONS[declared]
    paid: list[int] = []

    def pay(amount: int) -> int:
        paid.append(amount)
        return len(paid)

    tools = {"pay": ToolDef("pay", pay, ToolSpec("pay"), **options)}

    def agent(prompt: str, park: bool):
        async def fn(ctx: toren.Context, input: Any) -> Any:
            # Both steps are asked at call time: the tool (position 1) is decided right
            # after the model call (position 0) supersedes the stream, in both drivers.
            _, receipt = await asyncio.gather(
                ctx.model("scripted:echo", [{"role": "user", "content": prompt}]),
                ctx.tool("pay", {"amount": 5}),
            )
            if park:
                await ctx.wait_for_message("go")
            return receipt

        return fn

    provider = ScriptedProvider()
    v1 = toren.Registry()
    v1.add("p", agent("v1", park=True), tools=tools, code_version="A")
    run = await toren.start_run(store, v1, "p")
    deps = toren.TickDeps(store=store, agents=v1, providers={"scripted": provider})
    assert (await toren.tick(run.id, deps)).status == "waiting"
    assert paid == [5]

    # What each driver asks the journal about the tool call, and what it answers.
    asked: list[tuple[str, bool, int | None]] = []
    decided: list[str] = []
    request = Journal.request
    tool_reusable = policy.tool_reusable

    def spy_request(self: Journal, *args: Any, **kw: Any) -> Any:
        answer = request(self, *args, **kw)
        if args[2] == StepKind.TOOL:
            run_live = answer.run if isinstance(answer, Supersede) else answer
            assert isinstance(run_live, Run)
            reuse = run_live.reuse.first.seq if run_live.reuse is not None else None
            asked.append((type(answer).__name__, kw["reusable"], reuse))
        return answer

    def spy_policy(tooldef: ToolDef | None) -> bool:
        decided.append(tooldef.name if tooldef is not None else "")
        return tool_reusable(tooldef)

    monkeypatch.setattr(Journal, "request", spy_request)
    monkeypatch.setattr(policy, "tool_reusable", spy_policy)

    v2 = toren.Registry()
    v2.add("p", agent("v2 edited", park=False), tools=tools, code_version="B")
    (plan,) = await plan_runs(store, v2)
    assert not plan.clean and plan.findings[0].from_pos == 0
    plan_asked, plan_decided = list(asked), list(decided)
    asked.clear()
    decided.clear()

    await store.send_message(run.id, "go", None, now=0)
    deps = toren.TickDeps(store=store, agents=v2, providers={"scripted": provider})
    result = await toren.tick(run.id, deps)
    assert result.status == "completed" and result.invalidations > 0

    # One policy, asked by both; one question to the journal, one answer.
    assert plan_decided == decided == ["pay"]
    assert plan_asked == asked
    ((_, reusable, reuse),) = asked
    assert reusable is reuses
    assert (reuse is not None) is reuses
    # ... and the tick acted on it: the tool ran again only when it may not reuse.
    assert paid == ([5] if reuses else [5, 5])
    assert result.output == (1 if reuses else 2)


def test_the_policy_is_the_declaration() -> None:
    spec = ToolSpec("t")
    assert policy.tool_reusable(None)  # undeclared: assumed to act
    assert policy.tool_reusable(ToolDef("t", print, spec))
    assert not policy.tool_reusable(ToolDef("t", print, spec, reexecute=True))
    assert not policy.tool_reusable(ToolDef("t", print, spec, side_effects=False))
    budget = Limits(max_cost_usd=Decimal("0.5"))
    assert policy.over_budget(budget, lambda: 499_999_999) is None
    assert policy.over_budget(budget, lambda: 500_000_000) == Decimal("0.5")
    assert (
        policy.over_budget(Limits(), lambda: pytest.fail("no budget: spent is not asked")) is None
    )
