"""``@tool(side_effects=False)`` has a meaning (issue 20): after an invalidation, a tool
declared free of side effects runs again instead of reusing the superseded result; a tool
with side effects (the default) reuses it. Replay of recorded steps is the same for both."""

from __future__ import annotations

from typing import Any

import toren
from toren.providers.base import ToolSpec
from toren.providers.scripted import ScriptedProvider
from toren.store import Store

from .test_engine import make_deps


def program(prompt: str, calls: list[str]) -> toren.Registry:
    def lookup(order: str) -> str:
        calls.append(f"lookup {order}")
        return f"status of {order} #{len(calls)}"

    def send(order: str) -> str:
        calls.append(f"send {order}")
        return "sent"

    async def agent(ctx: toren.Context, input: Any) -> Any:
        await ctx.model("scripted:echo", [{"role": "user", "content": prompt}])
        status = await ctx.tool("lookup", {"order": "A-17"})
        await ctx.tool("send", {"order": "A-17"})
        return {"status": status, "message": await ctx.wait_for_message("done")}

    tools = {
        "lookup": toren.ToolDef("lookup", lookup, ToolSpec("lookup"), side_effects=False),
        "send": toren.ToolDef("send", send, ToolSpec("send")),
    }
    reg = toren.Registry()
    reg.add("orders", agent, tools=tools)
    return reg


async def test_a_read_only_tool_runs_again_after_an_invalidation(store: Store) -> None:
    calls: list[str] = []
    provider = ScriptedProvider()
    v1 = program("v1", calls)
    run = await toren.start_run(store, v1, "orders")
    assert (await toren.tick(run.id, make_deps(store, v1, provider))).status == "waiting"
    assert calls == ["lookup A-17", "send A-17"]
    # Replay alone runs neither tool.
    await store.send_message(run.id, "nudge", None, now=0)
    assert (await toren.tick(run.id, make_deps(store, v1, provider))).status == "waiting"
    assert calls == ["lookup A-17", "send A-17"]

    # An edited prompt invalidates the stream from the model call: the read runs again
    # (fresh data), the email is not sent again (its recorded result is reused).
    v2 = program("v2", calls)
    await store.send_message(run.id, "done", "ok", now=0)
    result = await toren.tick(run.id, make_deps(store, v2, provider))
    assert result.status == "completed", result
    assert calls == ["lookup A-17", "send A-17", "lookup A-17"]
    assert result.output == {"status": "status of A-17 #3", "message": "ok"}
    events = await store.load_events(run.id)
    tools = [e.payload for e in events if e.type == "ToolCallRecorded"]
    assert [(t.name, t.reused_from_seq is not None) for t in tools] == [  # type: ignore[attr-defined]
        ("lookup", False),
        ("send", False),
        ("lookup", False),
        ("send", True),
    ]
