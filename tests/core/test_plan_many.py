"""Planning many runs at once: the plans come in the listing's order, each as it would be
planned alone, at most ``limit`` of them, and an error is raised as itself."""

from __future__ import annotations

from typing import Any

import pytest

import toren
from toren.core.drivers.plan import PLAN_CONCURRENCY, Programs, plan_run, plan_runs
from toren.providers.base import ToolSpec
from toren.providers.scripted import ScriptedProvider
from toren.store import Store


def agent(prompt: str):
    async def fn(ctx: toren.Context, input: Any) -> Any:
        msgs: list[dict[str, Any]] = [{"role": "system", "content": prompt}]
        for i in range(int(input["turns"])):
            msgs.append({"role": "user", "content": f"q{i}"})
            msgs.append((await ctx.model("scripted:echo", msgs)).message())
            await ctx.tool("t", {"i": i})
        await ctx.wait_for_message("go")

    return fn


def registry(prompt: str) -> toren.Registry:
    reg = toren.Registry()
    for name in ("a", "b"):
        tool = toren.ToolDef("t", lambda i: i, ToolSpec("t"))
        reg.add(name, agent(prompt), tools={"t": tool}, code_version=prompt)
    return reg


async def test_many_runs_are_planned_in_order_each_as_alone(store: Store) -> None:
    v1 = registry("v1")
    deps = toren.TickDeps(store=store, agents=v1, providers={"scripted": ScriptedProvider()})
    count = 3 * PLAN_CONCURRENCY
    for i in range(count):
        run = await toren.start_run(store, v1, "ab"[i % 2], {"turns": i % 4})
        assert (await toren.tick(run.id, deps)).status == "waiting"

    v2 = registry("v2")  # every run with a model call is invalidated at its first one
    plans = await plan_runs(store, v2)
    listed = await store.list_runs(status="waiting", limit=count)
    assert [p.run_id for p in plans] == [r.id for r in listed]
    alone = toren.TickDeps(store=store, agents=v2)
    assert [p.to_dict() for p in plans] == [(await plan_run(alone, r)).to_dict() for r in listed]
    assert sum(1 for p in plans if p.findings) == count - count // 4

    assert [p.run_id for p in await plan_runs(store, v2, limit=5)] == [r.id for r in listed[:5]]


async def test_an_error_of_one_plan_is_raised_as_itself(store: Store) -> None:
    class Broken(RuntimeError):
        pass

    class Resolver:
        def __init__(self, reg: toren.Registry) -> None:
            self.reg = reg

        def resolve(self, agent: str, process: str) -> Any:
            if agent == "b":
                raise Broken("agent b cannot load")
            return self.reg.resolve(agent, process)

        def names(self) -> list[str]:
            return self.reg.names()

    v1 = registry("v1")
    for i in range(2 * PLAN_CONCURRENCY):
        await toren.start_run(store, v1, "ab"[i % 2], {"turns": 1})
    with pytest.raises(Broken):
        await plan_runs(store, Resolver(v1))


def test_an_unknown_agent_is_remembered_with_its_class_and_details() -> None:
    class Gone(toren.errors.AgentNotFound):
        pass

    class Resolver:
        calls = 0

        def resolve(self, agent: str, process: str) -> Any:
            Resolver.calls += 1
            raise Gone(f"no agent {agent!r}", agent=agent, known=["a"])

        def names(self) -> list[str]:
            return ["a"]

    programs = Programs(Resolver())
    raised = []
    for _ in range(2):
        with pytest.raises(Gone) as info:
            programs.resolve("x", "main")
        raised.append(info.value)
    assert Resolver.calls == 1  # resolved once per plan
    assert raised[0] is not raised[1]
    assert [(e.message, e.details) for e in raised] == [
        ("no agent 'x'", {"agent": "x", "known": ["a"]})
    ] * 2


def test_an_unknown_agent_of_a_subclass_with_its_own_constructor_is_still_reported() -> None:
    class Missing(toren.errors.AgentNotFound):
        def __init__(self, agent: str) -> None:
            super().__init__(f"no agent {agent!r} here", agent=agent)

    class Resolver:
        def resolve(self, agent: str, process: str) -> Any:
            raise Missing(agent)

        def names(self) -> list[str]:
            return []

    programs = Programs(Resolver())
    for _ in range(2):
        with pytest.raises(toren.errors.AgentNotFound) as info:
            programs.resolve("x", "main")
        assert (info.value.message, info.value.details) == ("no agent 'x' here", {"agent": "x"})
