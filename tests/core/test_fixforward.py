"""Retry and fork on the engine, on both backends: what a retry runs again and what it
replays, limits raised by a retry, retried children, tracebacks, and forks from a step
(the prefix replays, the rest runs live, the source run is not touched)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

import toren
from toren.core.agent_api.program import raised
from toren.core.contract.events import RunFailed, RunForked, RunRetried, ToolCallRecorded
from toren.core.contract.replay import RunLog
from toren.core.drivers.fixforward import fork_run, retry_run
from toren.errors import InvalidInput, RunNotRetryable
from toren.providers.base import ToolSpec
from toren.providers.scripted import ScriptedProvider
from toren.store import Store
from toren.store.sql import EVENT_COLUMNS


class Desk:
    """Tools with side effects that count what they did: an outbox and a report filer
    that is broken until fixed."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.filed: list[str] = []
        self.broken = True

    def tools(self) -> dict[str, toren.ToolDef]:
        def send_email(body: str) -> dict[str, Any]:
            self.sent.append(body)
            return {"status": "sent", "n": len(self.sent)}

        def file_report(text: str) -> dict[str, Any]:
            if self.broken:
                raise KeyError("report_queue")
            self.filed.append(text)
            return {"filed": True}

        return {
            "send_email": toren.ToolDef("send_email", send_email, ToolSpec("send_email")),
            "file_report": toren.ToolDef("file_report", file_report, ToolSpec("file_report")),
        }


async def emails_then_report(ctx: toren.Context, input: Any) -> Any:
    """Three model calls, an email after each of the first two, then a report."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    reply = None
    for i in range(3):
        reply = await ctx.model("scripted:echo", messages)
        messages.append(reply.message())
        if i < 2:
            sent = await ctx.tool("send_email", {"body": f"update {i}"})
            messages.append({"role": "user", "content": json.dumps(sent)})
    assert reply is not None
    report = await ctx.tool("file_report", {"text": reply.text})
    return {"answer": reply.text, "report": report}


def deps(store: Store, reg: toren.Registry, provider: ScriptedProvider, **kw: Any) -> Any:
    return toren.TickDeps(store=store, agents=reg, providers={"scripted": provider}, **kw)


async def log_bytes(store: Store, run_id: str) -> list[tuple[Any, ...]]:
    """A run's log exactly as stored: every column of every row, the payload as the text
    in the database (not parsed and written again)."""
    sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? ORDER BY seq"
    rows = await store._event_rows(sql, (run_id,))  # type: ignore[attr-defined]
    assert rows and all(isinstance(r[12], str) for r in rows)
    return [tuple(r) for r in rows]


async def test_a_failed_tool_is_retried_under_fixed_code_without_paying_again(
    store: Store,
) -> None:
    desk = Desk()
    provider = ScriptedProvider()
    v1 = toren.Registry()
    v1.add("desk", emails_then_report, tools=desk.tools(), code_version="v1")
    run = await toren.start_run(store, v1, "desk", None)
    result = await toren.tick(run.id, deps(store, v1, provider))
    assert result.status == "failed"
    assert provider.served == 3 and desk.sent == ["update 0", "update 1"]
    failed = await store.get_run(run.id)
    assert failed is not None and failed.error is not None
    assert failed.error["type"] == "ToolFailed" and "report_queue" in failed.error["message"]
    # The tool's traceback is stored with the error: its own frame, not Toren's.
    trace = failed.error["traceback"]
    assert "in file_report" in trace and "KeyError: 'report_queue'" in trace
    assert "toren/core" not in trace
    events = await store.load_events(run.id)
    tool_failure = next(e for e in events if e.type == "ToolCallRecorded" and e.payload.error)  # type: ignore[attr-defined]
    assert "in file_report" in tool_failure.payload.error["traceback"]  # type: ignore[attr-defined]
    end = events[-1].payload
    assert isinstance(end, RunFailed) and end.failed_seqs == [tool_failure.seq]

    desk.broken = False  # the fix, deployed as v2
    v2 = toren.Registry()
    v2.add("desk", emails_then_report, tools=desk.tools(), code_version="v2")
    queued = await retry_run(store, v2, run.id)
    assert (queued.status, queued.error, queued.retries) == ("queued", None, 1)
    result = await toren.tick(run.id, deps(store, v2, provider))
    assert result.status == "completed", result.error
    assert provider.served == 3  # the three model calls replayed, none paid again
    assert desk.sent == ["update 0", "update 1"]  # no email sent twice
    assert desk.filed == ['{"status": "sent", "n": 2}']  # the third reply, echoed
    done = await store.get_run(run.id)
    assert done is not None and done.status == "completed" and done.retries == 1
    # Append-only: the failure and RunFailed are still in the log, followed by the retry.
    after = await store.load_events(run.id)
    assert [e.to_dict() for e in after[: len(events)]] == [e.to_dict() for e in events]
    types = [e.type for e in after[len(events) :]]
    assert types == ["RunRetried", "ToolCallRecorded", "RunCompleted"]
    retried = after[len(events)].payload
    assert isinstance(retried, RunRetried)
    assert retried.retried_seqs == [tool_failure.seq] and retried.error == failed.error
    assert after[-1].slot == "run:end~1" and after[-2].slot.endswith("~1")  # type: ignore[union-attr]
    # The fold of the whole log: finished, the retried step in the failed one's place.
    folded = RunLog.fold(run.id, after)
    assert folded.terminal is not None and folded.terminal.type == "RunCompleted"
    main = folded.streams["main"]
    assert sorted(main.steps) == [0, 1, 2, 3, 4, 5] and main.steps[5].first.seq > after[-4].seq


async def test_a_retry_that_fails_again_can_be_retried_again(store: Store) -> None:
    desk = Desk()
    provider = ScriptedProvider()
    reg = toren.Registry()
    reg.add("desk", emails_then_report, tools=desk.tools())
    run = await toren.start_run(store, reg, "desk", None)
    assert (await toren.tick(run.id, deps(store, reg, provider))).status == "failed"
    await retry_run(store, reg, run.id)
    assert (await toren.tick(run.id, deps(store, reg, provider))).status == "failed"
    desk.broken = False
    queued = await retry_run(store, reg, run.id)
    assert queued.retries == 2
    assert (await toren.tick(run.id, deps(store, reg, provider))).status == "completed"
    assert provider.served == 3 and len(desk.sent) == 2 and len(desk.filed) == 1
    slots = [e.slot for e in await store.load_events(run.id) if e.stream == ""]
    assert slots == [
        "run:start",
        "run:end",
        "run:retry:1",
        "run:end~1",
        "run:retry:2",
        "run:end~2",
    ]


async def test_only_a_failed_run_is_retryable(store: Store) -> None:
    provider = ScriptedProvider()
    reg = toren.Registry()

    async def one_call(ctx: toren.Context, input: Any) -> Any:
        return (await ctx.model("scripted:echo", [{"role": "user", "content": "x"}])).text

    reg.add("one", one_call)
    done = await toren.start_run(store, reg, "one")
    await toren.tick(done.id, deps(store, reg, provider))
    with pytest.raises(RunNotRetryable, match="completed; there is nothing to retry.*fork"):
        await retry_run(store, reg, done.id)
    queued = await toren.start_run(store, reg, "one")
    with pytest.raises(RunNotRetryable, match="is queued, not failed"):
        await retry_run(store, reg, queued.id)
    await store.request_cancel(queued.id, now=0)
    assert (await toren.tick(queued.id, deps(store, reg, provider))).status == "cancelled"
    with pytest.raises(RunNotRetryable, match="cancelled; a cancelled run is final"):
        await retry_run(store, reg, queued.id)
    with pytest.raises(toren.RunNotFound):
        await retry_run(store, reg, "run_nope")


async def test_a_retry_may_raise_the_budget_never_lower_it(store: Store) -> None:
    provider = ScriptedProvider()
    reg = toren.Registry()

    async def five_calls(ctx: toren.Context, input: Any) -> Any:
        for i in range(5):
            await ctx.model("scripted:echo", [{"role": "user", "content": f"call {i}"}])
        return "done"

    reg.add("spender", five_calls, limits=toren.Limits(max_cost_usd=0.025))
    priced = deps(store, reg, provider, pricing=lambda model, usage: Decimal("0.01"))
    run = await toren.start_run(store, reg, "spender")
    failed = await toren.tick(run.id, priced)
    assert failed.status == "failed" and failed.error["code"] == "limit_exceeded"  # type: ignore[index]
    assert provider.served == 3
    # Asking for less than the agent's own limit changes nothing: it fails again at once.
    await retry_run(store, reg, run.id, max_cost_usd=0.01)
    assert (await toren.tick(run.id, priced)).status == "failed"
    assert provider.served == 3
    with pytest.raises(InvalidInput, match="max_cost_usd must be a positive number"):
        await retry_run(store, reg, run.id, max_cost_usd=-1)
    await retry_run(store, reg, run.id, max_cost_usd=0.1)
    result = await toren.tick(run.id, priced)
    assert result.status == "completed", result.error
    assert provider.served == 5  # the three paid calls replayed, two more made
    # The log holds the raised limits as integers (nano-USD), never a float.
    retried = [e.payload for e in await store.load_events(run.id) if e.type == "RunRetried"]
    assert [r.raise_limits for r in retried] == [  # type: ignore[attr-defined]
        {"max_cost_nanousd": 10_000_000},
        {"max_cost_nanousd": 100_000_000},
    ]


async def test_retry_limits_are_integers_end_to_end(store: Store) -> None:
    reg = toren.Registry()

    async def fails(ctx: toren.Context, input: Any) -> Any:
        raise RuntimeError("no")

    reg.add("fails", fails)
    run = await toren.start_run(store, reg, "fails")
    await toren.tick(run.id, deps(store, reg, ScriptedProvider()))
    for bad in (3.5, True, 0, "7", float("inf")):
        with pytest.raises(InvalidInput, match="max_steps must be a positive whole number"):
            await retry_run(store, reg, run.id, max_steps=bad)  # type: ignore[arg-type]
    for cost in ("abc", float("nan"), float("inf"), 0, True, "-0.5"):
        with pytest.raises(InvalidInput, match="max_cost_usd must be a positive number"):
            await retry_run(store, reg, run.id, max_cost_usd=cost)  # type: ignore[arg-type]
    # 0.1 + 0.2 as a float is 0.30000000000000004: read as the decimal it spells, in nano.
    await retry_run(store, reg, run.id, max_steps=7.0, max_cost_usd=0.1 + 0.2)  # type: ignore[arg-type]
    (event,) = [e for e in await store.load_events(run.id) if e.type == "RunRetried"]
    assert json.loads(event.payload_json())["raise_limits"] == {
        "max_steps": 7,
        "max_cost_nanousd": 300_000_000,
    }
    assert '"max_steps":7,' in event.payload_json().replace(" ", "")


def test_an_older_log_with_float_limits_still_raises_them() -> None:
    """Logs of earlier releases hold the limits as numbers (max_steps 3.0) and the cost in
    USD (max_cost_usd 3.0): they are read as integers and still raise the limits."""
    old = RunRetried(raise_limits={"max_steps": 3.0, "max_cost_usd": 3.0})
    newer = RunRetried(raise_limits={"max_cost_nanousd": 2_000_000_000, "max_turns": 9})
    log = RunLog("run_old")
    log._retry(old)
    log._retry(newer)
    assert log.raised_limits == {"max_steps": 3, "max_cost_nanousd": 3_000_000_000}
    limits = raised(toren.Limits(max_steps=2, max_cost_usd=Decimal("1.5")), log.raised_limits)
    assert limits.max_steps == 3 and limits.max_cost_usd == Decimal("3")
    assert raised(toren.Limits(max_steps=5), log.raised_limits) == toren.Limits(max_steps=5)


async def test_a_failed_child_resumes_on_retry(store: Store) -> None:
    desk = Desk()
    provider = ScriptedProvider()
    reg = toren.Registry()

    async def parent(ctx: toren.Context, input: Any) -> Any:
        first = await ctx.model("scripted:echo", [{"role": "user", "content": "parent"}])
        child = await ctx.spawn("reporter", {"text": first.text})
        return {"child": child}

    async def reporter(ctx: toren.Context, input: Any) -> Any:
        reply = await ctx.model("scripted:echo", [{"role": "user", "content": input["text"]}])
        await ctx.tool("send_email", {"body": reply.text})
        return await ctx.tool("file_report", {"text": reply.text})

    reg.add("p", parent, tools=desk.tools())
    reg.add("p", reporter, process="reporter", tools=desk.tools())
    run = await toren.start_run(store, reg, "p")
    result = await toren.tick(run.id, deps(store, reg, provider))
    assert result.status == "failed" and provider.served == 2 and desk.sent == ["parent"]
    end = (await store.load_events(run.id))[-1].payload
    assert isinstance(end, RunFailed) and len(end.failed_seqs) == 2  # child done + its tool
    assert "in file_report" in result.error["traceback"]  # type: ignore[index]
    desk.broken = False
    await retry_run(store, reg, run.id)
    result = await toren.tick(run.id, deps(store, reg, provider))
    assert result.status == "completed", result.error
    assert result.output == {"child": {"filed": True}}
    assert provider.served == 2 and desk.sent == ["parent"] and desk.filed == ["parent"]


async def test_agent_code_that_raised_runs_again_and_its_traceback_is_kept(
    store: Store,
) -> None:
    provider = ScriptedProvider()
    fixed = False

    async def flaky(ctx: toren.Context, input: Any) -> Any:
        reply = await ctx.model("scripted:echo", [{"role": "user", "content": "hello"}])
        if not fixed:
            _helper_that_breaks(reply.text)
        return reply.text

    reg = toren.Registry()
    reg.add("flaky", flaky)
    run = await toren.start_run(store, reg, "flaky")
    result = await toren.tick(run.id, deps(store, reg, provider))
    assert result.status == "failed"
    trace = result.error["traceback"]  # type: ignore[index]
    assert "in flaky" in trace and "in _helper_that_breaks" in trace
    assert "ZeroDivisionError" in trace and "toren/core" not in trace
    stored = await store.get_run(run.id)
    assert stored is not None and stored.error == result.error
    end = (await store.load_events(run.id))[-1].payload
    assert isinstance(end, RunFailed) and end.failed_seqs == []
    fixed = True
    await retry_run(store, reg, run.id)
    result = await toren.tick(run.id, deps(store, reg, provider))
    assert result.status == "completed" and provider.served == 1


def _helper_that_breaks(text: str) -> None:
    secret = "sk-" + "a" * 30
    raise ZeroDivisionError(f"cannot divide {text!r} (key {secret})")


async def test_tracebacks_are_redacted(store: Store) -> None:
    provider = ScriptedProvider()
    reg = toren.Registry()

    async def leaks(ctx: toren.Context, input: Any) -> Any:
        _helper_that_breaks("x")

    reg.add("leaks", leaks)
    run = await toren.start_run(store, reg, "leaks")
    result = await toren.tick(run.id, deps(store, reg, provider))
    assert "sk-aaaa" not in json.dumps(result.error) and "[redacted]" in result.error["traceback"]  # type: ignore[index]


def six_calls(prompt: str) -> Any:
    async def agent(ctx: toren.Context, input: Any) -> Any:
        messages: list[dict[str, Any]] = [{"role": "system", "content": prompt}]
        for i in range(6):
            messages.append({"role": "user", "content": f"{input} {i}"})
            reply = await ctx.model("scripted:echo", messages)
            messages.append(reply.message())
        return messages[-1]["content"]

    return agent


async def test_fork_replays_the_prefix_and_runs_the_rest_live(store: Store) -> None:
    provider = ScriptedProvider()
    v1 = toren.Registry()
    v1.add("six", six_calls("be brief"), code_version="v1")
    source = await toren.start_run(store, v1, "six", "q")
    assert (await toren.tick(source.id, deps(store, v1, provider))).status == "completed"
    assert provider.served == 6
    before_log = await log_bytes(store, source.id)
    before_row = await store.get_run(source.id)

    v2 = toren.Registry()
    v2.add("six", six_calls("be thorough"), code_version="v2")  # an edited prompt
    fork = await fork_run(store, v2, source.id, at="main:2")
    assert fork.forked_from == source.id and fork.forked_at == "main:2"
    assert fork.to_dict()["forked_from"] == {"run_id": source.id, "at": "main:2"}
    ledger = provider.served
    result = await toren.tick(fork.id, deps(store, v2, provider))
    assert result.status == "completed", result.error
    assert provider.served - ledger == 4  # positions 2-5, live; 0 and 1 replayed
    assert result.replayed == 2 and result.invalidations == 0
    events = await store.load_events(fork.id)
    assert [e.type for e in events][:4] == [
        "RunStarted",
        "RunForked",
        "ModelCallRecorded",
        "ModelCallRecorded",
    ]
    marker = events[1].payload
    assert isinstance(marker, RunForked)
    assert (marker.source_run, marker.stream, marker.position) == (source.id, "main", 2)
    live = [e for e in events if e.type == "ModelCallRecorded"][2:]
    assert all(e.code_version == "v2" for e in live)
    # The source is untouched, byte for byte.
    assert await log_bytes(store, source.id) == before_log
    assert await store.get_run(source.id) == before_row


async def test_fork_with_a_new_input_and_at_the_start(store: Store) -> None:
    provider = ScriptedProvider()
    reg = toren.Registry()
    reg.add("six", six_calls("p"))
    source = await toren.start_run(store, reg, "six", "q")
    await toren.tick(source.id, deps(store, reg, provider))
    fork = await fork_run(store, reg, source.id, at="main:0", input="other")
    assert fork.input == "other"
    result = await toren.tick(fork.id, deps(store, reg, provider))
    assert result.output == "other 5" and provider.served == 12
    whole = await fork_run(store, reg, source.id, at="main:6")
    result = await toren.tick(whole.id, deps(store, reg, provider))
    assert result.output == "q 5" and provider.served == 12


async def test_fork_points_are_checked(store: Store) -> None:
    provider = ScriptedProvider()
    reg = toren.Registry()
    reg.add("six", six_calls("p"))
    source = await toren.start_run(store, reg, "six", "q")
    await toren.tick(source.id, deps(store, reg, provider))
    for at, message in [
        ("main", "is not STREAM:POSITION"),
        ("main:x", "is not STREAM:POSITION"),
        ("main:7", "has 6 steps"),
        ("other:0", "has no stream 'other'"),
        ("main/3:0", "has no stream 'main/3'"),
    ]:
        with pytest.raises(InvalidInput, match=message):
            await fork_run(store, reg, source.id, at=at)
    with pytest.raises(toren.RunNotFound):
        await fork_run(store, reg, "run_nope", at="main:0")


async def test_fork_inside_a_child_stream(store: Store) -> None:
    desk = Desk()
    desk.broken = False
    provider = ScriptedProvider()
    reg = toren.Registry()

    async def parent(ctx: toren.Context, input: Any) -> Any:
        await ctx.model("scripted:echo", [{"role": "user", "content": "plan"}])
        await ctx.tool("send_email", {"body": "starting"})
        out = await ctx.spawn("worker", {"n": 3})
        await ctx.model("scripted:echo", [{"role": "user", "content": "wrap up"}])
        return out

    async def worker(ctx: toren.Context, input: Any) -> Any:
        texts = []
        for i in range(input["n"]):
            texts.append(
                (await ctx.model("scripted:echo", [{"role": "user", "content": f"w{i}"}])).text
            )
        return texts

    reg.add("p", parent, tools=desk.tools())
    reg.add("p", worker, process="worker", tools=desk.tools())
    source = await toren.start_run(store, reg, "p")
    assert (await toren.tick(source.id, deps(store, reg, provider))).status == "completed"
    assert provider.served == 5
    fork = await fork_run(store, reg, source.id, at="main/2:1")
    result = await toren.tick(fork.id, deps(store, reg, provider))
    assert result.status == "completed", result.error
    assert result.output == ["w0", "w1", "w2"]
    # Live: the child's steps 1 and 2 and the parent's step after the spawn.
    assert provider.served == 5 + 3
    assert desk.sent == ["starting"]  # the parent's email is part of the copied prefix
    copied = [
        e for e in await store.load_events(fork.id) if isinstance(e.payload, ToolCallRecorded)
    ]
    assert copied[0].payload.reused_from_seq is None


class Outage:
    """A provider that is down (fails every call, as after its retries) until restored."""

    name = "flaky"

    def __init__(self) -> None:
        self.down = True
        self.calls = 0

    async def complete(self, request: Any, *, on_delta: Any = None) -> Any:
        from toren.errors import ModelCallFailed
        from toren.providers.base import ModelResponse

        self.calls += 1
        if self.down:
            raise ModelCallFailed("upstream 503 after 3 retries", status=503)
        return ModelResponse(text="back")


async def test_a_model_call_that_failed_after_its_retries_runs_again(store: Store) -> None:
    outage = Outage()
    scripted = ScriptedProvider()
    reg = toren.Registry()

    async def two_models(ctx: toren.Context, input: Any) -> Any:
        first = await ctx.model("scripted:echo", [{"role": "user", "content": "one"}])
        second = await ctx.model("flaky:m", [{"role": "user", "content": first.text}])
        return second.text

    reg.add("two", two_models)
    both = toren.TickDeps(
        store=store, agents=reg, providers={"scripted": scripted, "flaky": outage}
    )  # type: ignore[dict-item]
    run = await toren.start_run(store, reg, "two")
    failed = await toren.tick(run.id, both)
    assert failed.status == "failed" and failed.error["type"] == "ModelCallFailed"  # type: ignore[index]
    assert (scripted.served, outage.calls) == (1, 1)
    outage.down = False
    await retry_run(store, reg, run.id)
    done = await toren.tick(run.id, both)
    assert done.status == "completed" and done.output == "back"
    assert (scripted.served, outage.calls) == (1, 2)  # only the failed call again


async def test_two_retries_at_once_make_one(store: Store) -> None:
    import asyncio

    desk = Desk()
    reg = toren.Registry()
    reg.add("desk", emails_then_report, tools=desk.tools())
    run = await toren.start_run(store, reg, "desk")
    await toren.tick(run.id, deps(store, reg, ScriptedProvider()))
    outcomes = await asyncio.gather(
        retry_run(store, reg, run.id), retry_run(store, reg, run.id), return_exceptions=True
    )
    assert sorted(type(o).__name__ for o in outcomes) == ["RunNotRetryable", "RunRecord"]
    events = await store.load_events(run.id)
    assert [e.type for e in events].count("RunRetried") == 1
    stored = await store.get_run(run.id)
    assert stored is not None and stored.retries == 1
