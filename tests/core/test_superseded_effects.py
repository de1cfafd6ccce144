"""What an invalidation must not undo: a message the superseded suffix received goes back
in line for the re-run, a spawn that moved keeps its child's side effects, and two waits on
one name share the inbox instead of fighting over it. Both backends."""

from __future__ import annotations

import asyncio
from typing import Any

import toren
from toren.core.contract.events import ChildStarted, MessageReceived
from toren.providers.scripted import ScriptedProvider
from toren.store import Store

from .test_engine import Mailbox, make_deps


def approval_agent(prompt: str, *, park: bool):
    """Draft (a model call), wait for an approval, send the approved draft, and (with
    ``park``) wait for a message that never comes: in flight, not finished."""

    async def agent(ctx: toren.Context, input: Any) -> Any:
        draft = await ctx.model("scripted:echo", [{"role": "user", "content": prompt}])
        approval = await ctx.wait_for_message("approve")
        await ctx.tool("send_email", {"to": "a@example.com", "body": draft.text})
        if park:
            await ctx.wait_for_message("never")
        return {"approval": approval}

    return agent


async def test_message_received_by_a_superseded_step_is_received_again(store: Store) -> None:
    """The approval was consumed by the step an edited prompt supersedes: the re-run wait
    gets that same message back, instead of waiting for an approval already given."""
    mailbox, provider = Mailbox(), ScriptedProvider()
    v1 = toren.Registry()
    v1.add("mail", approval_agent("draft v1", park=True), tools=mailbox.tools(), code_version="A")
    run = await toren.start_run(store, v1, "mail")
    assert (await toren.tick(run.id, make_deps(store, v1, provider))).status == "waiting"
    await store.send_message(run.id, "approve", {"by": "ann"}, now=0)
    assert (await toren.tick(run.id, make_deps(store, v1, provider))).status == "waiting"
    assert len(mailbox.sent) == 1

    # The edited prompt changes the draft at position 0, so the whole stream re-runs.
    v2 = toren.Registry()
    v2.add("mail", approval_agent("draft v2", park=False), tools=mailbox.tools(), code_version="B")
    await store.send_message(run.id, "never", None, now=0)  # wake the parked run
    result = await toren.tick(run.id, make_deps(store, v2, provider))
    assert result.status == "completed", result
    assert result.output == {"approval": {"by": "ann"}}
    assert [m["body"] for m in mailbox.sent] == ["draft v1", "draft v2"]  # a new body: sent

    events = await store.load_events(run.id)
    received = [e.payload for e in events if isinstance(e.payload, MessageReceived)]
    assert [(m.name, m.payload) for m in received] == [
        ("approve", {"by": "ann"}),
        ("approve", {"by": "ann"}),
    ]
    assert received[0].inbox_id == received[1].inbox_id  # the same message, not a copy


async def test_a_message_goes_back_in_line_before_newer_ones(store: Store) -> None:
    """Two approvals consumed by a superseded suffix and a third still in the inbox: the
    re-run receives them in the order they were sent, each once."""

    def agent_of(prompt: str, waits: int):
        async def agent(ctx: toren.Context, input: Any) -> Any:
            await ctx.model("scripted:echo", [{"role": "user", "content": prompt}])
            got = [await ctx.wait_for_message("vote") for _ in range(waits)]
            return got

        return agent

    provider = ScriptedProvider()
    v1 = toren.Registry()
    v1.add("v", agent_of("v1", 3))
    run = await toren.start_run(store, v1, "v")
    for n in (1, 2):
        await store.send_message(run.id, "vote", n, now=0)
    assert (await toren.tick(run.id, make_deps(store, v1, provider))).status == "waiting"
    await store.send_message(run.id, "vote", 3, now=0)

    v2 = toren.Registry()
    v2.add("v", agent_of("v2", 3), code_version="B")
    result = await toren.tick(run.id, make_deps(store, v2, provider))
    assert result.status == "completed", result
    assert result.output == [1, 2, 3]


async def test_two_waits_on_one_name_share_the_inbox(store: Store) -> None:
    """Two concurrent waits on one name and one message: one wait receives it, the other
    parks the run until the next; the tick does not end as a lost lease."""

    async def agent(ctx: toren.Context, input: Any) -> Any:
        return list(
            await asyncio.gather(ctx.wait_for_message("vote"), ctx.wait_for_message("vote"))
        )

    reg = toren.Registry()
    reg.add("votes", agent)
    deps = make_deps(store, reg, ScriptedProvider())
    run = await toren.start_run(store, reg, "votes")
    assert (await toren.tick(run.id, deps)).status == "waiting"
    await store.send_message(run.id, "vote", "first", now=0)
    second = await toren.tick(run.id, deps)
    assert second.status == "waiting", second
    parked = await store.get_run(run.id)
    assert parked is not None and parked.status == "waiting" and parked.waiting_for == ["vote"]
    await store.send_message(run.id, "vote", "second", now=0)
    final = await toren.tick(run.id, deps)
    assert final.status == "completed", final
    assert final.output == ["first", "second"]


async def test_a_moved_spawn_does_not_repeat_its_childs_side_effects(store: Store) -> None:
    """New code adds a step before a spawn: the spawn moves from position 0 to 1, so its
    child runs under a new stream name. It continues the superseded child: the email the
    child sent is reused, including when the re-run child calls the tool in a later tick
    (the continuation is in the log, not only in the worker's memory)."""
    mailbox, provider = Mailbox(), ScriptedProvider()

    async def child(ctx: toren.Context, input: Any) -> Any:
        if input.get("wait_first"):
            await ctx.wait_for_message("go")
        return await ctx.tool("send_email", {"to": input["to"], "body": "report"})

    async def parent_v1(ctx: toren.Context, input: Any) -> Any:
        out = await ctx.spawn("child", {"to": "a@example.com"})
        await ctx.wait_for_message("never")
        return out

    v1 = toren.Registry()
    v1.add("p", parent_v1, tools=mailbox.tools(), code_version="A")
    v1.add("p", child, process="child", tools=mailbox.tools(), code_version="A")
    run = await toren.start_run(store, v1, "p")
    assert (await toren.tick(run.id, make_deps(store, v1, provider))).status == "waiting"
    assert len(mailbox.sent) == 1

    async def parent_v2(ctx: toren.Context, input: Any) -> Any:
        await ctx.now()  # the new first step
        return await ctx.spawn("child", {"to": "a@example.com"})

    async def child_v2(ctx: toren.Context, input: Any) -> Any:
        return await child(ctx, {**input, "wait_first": True})

    v2 = toren.Registry()
    v2.add("p", parent_v2, tools=mailbox.tools(), code_version="B")
    v2.add("p", child_v2, process="child", tools=mailbox.tools(), code_version="B")
    await store.send_message(run.id, "never", None, now=0)
    # The spawn's input is unchanged (the child's own code changed): it continues main/0.
    assert (await toren.tick(run.id, make_deps(store, v2, provider))).status == "waiting"
    await store.send_message(run.id, "go", None, now=0)
    result = await toren.tick(run.id, make_deps(store, v2, provider))
    assert result.status == "completed", result
    assert result.output == {"status": "sent", "n": 1}  # the recorded result, reused
    assert len(mailbox.sent) == 1

    events = await store.load_events(run.id)
    starts = [e.payload for e in events if isinstance(e.payload, ChildStarted)]
    assert [(s.child_stream, s.continues) for s in starts] == [
        ("main/0", None),
        ("main/1", "main/0"),
    ]


async def test_a_spawn_with_new_input_does_not_continue_the_old_child(store: Store) -> None:
    """Only an identical spawn continues a superseded child: with new input the child is
    new work, and its tool call with new arguments is performed."""
    mailbox, provider = Mailbox(), ScriptedProvider()

    async def child(ctx: toren.Context, input: Any) -> Any:
        return await ctx.tool("send_email", {"to": input["to"], "body": "report"})

    def parent(to: str, first_step: bool):
        async def fn(ctx: toren.Context, input: Any) -> Any:
            if first_step:
                await ctx.now()
            out = await ctx.spawn("child", {"to": to})
            if not first_step:
                await ctx.wait_for_message("never")
            return out

        return fn

    v1 = toren.Registry()
    v1.add("p", parent("a@example.com", False), tools=mailbox.tools())
    v1.add("p", child, process="child", tools=mailbox.tools())
    run = await toren.start_run(store, v1, "p")
    assert (await toren.tick(run.id, make_deps(store, v1, provider))).status == "waiting"

    v2 = toren.Registry()
    v2.add("p", parent("b@example.com", True), tools=mailbox.tools(), code_version="B")
    v2.add("p", child, process="child", tools=mailbox.tools(), code_version="B")
    await store.send_message(run.id, "never", None, now=0)
    result = await toren.tick(run.id, make_deps(store, v2, provider))
    assert result.status == "completed", result
    assert [m["to"] for m in mailbox.sent] == ["a@example.com", "b@example.com"]
