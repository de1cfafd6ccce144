"""The engine end to end on both backends: replay, honest invalidation, waits, children,
cancellation and bad input."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

import toren
from toren.core.contract.events import StreamInvalidated
from toren.errors import AgentNotFound, CorruptEventLog, IdempotencyConflict, InvalidInput
from toren.providers.base import ToolSpec
from toren.providers.scripted import ScriptedProvider
from toren.store import Store


def chain_agent(n: int, prompt_at: int = -1, prompt: str = "v1", email_at: int | None = None):
    """An agent of n model steps; step ``prompt_at`` carries ``prompt`` in its message.
    With ``email_at``, a side-effecting tool call follows that step."""

    async def agent(ctx: toren.Context, input: Any) -> Any:
        messages: list[dict[str, Any]] = [{"role": "system", "content": "count"}]
        for i in range(n):
            text = f"step {i}" + (f" [{prompt}]" if i == prompt_at else "")
            messages.append({"role": "user", "content": text})
            reply = await ctx.model("scripted:echo", messages)
            messages.append(reply.message())
            if email_at is not None and i == email_at:
                await ctx.tool("send_email", {"to": "a@example.com", "body": "hello"})
        return {"last": messages[-1]["content"], "steps": n}

    return agent


class Mailbox:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def tools(self) -> dict[str, toren.ToolDef]:
        def send_email(to: str, body: str) -> dict[str, Any]:
            self.sent.append({"to": to, "body": body})
            return {"status": "sent", "n": len(self.sent)}

        return {"send_email": toren.ToolDef("send_email", send_email, ToolSpec("send_email"))}


def make_deps(store: Store, registry: toren.Registry, provider: ScriptedProvider, **kw: Any):
    return toren.TickDeps(store=store, agents=registry, providers={"scripted": provider}, **kw)


async def test_run_completes_and_replays_for_free(store: Store) -> None:
    reg = toren.Registry()
    reg.add("chain", chain_agent(5))
    provider = ScriptedProvider()
    deps = make_deps(store, reg, provider)
    run = await toren.start_run(store, reg, "chain", {"q": 1})
    result = await toren.tick(run.id, deps)
    assert result.status == "completed"
    assert result.output == {"last": "step 4", "steps": 5}
    assert provider.served == 5
    stored = await store.get_run(run.id)
    assert stored is not None and stored.status == "completed" and stored.steps == 5
    # The event log is the source of truth: re-running the same code over it pays nothing.
    events = await store.load_events(run.id)
    assert [e.type for e in events].count("ModelCallRecorded") == 5
    assert [e.seq for e in events] == sorted(e.seq for e in events)


async def test_prompt_edit_invalidates_exactly_the_suffix(store: Store) -> None:
    """Edit the prompt of step 7 of a 12-step run mid-flight: one StreamInvalidated at 7,
    steps 0-6 not paid again, 7-11 re-run, the side-effecting tool not performed twice."""
    mailbox = Mailbox()
    provider = ScriptedProvider()
    v1 = toren.Registry()
    v1.add(
        "chain",
        chain_agent(12, prompt_at=7, prompt="v1", email_at=9),
        tools=mailbox.tools(),
        code_version="A",
    )
    run = await toren.start_run(store, v1, "chain")

    # Version A runs the whole chain once (steps 0-11 and the email after step 9) but is
    # stopped before it records completion: simulate by failing the lease afterwards.
    gate = asyncio.Event()

    async def stop_at_end(ctx: toren.Context, input: Any) -> Any:
        out = await chain_agent(12, 7, "v1", 9)(ctx, input)
        await ctx.wait_for_message("never")  # parks the run: in flight, not finished
        gate.set()
        return out

    v1.add("chain", stop_at_end, tools=mailbox.tools(), code_version="A")
    first = await toren.tick(run.id, make_deps(store, v1, provider))
    assert first.status == "waiting"
    assert provider.served == 12 and len(mailbox.sent) == 1

    v2 = toren.Registry()
    v2.add(
        "chain",
        chain_agent(12, prompt_at=7, prompt="v2 edited", email_at=9),
        tools=mailbox.tools(),
        code_version="B",
    )
    await store.send_message(run.id, "never", None, now=0)  # wake it (message unused by B)
    second = await toren.tick(run.id, make_deps(store, v2, provider))
    assert second.status == "completed", second.error
    assert provider.served == 12 + 5  # steps 7..11 re-run, 0..6 replayed
    assert len(mailbox.sent) == 1  # the email in the re-run suffix was reused, not re-sent

    events = await store.load_events(run.id)
    invalidations = [e for e in events if e.type == "StreamInvalidated"]
    assert len(invalidations) == 1
    inv = invalidations[0].payload
    assert isinstance(inv, StreamInvalidated)
    assert inv.from_pos == 7 and inv.cause == "digest_mismatch" and inv.code_version == "B"
    assert inv.expected_digest and inv.actual_digest and inv.expected_digest != inv.actual_digest
    model_positions_after = [
        e.position for e in events if e.type == "ModelCallRecorded" and e.seq > invalidations[0].seq
    ]
    # Model steps 7, 8, 9 then the email tool (position 10), then model steps 10, 11.
    assert model_positions_after == [7, 8, 9, 11, 12]
    tools_after = [
        e for e in events if e.type == "ToolCallRecorded" and e.seq > invalidations[0].seq
    ]
    assert [t.position for t in tools_after] == [10]
    assert tools_after[0].payload.reused_from_seq is not None
    assert (await store.get_run(run.id)).invalidations == 1  # type: ignore[union-attr]

    # A third tick of B over the log replays everything: no further invalidation, no cost.
    before = provider.served
    log_again = await toren.tick(run.id, make_deps(store, v2, provider))
    assert log_again.status in ("not_claimed", "completed")
    assert provider.served == before


async def test_reexecute_tool_runs_again_after_invalidation(store: Store) -> None:
    calls: list[int] = []

    def price() -> int:
        calls.append(1)
        return len(calls)

    def agent(prompt: str):
        async def fn(ctx: toren.Context, input: Any) -> Any:
            await ctx.model("scripted:echo", [{"role": "user", "content": prompt}])
            return await ctx.tool("price", {})

        return fn

    tools = {"price": toren.ToolDef("price", price, ToolSpec("price"), reexecute=True)}
    provider = ScriptedProvider()
    a = toren.Registry()
    a.add("p", agent("v1"), tools=tools)

    async def parked(ctx: toren.Context, input: Any) -> Any:
        out = await agent("v1")(ctx, input)
        await ctx.wait_for_message("go")
        return out

    a.add("p", parked, tools=tools)
    run = await toren.start_run(store, a, "p")
    assert (await toren.tick(run.id, make_deps(store, a, provider))).status == "waiting"
    b = toren.Registry()
    b.add("p", agent("v2"), tools=tools)
    await store.send_message(run.id, "go", None, now=0)
    result = await toren.tick(run.id, make_deps(store, b, provider))
    assert result.status == "completed"
    assert result.output == 2 and len(calls) == 2  # re-executed, as declared


async def test_gather_positions_are_stable_and_each_step_committed(store: Store) -> None:
    order: list[str] = []

    async def slow(name: str, delay: float) -> str:
        await asyncio.sleep(delay)
        order.append(name)
        return name

    tools = {
        n: toren.ToolDef(n, (lambda n=n, d=d: slow(n, d)), ToolSpec(n))
        for n, d in (("a", 0.03), ("b", 0.0), ("c", 0.01))
    }

    async def agent(ctx: toren.Context, input: Any) -> Any:
        return list(await asyncio.gather(ctx.tool("a"), ctx.tool("b"), ctx.tool("c")))

    reg = toren.Registry()
    reg.add("g", agent, tools=tools)
    run = await toren.start_run(store, reg, "g")
    result = await toren.tick(run.id, make_deps(store, reg, ScriptedProvider()))
    assert result.output == ["a", "b", "c"]
    assert order == ["b", "c", "a"]  # finished out of call order...
    events = [e for e in await store.load_events(run.id) if e.type == "ToolCallRecorded"]
    by_pos = {e.position: e.payload.name for e in events}
    assert by_pos == {0: "a", 1: "b", 2: "c"}  # ...but positions follow call order


async def test_durable_sleep_parks_and_resumes(store: Store) -> None:
    clock = toren.ManualClock()

    async def agent(ctx: toren.Context, input: Any) -> Any:
        before = await ctx.now()
        await ctx.sleep(3600)
        after = await ctx.now()
        return after - before

    reg = toren.Registry()
    reg.add("sleeper", agent)
    deps = make_deps(store, reg, ScriptedProvider(), clock=clock)
    run = await toren.start_run(store, reg, "sleeper", clock=clock)
    first = await toren.tick(run.id, deps)
    assert first.status == "waiting" and first.not_before == pytest.approx(clock.now() + 3600)
    assert (await toren.tick(run.id, deps)).status == "not_claimed"  # not due yet
    await clock.advance(3600)
    second = await toren.tick(run.id, deps)
    assert second.status == "completed"
    assert second.output == pytest.approx(3600)
    types = [e.type for e in await store.load_events(run.id)]
    assert types.count("TimerScheduled") == 1 and types.count("TimerFired") == 1


async def test_wait_for_message_and_timeout(store: Store) -> None:
    clock = toren.ManualClock()

    async def agent(ctx: toren.Context, input: Any) -> Any:
        approval = await ctx.wait_for_message("approval")
        late = await ctx.wait_for_message("second", timeout=60)
        return {"approval": approval, "late": late}

    reg = toren.Registry()
    reg.add("hitl", agent)
    deps = make_deps(store, reg, ScriptedProvider(), clock=clock)
    run = await toren.start_run(store, reg, "hitl", clock=clock)
    assert (await toren.tick(run.id, deps)).status == "waiting"
    parked = await store.get_run(run.id)
    assert parked is not None and parked.status == "waiting" and parked.waiting_for == ["approval"]
    await store.send_message(run.id, "approval", {"ok": True}, now=clock.now())
    result = await toren.tick(run.id, deps)
    assert result.status == "waiting" and result.not_before == pytest.approx(clock.now() + 60)
    await clock.advance(61)
    final = await toren.tick(run.id, deps)
    assert final.status == "completed"
    assert final.output == {"approval": {"ok": True}, "late": None}


async def test_message_sent_while_running_is_not_lost(store: Store) -> None:
    """A message arriving while the run is leased (status running) must wake it once
    it parks: the release re-checks the inbox."""
    reg = toren.Registry()
    started = asyncio.Event()
    proceed = asyncio.Event()

    async def agent(ctx: toren.Context, input: Any) -> Any:
        await ctx.now()
        started.set()
        await proceed.wait()
        return await ctx.wait_for_message("m")

    reg.add("a", agent)
    deps = make_deps(store, reg, ScriptedProvider())
    run = await toren.start_run(store, reg, "a")
    task = asyncio.ensure_future(toren.tick(run.id, deps))
    await started.wait()
    await store.send_message(run.id, "m", "hello", now=deps.clock.now())
    proceed.set()
    first = await task
    # Either the wait saw the message at once, or the run parked and is claimable now.
    if first.status == "waiting":
        first = await toren.tick(run.id, deps)
    assert first.status == "completed" and first.output == "hello"


async def test_spawn_child_stream_and_invalidation_with_parent(store: Store) -> None:
    provider = ScriptedProvider()

    def parent(tag: str):
        async def fn(ctx: toren.Context, input: Any) -> Any:
            await ctx.model("scripted:echo", [{"role": "user", "content": f"plan {tag}"}])
            out = await ctx.spawn("child", {"n": 2})
            await ctx.wait_for_message("go")
            return out

        return fn

    async def child(ctx: toren.Context, input: Any) -> Any:
        total = []
        for i in range(input["n"]):
            r = await ctx.model("scripted:echo", [{"role": "user", "content": f"c{i}"}])
            total.append(r.text)
        return total

    a = toren.Registry()
    a.add("p", parent("v1"))
    a.add("p", child, process="child")
    run = await toren.start_run(store, a, "p")
    assert (await toren.tick(run.id, make_deps(store, a, provider))).status == "waiting"
    assert provider.served == 3
    events = await store.load_events(run.id)
    assert {e.stream for e in events if e.stream} == {"main", "main/1"}

    b = toren.Registry()
    b.add("p", parent("v2"))
    b.add("p", child, process="child")
    await store.send_message(run.id, "go", None, now=0)
    await store.send_message(run.id, "go", None, now=0)
    result = await toren.tick(run.id, make_deps(store, b, provider))
    assert result.status == "completed" and result.output == ["c0", "c1"]
    events = await store.load_events(run.id)
    inv = [
        (e.stream, e.payload.from_pos, e.payload.cause)
        for e in events
        if e.type == "StreamInvalidated"
    ]
    # The parent changed at 0; the child started at 1 is invalidated with it.
    assert inv == [("main", 0, "digest_mismatch"), ("main/1", 0, "parent_invalidated")]
    assert provider.served == 6


async def test_fewer_steps_in_new_code_supersede_the_tail(store: Store) -> None:
    provider = ScriptedProvider()

    def agent(n: int):
        async def fn(ctx: toren.Context, input: Any) -> Any:
            for i in range(n):
                await ctx.model("scripted:echo", [{"role": "user", "content": str(i)}])
            await ctx.wait_for_message("go")
            return n

        return fn

    a = toren.Registry()
    a.add("x", agent(4))
    run = await toren.start_run(store, a, "x")
    await toren.tick(run.id, make_deps(store, a, provider))
    b = toren.Registry()

    async def shorter(ctx: toren.Context, input: Any) -> Any:
        for i in range(2):
            await ctx.model("scripted:echo", [{"role": "user", "content": str(i)}])
        return 2

    b.add("x", shorter)
    await store.send_message(run.id, "go", None, now=0)
    result = await toren.tick(run.id, make_deps(store, b, provider))
    assert result.status == "completed" and provider.served == 4
    inv = [e.payload for e in await store.load_events(run.id) if e.type == "StreamInvalidated"]
    assert len(inv) == 1 and inv[0].from_pos == 2 and inv[0].cause == "stream_ended"


async def test_cancel_waiting_run(store: Store) -> None:
    async def agent(ctx: toren.Context, input: Any) -> Any:
        await ctx.wait_for_message("never")

    reg = toren.Registry()
    reg.add("w", agent)
    deps = make_deps(store, reg, ScriptedProvider())
    run = await toren.start_run(store, reg, "w")
    assert (await toren.tick(run.id, deps)).status == "waiting"
    await store.request_cancel(run.id, now=deps.clock.now())
    result = await toren.tick(run.id, deps)
    assert result.status == "cancelled"
    final = await store.get_run(run.id)
    assert final is not None and final.status == "cancelled"
    assert [e.type for e in await store.load_events(run.id)][-1] == "RunCancelled"


async def test_cancellation_cannot_be_swallowed(store: Store) -> None:
    reached = asyncio.Event()
    after: list[str] = []

    async def stubborn(ctx: toren.Context, input: Any) -> Any:
        try:
            reached.set()
            await asyncio.sleep(30)
        except Exception:
            after.append("swallowed")
        return "finished anyway"

    reg = toren.Registry()
    reg.add("s", stubborn)
    deps = make_deps(store, reg, ScriptedProvider())
    await toren.start_run(store, reg, "s")
    lease = (await store.claim("w1", 1, now=deps.clock.now(), ttl=30))[0]
    runner = toren.core.drivers.tick.TickRunner(deps, lease)
    task = asyncio.ensure_future(runner.run())
    await reached.wait()
    runner.cancel()
    result = await task
    assert result.status == "cancelled" and after == []


async def test_idempotency_key(store: Store) -> None:
    reg = toren.Registry()
    reg.add("chain", chain_agent(1))
    first = await toren.start_run(store, reg, "chain", {"a": 1}, idempotency_key="k-1")
    again = await toren.start_run(store, reg, "chain", {"a": 1}, idempotency_key="k-1")
    assert again.id == first.id
    with pytest.raises(IdempotencyConflict, match="k-1"):
        await toren.start_run(store, reg, "chain", {"a": 2}, idempotency_key="k-1")
    assert len(await store.list_runs()) == 1


async def test_bad_input_and_unknown_agent(store: Store) -> None:
    reg = toren.Registry()
    reg.add("chain", chain_agent(1))
    with pytest.raises(AgentNotFound, match=r"unknown agent 'nope'; known agents: \['chain'\]"):
        await toren.start_run(store, reg, "nope")
    with pytest.raises(AgentNotFound, match="has no process 'other'"):
        await toren.start_run(store, reg, "chain", process="other")
    with pytest.raises(InvalidInput, match="JSON"):
        await toren.start_run(store, reg, "chain", {"when": object()})
    with pytest.raises(InvalidInput, match="JSON"):
        await toren.start_run(store, reg, "chain", float("nan"))
    with pytest.raises(InvalidInput, match="5001 levels deep .* expected at most 64 levels"):
        await toren.start_run(store, reg, "chain", _nested(5_000))
    assert await store.list_runs() == []  # nothing half-written


def _nested(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth):
        node["a"] = node = {}
    return root


async def test_an_output_nested_too_deeply_fails_the_run_with_a_clear_error(
    store: Store,
) -> None:
    async def deep(ctx: toren.Context, input: Any) -> Any:
        return _nested(5_000)

    reg = toren.Registry()
    reg.add("deep", deep)
    run = await toren.start_run(store, reg, "deep")
    result = await toren.tick(run.id, make_deps(store, reg, ScriptedProvider()))
    assert result.status == "failed" and "nested too deeply" in result.error["message"]
    stored = await store.get_run(run.id)
    assert stored is not None and stored.status == "failed"


async def test_agent_missing_on_this_worker_defers_the_run(store: Store) -> None:
    reg = toren.Registry()
    reg.add("chain", chain_agent(1))
    run = await toren.start_run(store, reg, "chain")
    other = toren.Registry()  # a worker that does not know the agent
    result = await toren.tick(run.id, make_deps(store, other, ScriptedProvider()))
    assert result.status == "deferred" and "unknown agent 'chain'" in result.error["message"]
    stored = await store.get_run(run.id)
    assert stored is not None and stored.status == "queued" and stored.error is None
    assert stored.blocked_error is not None
    assert stored.blocked_error["code"] == "agent_not_found" and stored.blocked_attempts == 1
    assert stored.to_dict()["blocked"]["retry_at"] == stored.not_before
    # Nothing lost: a worker that knows the agent completes it once the deferral passes.
    deps = make_deps(store, reg, ScriptedProvider(), clock=toren.ManualClock(stored.not_before + 1))
    assert (await toren.tick(run.id, deps)).status == "completed"


async def test_corrupt_event_payload_is_named(store: Store, db_url: str) -> None:
    reg = toren.Registry()
    reg.add("chain", chain_agent(2))
    run = await toren.start_run(store, reg, "chain")
    await toren.tick(run.id, make_deps(store, reg, ScriptedProvider()))
    await _corrupt(store, db_url, run.id)
    with pytest.raises(CorruptEventLog) as info:
        await store.load_events(run.id)
    assert run.id in str(info.value) and "ModelCallRecorded" in str(info.value)
    assert "not valid JSON" in str(info.value)


async def test_a_tick_that_cannot_read_its_log_tells_live_watchers(
    store: Store, db_url: str
) -> None:
    """No event can record it, so ``toren run`` (a live watcher) learns it from the tick."""

    async def parked(ctx: toren.Context, input: Any) -> Any:
        await chain_agent(1)(ctx, input)
        return await ctx.wait_for_message("go")

    reg = toren.Registry()
    reg.add("parked", parked)
    run = await toren.start_run(store, reg, "parked")
    assert (await toren.tick(run.id, make_deps(store, reg, ScriptedProvider()))).status == (
        "waiting"
    )
    await _corrupt(store, db_url, run.id)
    await store.send_message(run.id, "go", True, now=0.0)  # runnable, with a log to read
    seen: list[dict[str, Any]] = []
    deps = make_deps(store, reg, ScriptedProvider())
    deps = dataclasses.replace(deps, live=lambda run_id, item: seen.append(item))
    with pytest.raises(CorruptEventLog):
        await toren.tick(run.id, deps)
    stalled = [item for item in seen if item["type"] == "stalled"]
    assert len(stalled) == 1 and stalled[0]["error"]["code"] == "corrupt_event_log"


async def _corrupt(store: Store, url: str, run_id: str) -> None:
    sql = (
        "UPDATE events SET payload = '{broken' WHERE seq = (SELECT MIN(seq) FROM events "
        "WHERE run_id = ? AND type = 'ModelCallRecorded')"
    )
    await store._run(lambda cur: store._x(cur, sql, (run_id,)))  # type: ignore[attr-defined]


async def test_unknown_event_types_and_fields_are_ignored(store: Store) -> None:
    reg = toren.Registry()
    reg.add("chain", chain_agent(2))
    run = await toren.start_run(store, reg, "chain")
    provider = ScriptedProvider()

    async def parked(ctx: toren.Context, input: Any) -> Any:
        out = await chain_agent(2)(ctx, input)
        await ctx.wait_for_message("go")
        return out

    reg.add("chain", parked)
    await toren.tick(run.id, make_deps(store, reg, provider))
    # A newer release wrote an event type and a field this one does not know.
    sql_new_type = (
        "INSERT INTO events (run_id, stream, type, created_at, payload) "
        "VALUES (?, 'main', 'FutureThing', 0, '{\"x\": 1}')"
    )
    sql_new_field = (
        "UPDATE events SET payload = REPLACE(payload, '\"provider\"', "
        "'\"future_field\":42,\"provider\"') WHERE run_id = ? AND type = 'ModelCallRecorded'"
    )
    await store._run(lambda cur: store._x(cur, sql_new_type, (run.id,)))  # type: ignore[attr-defined]
    await store._run(lambda cur: store._x(cur, sql_new_field, (run.id,)))  # type: ignore[attr-defined]
    await store.send_message(run.id, "go", None, now=0)
    result = await toren.tick(run.id, make_deps(store, reg, provider))
    assert result.status == "completed" and provider.served == 2 and result.invalidations == 0
    events = await store.load_events(run.id)
    assert any(e.type == "FutureThing" for e in events)
    assert json.loads(next(e for e in events if e.type == "FutureThing").payload_json()) == {"x": 1}


async def test_failed_steps_are_recorded_and_replayed(store: Store) -> None:
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        raise RuntimeError("disk full")

    async def agent(ctx: toren.Context, input: Any) -> Any:
        try:
            await ctx.tool("flaky")
        except toren.ToolFailed as exc:
            first = exc.message
        try:
            await ctx.tool("missing")
        except toren.ToolFailed as exc:
            second = exc.details["code"]
        await ctx.wait_for_message("go")
        return [first, second]

    reg = toren.Registry()
    reg.add("f", agent, tools={"flaky": toren.ToolDef("flaky", flaky, ToolSpec("flaky"))})
    deps = make_deps(store, reg, ScriptedProvider())
    run = await toren.start_run(store, reg, "f")
    assert (await toren.tick(run.id, deps)).status == "waiting"
    await store.send_message(run.id, "go", None, now=0)
    result = await toren.tick(run.id, deps)
    assert result.status == "completed"
    assert result.output == ["tool 'flaky' failed: disk full", "unknown_tool"]
    assert len(calls) == 1  # the recorded failure replayed; the tool did not run again


async def test_conversation_history_is_stored_once(store: Store) -> None:
    """A growing conversation stores each message once: the size of what a step records
    does not grow with the history, and the full request can be read back."""
    from toren.core.drivers.history import load_messages
    from toren.providers.base import Message

    async def agent(ctx: toren.Context, input: Any) -> Any:
        history: list[Any] = [Message(role="system", content="s" * 500)]
        for i in range(120):
            history.append({"role": "user", "content": f"question {i} " + "q" * 300})
            history.append((await ctx.model("scripted:echo", history)).message())
        return len(history)

    reg = toren.Registry()
    reg.add("conv", agent)
    run = await toren.start_run(store, reg, "conv")
    assert (await toren.tick(run.id, make_deps(store, reg, ScriptedProvider()))).output == 241
    calls = [e for e in await store.load_events(run.id) if e.type == "ModelCallRecorded"]
    sizes = [len(e.payload_json()) for e in calls]
    assert max(sizes[100:]) < 1.2 * max(sizes[5:15])  # O(1) per step, not O(history)
    nodes = await store.get_blobs([c.payload.message_list for c in calls])
    assert all(len(node["items"]) <= 2 for node in list(nodes.values())[1:])
    last = calls[-1].payload
    messages = await load_messages(store, last.message_list)
    assert len(messages) == last.message_count == 240
    assert messages[0] == {"role": "system", "content": "s" * 500}
    assert messages[-1]["content"].startswith("question 119")


async def test_a_busy_run_does_not_starve_the_event_loop(store: Store) -> None:
    """Steps that never wait on I/O (clock reads) commit back to back. SQLite may commit
    such a step inline, without a turn of the loop, but only for a few milliseconds at a
    time: a timer (a heartbeat, another run, the HTTP API) still gets its turn mid-run."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)  # a timer: only a turn of the loop can fire it
            ticks += 1

    seen: dict[str, int] = {}

    async def busy(ctx: toren.Context, input: Any) -> Any:
        seen["start"] = ticks
        for _ in range(1500):
            await ctx.now()
        seen["end"] = ticks
        return None

    reg = toren.Registry()
    reg.add("busy", busy)
    task = asyncio.create_task(ticker())
    try:
        run = await toren.start_run(store, reg, "busy")
        result = await toren.tick(run.id, make_deps(store, reg, ScriptedProvider()))
    finally:
        task.cancel()
    assert result.status == "completed"
    assert seen["end"] > seen["start"], "the timer never fired while the run was stepping"


async def test_a_finished_tick_frees_its_log_without_the_cycle_collector(store: Store) -> None:
    """A tick holds its run's whole log. Nothing may point back at the tick when it ends
    (the agent task, a per-step helper): its events must be freed by reference counting
    at once, not linger until the cycle collector's next full pass (a long replay would
    otherwise leave hundreds of thousands of objects for every later collection).

    With the collector off, events caught in a cycle would stay for good; events that are
    merely still referenced go when the reference does. One such reference outlives the
    tick by a moment on PostgreSQL: a transaction runs on a thread of the store's executor,
    and that thread drops its work item (the function and arguments, which hold the
    events) only after it has handed the result to the loop (``concurrent.futures``'
    worker: ``work_item.run()``, then ``del work_item``). The loop may resume the tick and
    this test before that thread runs again, which on a loaded machine takes a while. So
    the test waits, with a deadline, for the events to go, rather than looking once."""
    import gc
    import time

    from toren.core.contract.events import Event

    def alive(run_id: str) -> int:
        return sum(1 for o in gc.get_objects() if isinstance(o, Event) and o.run_id == run_id)

    async def then_wait(ctx: toren.Context, input: Any) -> Any:
        await chain_agent(20)(ctx, input)
        return await ctx.wait_for_message("go")  # parks: the agent task is cancelled

    reg = toren.Registry()
    reg.add("chain", then_wait)
    deps = make_deps(store, reg, ScriptedProvider())
    run = await toren.start_run(store, reg, "chain")
    gc.collect()
    gc.disable()
    try:
        result = await toren.tick(run.id, deps)
        assert result.status == "waiting"
        del result
        deadline = time.monotonic() + 10
        while (left := alive(run.id)) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # callbacks the last commit scheduled, other threads run
        assert left == 0, f"{left} events of the finished tick are still alive"
    finally:
        gc.enable()


async def test_a_message_sent_after_the_timeout_does_not_beat_it(store: Store) -> None:
    """The worker resumes the run only after both the timeout and a message sent later:
    the timeout came first, so the wait returns None and the message waits for the next
    wait on its name."""
    clock = toren.ManualClock()

    async def agent(ctx: toren.Context, input: Any) -> Any:
        first = await ctx.wait_for_message("reply", timeout=60)
        second = await ctx.wait_for_message("reply")
        return [first, second]

    reg = toren.Registry()
    reg.add("r", agent)
    deps = make_deps(store, reg, ScriptedProvider(), clock=clock)
    run = await toren.start_run(store, reg, "r", clock=clock)
    assert (await toren.tick(run.id, deps)).status == "waiting"
    await clock.advance(90)  # the worker was away past the deadline...
    await store.send_message(run.id, "reply", "late", now=clock.now())  # ...and this came
    result = await toren.tick(run.id, deps)
    assert result.status == "completed", result
    assert result.output == [None, "late"]
