"""Say what changed: the replay plan and the log's invalidations name the part of the request
that differs (message 0 / the system prompt; tool X's spec; parameter temperature
0.2 -> 0.7), not only the two digests. On both backends, with the real engine."""

from __future__ import annotations

import time
from typing import Any

import pytest

import toren
from toren.core.contract.changes import explain_invalidations
from toren.core.contract.recorded import load_blobs
from toren.core.drivers.plan import plan_runs
from toren.providers.base import ToolSpec
from toren.providers.scripted import ScriptedProvider
from toren.store import Store

BASE: dict[str, Any] = {
    "system": "Be brief.",
    "tool_doc": "Weather for a city",
    "temperature": 0.2,
    "extra_user": False,
    "order": "A-17",
    "seconds": 1,
    "tool_first": False,
}


def agent(**changes: Any) -> Any:
    cfg = {**BASE, **changes}

    async def main(ctx: toren.Context, input: Any) -> Any:
        if cfg["tool_first"]:
            await ctx.tool("lookup", {"order_id": cfg["order"]})
        messages: list[Any] = [
            {"role": "system", "content": cfg["system"]},
            {"role": "user", "content": "weather in Paris?"},
        ]
        if cfg["extra_user"]:
            messages.append({"role": "user", "content": "and in Rome?"})
        spec = ToolSpec("get_weather", cfg["tool_doc"], {"type": "object", "properties": {}})
        await ctx.model(
            "scripted:echo", messages, tools=[spec, {"name": "now"}], temperature=cfg["temperature"]
        )
        await ctx.tool("lookup", {"order_id": cfg["order"]})
        await ctx.sleep(cfg["seconds"])
        await ctx.wait_for_message("go")
        return "done"

    return main


class InstantClock(toren.ManualClock):
    """The wall clock's time, in which a sleep ends at once: the agent's ``ctx.sleep(1)``
    records and fires its timer as with the system clock (a sleep that short waits in the
    tick), without the test waiting a real second for it, in each of its two ticks."""

    def __init__(self) -> None:
        super().__init__(start=time.time())

    async def sleep(self, seconds: float) -> None:
        await self.advance(max(0.0, seconds))


def registry(version: str, **changes: Any) -> toren.Registry:
    reg = toren.Registry()
    tool = toren.ToolDef("lookup", lambda order_id: {"id": order_id}, ToolSpec("lookup"))
    reg.add("x", agent(**changes), tools={"lookup": tool}, code_version=version)
    return reg


VARIANTS = [
    ({"system": "Be very brief."}, 0, ["message 0 (the system prompt) changed"]),
    ({"tool_doc": "Weather, in Celsius"}, 0, ["tool 'get_weather': spec changed"]),
    ({"temperature": 0.7}, 0, ["parameter temperature 0.2 -> 0.7"]),
    ({"temperature": 1}, 0, ["parameter temperature 0.2 -> 1"]),
    ({"extra_user": True}, 0, ["message 2 (user) added"]),
    (
        {"system": "New.", "temperature": 0.5},
        0,
        ["message 0 (the system prompt) changed", "parameter temperature 0.2 -> 0.5"],
    ),
    ({"order": "A-18"}, 1, ['argument order_id "A-17" -> "A-18"']),
    ({"seconds": 1.0}, 2, ["seconds 1 -> 1.0"]),
    ({"tool_first": True}, 0, ["step kind model -> tool"]),
]


@pytest.mark.parametrize(("changes", "at", "texts"), VARIANTS, ids=lambda v: str(v)[:40])
async def test_the_plan_and_the_log_say_what_changed(
    store: Store, changes: dict[str, Any], at: int, texts: list[str]
) -> None:
    provider = ScriptedProvider()
    providers = {"scripted": provider}
    v1 = registry("v1")
    run = await toren.start_run(store, v1, "x")
    clock = InstantClock()
    deps = toren.TickDeps(store=store, agents=v1, providers=providers, clock=clock)
    assert (await toren.tick(run.id, deps)).status == "waiting"

    v2 = registry("v2", **changes)
    (plan,) = await plan_runs(store, v2)
    (finding,) = plan.findings
    assert finding.from_pos == at
    assert [c["text"] for c in finding.changes] == texts
    assert plan.to_dict()["findings"][0]["changes"] == list(finding.changes)

    # The resume invalidates, and the log then says the same thing about it.
    events = await store.load_events(run.id)
    assert explain_invalidations(events, await load_blobs(store, events)) == []
    await store.send_message(run.id, "go", None, now=0)
    deps2 = toren.TickDeps(store=store, agents=v2, providers=providers, clock=clock)
    assert (await toren.tick(run.id, deps2)).status == "completed"
    events = await store.load_events(run.id)
    (explained,) = explain_invalidations(events, await load_blobs(store, events))
    assert explained["from_pos"] == at and explained["note"] is None
    assert [c["text"] for c in explained["changes"]] == texts
    assert explained["changes"] == list(finding.changes)


async def test_an_invalidation_not_yet_re_run_says_why_there_is_nothing_to_compare(
    store: Store,
) -> None:
    """A StreamInvalidated whose new step has not been recorded (the run waits at a later
    step... or never got there): the explanation says so instead of guessing."""
    provider = ScriptedProvider()
    v1 = registry("v1")
    run = await toren.start_run(store, v1, "x")
    clock = InstantClock()
    await toren.tick(
        run.id,
        toren.TickDeps(store=store, agents=v1, providers={"scripted": provider}, clock=clock),
    )

    async def ends_early(ctx: toren.Context, input: Any) -> Any:
        await ctx.wait_for_message("go")  # position 0: a message wait instead of the model
        return "short"

    v2 = toren.Registry()
    v2.add("x", ends_early, code_version="v2")
    (plan,) = await plan_runs(store, v2)
    assert [c["text"] for c in plan.findings[0].changes] == ["step kind model -> message"]
    await store.send_message(run.id, "go", None, now=0)
    await toren.tick(
        run.id,
        toren.TickDeps(store=store, agents=v2, providers={"scripted": provider}, clock=clock),
    )
    events = await store.load_events(run.id)
    (explained,) = explain_invalidations(events, await load_blobs(store, events))
    assert [c["text"] for c in explained["changes"]] == ["step kind model -> message"]
