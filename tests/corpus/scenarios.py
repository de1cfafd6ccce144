"""The corpus: named, deterministic scenario runs of the engine.

Each scenario is an agent program under code version ``A`` (and often a version ``B``:
an edited prompt, a changed tool argument, a removed, added or moved step, a changed
spawn order, a fixed tool...) and a script that starts runs, ticks them under a version,
sends messages, moves the clock (a ManualClock: nothing sleeps), cancels, retries, forks
and registers workers. ``record.py`` runs every scenario on SQLite and PostgreSQL and
writes what the database holds afterwards to ``tests/fixtures/corpus/<name>.json``.

Rules that keep a scenario deterministic: no value of ``ctx.random()`` or ``ctx.uuid()``
flows into a later step (they are normalised out of the fixture); concurrent branches
(``asyncio.gather``) use async tools that finish in an order fixed by the event loop,
one step per branch; every run ends completed, failed, cancelled or waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import toren
from toren.core.agent_api.program import AgentFn
from toren.providers.base import ToolSpec

from .harness import Build, Harness, Scenario, World

SCENARIOS: dict[str, Scenario] = {}
AGENT = "corpus"


def scenario(
    name: str, features: tuple[str, ...], **versions: Build
) -> Callable[[Callable[[Harness], Any]], Callable[[Harness], Any]]:
    def add(script: Callable[[Harness], Any]) -> Callable[[Harness], Any]:
        assert name not in SCENARIOS, name
        doc = " ".join((script.__doc__ or "").split())
        SCENARIOS[name] = Scenario(name, doc, features, versions, script)
        return script

    return add


# -- tools ----------------------------------------------------------------------------------


def tools_of(world: World, *, broken: bool = False) -> dict[str, toren.ToolDef]:
    """The tools every scenario's agent has. Each counts its executions in ``world``."""

    def send_email(to: str, body: str) -> dict[str, Any]:
        world.calls.append("send_email")
        world.sent.append({"to": to, "body": body})
        return {"status": "sent", "n": len(world.sent)}

    def lookup(key: str) -> dict[str, Any]:
        world.calls.append("lookup")
        return {"key": key, "reads": world.calls.count("lookup")}

    def price() -> int:
        world.calls.append("price")
        return 100 + world.calls.count("price")

    def file_report(text: str) -> dict[str, Any]:
        world.calls.append("file_report")
        if broken:
            raise KeyError("report_queue")
        return {"filed": text}

    async def add(a: int, b: int) -> int:
        world.calls.append("add")
        return a + b

    async def slow(name: str, turns: int) -> str:
        world.calls.append("slow")
        for _ in range(turns):
            await asyncio.sleep(0)
        return name

    async def hang(step: str) -> str:
        world.calls.append("hang")
        if world.hanging is not None:  # the worker dies while this runs (Harness.crash)
            world.hanging.set()
            await asyncio.Event().wait()
        return f"done {step}"

    async def stall() -> None:
        world.calls.append("stall")
        await asyncio.Event().wait()  # never returns: limits.step_timeout ends it

    return {
        "hang": toren.ToolDef("hang", hang, ToolSpec("hang")),
        "stall": toren.ToolDef("stall", stall, ToolSpec("stall")),
        "send_email": toren.ToolDef("send_email", send_email, ToolSpec("send_email")),
        "lookup": toren.ToolDef("lookup", lookup, ToolSpec("lookup"), side_effects=False),
        "price": toren.ToolDef("price", price, ToolSpec("price"), reexecute=True),
        "file_report": toren.ToolDef("file_report", file_report, ToolSpec("file_report")),
        "add": toren.ToolDef("add", add, ToolSpec("add")),
        "slow": toren.ToolDef("slow", slow, ToolSpec("slow")),
    }


def v(
    version: str,
    main: AgentFn,
    *,
    children: Mapping[str, AgentFn] | None = None,
    broken: bool = False,
    limits: toren.Limits | None = None,
) -> Build:
    """A code version: the agent's ``main`` process, its other processes, its tools."""

    def build(world: World) -> toren.Registry:
        reg = toren.Registry()
        tools = tools_of(world, broken=broken)
        reg.add(AGENT, main, tools=tools, code_version=version, limits=limits)
        for process, fn in (children or {}).items():
            reg.add(AGENT, fn, process=process, tools=tools, code_version=version, limits=limits)
        return reg

    return build


async def ask(ctx: toren.Context, text: str) -> str:
    reply = await ctx.model("scripted:echo", [{"role": "user", "content": text}])
    return reply.text


def chain(
    n: int, edits: Mapping[int, str] | None = None, *, email_at: int | None = None
) -> AgentFn:
    """``n`` model calls in one growing conversation; step ``i`` carries ``edits[i]``.
    With ``email_at``, an email follows that step."""

    async def main(ctx: toren.Context, input: Any) -> Any:
        messages: list[Any] = [{"role": "system", "content": "count"}]
        for i in range(n):
            text = f"step {i}" + (f" {edits[i]}" if edits and i in edits else "")
            messages.append({"role": "user", "content": text})
            reply = await ctx.model("scripted:echo", messages)
            messages.append(reply.message())
            if email_at == i:
                await ctx.tool("send_email", {"to": "ann@example.com", "body": reply.text})
        return {"last": messages[-1]["content"], "steps": n}

    return main


def parked(fn: AgentFn, name: str = "go") -> AgentFn:
    """``fn``, then a wait for a message: the run stays in flight until it comes."""

    async def main(ctx: toren.Context, input: Any) -> Any:
        out = await fn(ctx, input)
        await ctx.wait_for_message(name)
        return out

    return main


# -- every step kind, one version ---------------------------------------------------------


@scenario("model_chain", ("model", "blobs", "conversation history"), A=v("A", chain(4)))
async def model_chain(h: Harness) -> None:
    """Four model calls in one growing conversation: each stores its new messages and one
    list node; a second tick of the finished run is not claimed."""
    run = await h.start("A", {"q": 1})
    await h.tick(run, "A")
    await h.tick(run, "A")


async def _tools(ctx: toren.Context, input: Any) -> Any:
    sent = await ctx.tool("send_email", {"to": "bo@example.com", "body": "hi ✓"})
    found = await ctx.tool("lookup", {"key": "order-17"})
    total = await ctx.tool("add", {"a": 2, "b": 40})
    return {"sent": sent, "found": found, "total": total, "nested": [{"x": [1, 2.5, None]}]}


@scenario("tool_calls", ("tool", "side-effect-free tool", "async tool"), A=v("A", _tools))
async def tool_calls(h: Harness) -> None:
    """Three tool calls (a side effect, a read, an async tool) and a nested output."""
    run = await h.start("A")
    await h.tick(run, "A")


async def _values(ctx: toren.Context, input: Any) -> Any:
    now = await ctx.now()
    await ctx.random()
    await ctx.uuid()
    later = await ctx.now()
    return {"now": now, "same": later == now}


@scenario("value_steps", ("value",), A=v("A", _values))
async def value_steps(h: Harness) -> None:
    """Clock, random and uuid values are recorded (their values do not flow onwards)."""
    run = await h.start("A")
    await h.tick(run, "A")


async def _sleeper(ctx: toren.Context, input: Any) -> Any:
    before = await ctx.now()
    await ctx.sleep(3600)
    await ctx.sleep(90.5)
    after = await ctx.now()
    return after - before


@scenario("durable_sleep", ("sleep", "timer", "park"), A=v("A", _sleeper))
async def durable_sleep(h: Harness) -> None:
    """Two durable sleeps (an int and a float duration) park the run; a tick before the
    timer is due is not claimed."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.tick(run, "A")  # not due: not claimed
    await h.advance(3600)
    await h.tick(run, "A")
    await h.advance(100)
    await h.tick(run, "A")


async def _approval(ctx: toren.Context, input: Any) -> Any:
    draft = await ask(ctx, "draft the reply")
    ok = await ctx.wait_for_message("approval")
    return {"draft": draft, "approval": ok}


@scenario("message_wait", ("message wait", "park", "inbox"), A=v("A", _approval))
async def message_wait(h: Harness) -> None:
    """A wait without a timeout parks the run on its inbox; the message wakes it."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "approval", {"by": "ann", "ok": True})
    await h.tick(run, "A")


async def _timeout(ctx: toren.Context, input: Any) -> Any:
    first = await ctx.wait_for_message("reply", timeout=300)
    second = await ctx.wait_for_message("reply", timeout=600.0)
    return [first, second]


@scenario("message_timeout", ("message wait with timeout", "timer"), A=v("A", _timeout))
async def message_timeout(h: Harness) -> None:
    """The first timed wait times out (None); the second receives a message in time."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.advance(301)
    await h.tick(run, "A")
    await h.advance(10)
    await h.send(run, "reply", "in time")
    await h.tick(run, "A")


async def _late(ctx: toren.Context, input: Any) -> Any:
    first = await ctx.wait_for_message("reply", timeout=60)
    second = await ctx.wait_for_message("reply")
    return [first, second]


@scenario("message_after_timeout", ("message wait with timeout", "inbox order"), A=v("A", _late))
async def message_after_timeout(h: Harness) -> None:
    """A message sent after the deadline does not beat the timeout: the next wait gets it."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.advance(90)
    await h.send(run, "reply", "late")
    await h.tick(run, "A")


async def _votes(ctx: toren.Context, input: Any) -> Any:
    return list(await asyncio.gather(ctx.wait_for_message("vote"), ctx.wait_for_message("vote")))


@scenario("waits_share_inbox", ("message wait", "gather"), A=v("A", _votes))
async def waits_share_inbox(h: Harness) -> None:
    """Two concurrent waits on one name share the inbox: one message each."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "vote", "first")
    await h.tick(run, "A")
    await h.send(run, "vote", "second")
    await h.tick(run, "A")


async def _summarise(ctx: toren.Context, input: Any) -> Any:
    return [await ask(ctx, f"part {i} of {input['topic']}") for i in range(input["n"])]


async def _parent(ctx: toren.Context, input: Any) -> Any:
    plan = await ask(ctx, "plan the work")
    parts = await ctx.spawn("summarise", {"topic": "tides", "n": 2})
    return {"plan": plan, "parts": parts}


@scenario("child_spawn", ("child", "model"), A=v("A", _parent, children={"summarise": _summarise}))
async def child_spawn(h: Harness) -> None:
    """A child process runs in its own stream (main/1) and returns its output."""
    run = await h.start("A")
    await h.tick(run, "A")


def _grandparent(tag: str) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        await ask(ctx, f"outline {tag}")
        out = await ctx.spawn("middle", {"depth": 1})
        await ctx.wait_for_message("go")
        return out

    return main


async def _middle(ctx: toren.Context, input: Any) -> Any:
    await ctx.tool("send_email", {"to": "mid@example.com", "body": "middle"})
    inner = await ctx.spawn("leaf", {"depth": input["depth"] + 1})
    return {"inner": inner, "depth": input["depth"]}


async def _leaf(ctx: toren.Context, input: Any) -> Any:
    await ctx.tool("send_email", {"to": "leaf@example.com", "body": "leaf"})
    return {"leaf": await ask(ctx, f"leaf at depth {input['depth']}")}


_NESTED = {"middle": _middle, "leaf": _leaf}


@scenario(
    "grandchildren",
    ("child", "nested children", "tool"),
    A=v("A", _grandparent("v1"), children=_NESTED),
)
async def grandchildren(h: Harness) -> None:
    """A child that spawns a grandchild (main/1, main/1/1), each with a side effect."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "A")


@scenario(
    "grandchildren_invalidated",
    ("child", "nested children", "parent_invalidated", "digest_mismatch", "reuse"),
    A=v("A", _grandparent("v1"), children=_NESTED),
    B=v("B", _grandparent("v2 edited"), children=_NESTED),
)
async def grandchildren_invalidated(h: Harness) -> None:
    """The parent's first prompt is edited: the parent stream is invalidated from 0 and
    with it the child and the grandchild (parent_invalidated); both re-run, their emails
    reused from the superseded streams."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


async def _gather_tools(ctx: toren.Context, input: Any) -> Any:
    return list(
        await asyncio.gather(
            ctx.tool("slow", {"name": "a", "turns": 6}),
            ctx.tool("slow", {"name": "b", "turns": 0}),
            ctx.tool("slow", {"name": "c", "turns": 3}),
        )
    )


@scenario("gather_tools", ("tool", "gather", "positions by call order"), A=v("A", _gather_tools))
async def gather_tools(h: Harness) -> None:
    """Three tools started together finish out of call order; positions follow the calls."""
    run = await h.start("A")
    await h.tick(run, "A")


async def _twins(ctx: toren.Context, input: Any) -> Any:
    return list(
        await asyncio.gather(ctx.spawn("twin", {"name": "x"}), ctx.spawn("twin", {"name": "y"}))
    )


async def _twin(ctx: toren.Context, input: Any) -> Any:
    return await ctx.tool("add", {"a": len(input["name"]), "b": 1})


@scenario("gather_children", ("child", "gather"), A=v("A", _twins, children={"twin": _twin}))
async def gather_children(h: Harness) -> None:
    """Two children spawned together, each one async tool call."""
    run = await h.start("A")
    await h.tick(run, "A")


# -- failures -------------------------------------------------------------------------------


async def _caught(ctx: toren.Context, input: Any) -> Any:
    errors = []
    for name, args in (("file_report", {"text": "x"}), ("missing", {})):
        try:
            await ctx.tool(name, args)
        except toren.ToolFailed as exc:
            errors.append([exc.message, exc.details.get("code")])
    try:
        await ask(ctx, "please [fail]")
    except toren.ModelCallFailed as exc:
        errors.append([exc.message, exc.details.get("status")])
    await ctx.wait_for_message("go")
    return errors


@scenario(
    "failures_caught",
    ("tool error", "unknown tool", "model error", "traceback", "replay of failures"),
    A=v("A", _caught, broken=True),
)
async def failures_caught(h: Harness) -> None:
    """A tool that raises (its traceback recorded), an unknown tool and a failed model
    call, each caught by the agent; the recorded failures replay on the next tick."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "A")


async def _report(ctx: toren.Context, input: Any) -> Any:
    messages: list[Any] = [{"role": "user", "content": "start"}]
    reply = None
    for i in range(3):
        reply = await ctx.model("scripted:echo", messages)
        messages.append(reply.message())
        if i < 2:
            sent = await ctx.tool("send_email", {"to": "ops@example.com", "body": f"update {i}"})
            messages.append({"role": "user", "content": f"sent {sent['n']}"})
    assert reply is not None
    report = await ctx.tool("file_report", {"text": reply.text})
    return {"answer": reply.text, "report": report}


@scenario(
    "tool_failure_retried",
    ("tool error", "RunFailed", "retry", "RunRetried", "fixed code"),
    A=v("A", _report, broken=True),
    B=v("B", _report),
)
async def tool_failure_retried(h: Harness) -> None:
    """A tool that raises fails the run; the fix is deployed as B and the run retried:
    the failed tool runs again, the model calls and emails replay."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.retry(run, "B")
    await h.tick(run, "B")


@scenario(
    "retry_fails_again",
    ("tool error", "retry", "retry twice"),
    A=v("A", _report, broken=True),
    B=v("B", _report),
)
async def retry_fails_again(h: Harness) -> None:
    """A retry under the same broken code fails again; the second retry, under the fix,
    completes. Slots end in ~1, ~2."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.retry(run, "A")
    await h.tick(run, "A")
    await h.retry(run, "B")
    await h.tick(run, "B")


async def _model_fails(ctx: toren.Context, input: Any) -> Any:
    await ask(ctx, "first")
    return await ask(ctx, "second [fail]")


@scenario("model_failure", ("model error", "RunFailed"), A=v("A", _model_fails))
async def model_failure(h: Harness) -> None:
    """A model call that fails (HTTP 503 from the provider) fails the run."""
    run = await h.start("A")
    await h.tick(run, "A")


async def _spender(ctx: toren.Context, input: Any) -> Any:
    for i in range(6):
        await ask(ctx, f"expensive call number {i} " + "x" * 40)
    return "done"


@scenario(
    "limit_retry",
    ("limits", "max_cost_usd", "LimitExceeded", "retry raises limits"),
    A=v("A", _spender, limits=toren.Limits(max_cost_usd=0.005)),
)
async def limit_retry(h: Harness) -> None:
    """The budget stops the run (LimitExceeded); a retry that raises the budget lets it
    finish, the calls already made replayed."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.retry(run, "A", max_cost_usd=1.0)
    await h.tick(run, "A")


async def _budget(ctx: toren.Context, input: Any) -> Any:
    spent = []
    for i in range(4):
        await ask(ctx, f"call {i}")
        spent.append(str(ctx.usage.cost_usd))
        if ctx.usage.steps >= 3:
            break
    await ctx.wait_for_message("go")
    return {"spent": spent, "steps": ctx.usage.steps}


@scenario("usage_on_replay", ("ctx.usage", "replay-exact usage"), A=v("A", _budget))
async def usage_on_replay(h: Harness) -> None:
    """Agent code reads ctx.usage and decides on it: on replay it sees what it saw live."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "A")


async def _bad_child(ctx: toren.Context, input: Any) -> Any:
    await ctx.tool("send_email", {"to": "c@example.com", "body": "child"})
    await ctx.tool("file_report", {"text": "child report"})
    return "never"


async def _child_parent(ctx: toren.Context, input: Any) -> Any:
    await ask(ctx, "delegate")
    return await ctx.spawn("worker", {"job": 1})


@scenario(
    "child_failure_retried",
    ("child", "child error", "RunFailed", "retry of a failed child"),
    A=v("A", _child_parent, children={"worker": _bad_child}, broken=True),
    B=v("B", _child_parent, children={"worker": _bad_child}),
)
async def child_failure_retried(h: Harness) -> None:
    """A child's tool raises: the child fails, then the run. The retry under B re-runs the
    child's failed step; its email and the parent's model call replay."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.retry(run, "B")
    await h.tick(run, "B")


async def _crash(ctx: toren.Context, input: Any) -> Any:
    await ask(ctx, "before the bug")
    raise ValueError("agent bug: no such field 'total'")


@scenario("agent_error", ("agent code error", "RunFailed", "traceback"), A=v("A", _crash))
async def agent_error(h: Harness) -> None:
    """Agent code raises after a step: the run fails with the agent's traceback."""
    run = await h.start("A")
    await h.tick(run, "A")


async def _deep(ctx: toren.Context, input: Any) -> Any:
    await ctx.now()
    root: dict[str, Any] = {}
    node = root
    for _ in range(5000):
        node["a"] = node = {}
    return root


@scenario("unrecordable_output", ("agent code error", "output nested too deeply"), A=v("A", _deep))
async def unrecordable_output(h: Harness) -> None:
    """An output nested too deeply to record fails the run with a clear error."""
    run = await h.start("A")
    await h.tick(run, "A")


async def _forever(ctx: toren.Context, input: Any) -> Any:
    await ask(ctx, "start")
    await ctx.sleep(7200)
    return await ctx.wait_for_message("never")


@scenario("cancel_waiting", ("cancel", "sleep"), A=v("A", _forever))
async def cancel_waiting(h: Harness) -> None:
    """A run parked on a timer is cancelled; a queued run is cancelled before its first
    tick."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.cancel(run)
    await h.tick(run, "A")
    queued = await h.start("A", {"never": "started"}, name="r2")
    await h.cancel(queued)
    await h.tick(queued, "A")


# -- code changes -----------------------------------------------------------------------


@scenario(
    "prompt_edit",
    ("model", "digest_mismatch", "reuse", "nth-to-nth reuse", "blobs"),
    A=v("A", parked(chain(8, {5: "[v1]"}, email_at=6))),
    B=v("B", chain(8, {5: "[v2 edited]"}, email_at=6)),
)
async def prompt_edit(h: Harness) -> None:
    """The prompt of step 5 of 8 is edited in flight: one invalidation at 5; steps 0-4
    replay, 5-7 re-run, the email after step 6 is reused, not sent again."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")
    await h.tick(run, "B")


def _mailer(to: str, first: str | None = None) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        if first is not None:
            await ask(ctx, first)
        a = await ctx.tool("send_email", {"to": to, "body": "one"})
        b = await ctx.tool("send_email", {"to": to, "body": "two"})
        await ctx.wait_for_message("go")
        return [a, b]

    return main


@scenario(
    "tool_arg_change",
    ("tool", "digest_mismatch", "changed tool argument"),
    A=v("A", _mailer("ann@example.com")),
    B=v("B", _mailer("bob@example.com")),
)
async def tool_arg_change(h: Harness) -> None:
    """A changed tool argument invalidates from the first tool call: the new emails are
    new work, performed (not reused)."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


@scenario(
    "step_added_front",
    ("kind_mismatch", "added step", "reuse"),
    A=v("A", _mailer("ann@example.com")),
    B=v("B", _mailer("ann@example.com", first="think first")),
)
async def step_added_front(h: Harness) -> None:
    """A model call added before two emails: a kind mismatch at 0 (tool vs model); the
    emails move to 1 and 2 and are reused n-th to n-th."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


def _steps(n: int) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        out = [await ask(ctx, f"s{i}") for i in range(n)]
        await ctx.wait_for_message("go")
        return out

    return main


@scenario(
    "step_removed",
    ("removed step", "kind_mismatch", "message wait"),
    A=v("A", _steps(4)),
    B=v("B", _steps(2)),
)
async def step_removed(h: Harness) -> None:
    """New code makes two model calls where the log has four, then waits: the wait at 2
    meets a recorded model call (kind mismatch) and takes the message from the inbox."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


def _short(n: int) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        out = [await ask(ctx, f"s{i}") for i in range(n)]
        return out

    return main


@scenario(
    "stream_ended",
    ("stream_ended", "removed step"),
    A=v("A", parked(_short(4))),
    B=v("B", _short(2)),
)
async def stream_ended(h: Harness) -> None:
    """New code returns after two of the four recorded model calls (and no longer waits):
    the stream is invalidated from 2 with cause stream_ended."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


def _two_tools(order: tuple[str, str]) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        await ask(ctx, "plan")
        got = [await ctx.tool("send_email", {"to": to, "body": "hello"}) for to in order]
        await ctx.wait_for_message("go")
        return got

    return main


@scenario(
    "tools_moved",
    ("moved step", "digest_mismatch", "nth-to-nth reuse"),
    A=v("A", _two_tools(("x@example.com", "y@example.com"))),
    B=v("B", _two_tools(("y@example.com", "x@example.com"))),
)
async def tools_moved(h: Harness) -> None:
    """Two emails swap places: both are reused from the superseded suffix (matched by
    their request), neither is sent again."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


def _reads(prompt: str) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        await ask(ctx, prompt)
        found = await ctx.tool("lookup", {"key": "k"})
        quote = await ctx.tool("price")
        sent = await ctx.tool("send_email", {"to": "q@example.com", "body": "quote"})
        await ctx.wait_for_message("go")
        return {"found": found, "quote": quote, "sent": sent}

    return main


@scenario(
    "free_tools_rerun",
    ("side-effect-free tool", "reexecute tool", "reuse", "digest_mismatch"),
    A=v("A", _reads("v1")),
    B=v("B", _reads("v2")),
)
async def free_tools_rerun(h: Harness) -> None:
    """After an invalidation a read (side_effects=False) and a reexecute tool run again;
    the email is reused."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


def _tool_or_model(use_model: bool) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        await ctx.now()
        if use_model:
            got: Any = await ask(ctx, "look it up")
        else:
            got = await ctx.tool("lookup", {"key": "k"})
        await ctx.wait_for_message("go")
        return got

    return main


@scenario(
    "kind_change",
    ("kind_mismatch", "value", "tool", "model"),
    A=v("A", _tool_or_model(False)),
    B=v("B", _tool_or_model(True)),
)
async def kind_change(h: Harness) -> None:
    """A tool call replaced by a model call at the same position: kind mismatch at 1."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


def _timer(seconds: float) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        await ask(ctx, "before the nap")
        await ctx.sleep(seconds)
        return await ask(ctx, "after the nap")

    return main


@scenario(
    "timer_changed",
    ("sleep", "digest_mismatch", "timer invalidated"),
    A=v("A", _timer(3600)),
    B=v("B", _timer(600)),
)
async def timer_changed(h: Harness) -> None:
    """The run is parked on a one-hour timer; new code sleeps ten minutes: the pending
    timer is invalidated and a new one scheduled from now."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.advance(300)
    await h.tick(run, "B", plan=False)  # not due: not claimed
    await h.advance(3300)
    await h.tick(run, "B")
    await h.advance(600)
    await h.tick(run, "B")


def _wait_then(timeout: float | None) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        await ask(ctx, "ask for input")
        got = await ctx.wait_for_message("answer", timeout=timeout)
        await ctx.wait_for_message("go")
        return {"answer": got}

    return main


@scenario(
    "wait_timeout_changed",
    ("message wait with timeout", "message wait", "digest_mismatch", "redelivery"),
    A=v("A", _wait_then(None)),
    B=v("B", _wait_then(900)),
)
async def wait_timeout_changed(h: Harness) -> None:
    """A wait gains a timeout: its digest changes, the recorded receipt is superseded and
    the message is received again by the new wait."""
    run = await h.start("A")
    await h.send(run, "answer", 42)
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


def _approval_agent(prompt: str, *, park: bool) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        draft = await ask(ctx, prompt)
        approval = await ctx.wait_for_message("approve")
        await ctx.tool("send_email", {"to": "a@example.com", "body": draft})
        if park:
            await ctx.wait_for_message("never")
        return {"approval": approval}

    return main


@scenario(
    "message_redelivered",
    ("message redelivery", "digest_mismatch", "message wait", "tool"),
    A=v("A", _approval_agent("draft v1", park=True)),
    B=v("B", _approval_agent("draft v2", park=False)),
)
async def message_redelivered(h: Harness) -> None:
    """The approval was received by a step the edit supersedes: the re-run wait receives
    the same message again (same inbox id); the new draft is a new email."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "approve", {"by": "ann"})
    await h.tick(run, "A")
    await h.send(run, "never")
    await h.tick(run, "B")


def _voter(prompt: str) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        await ask(ctx, prompt)
        return [await ctx.wait_for_message("vote") for _ in range(3)]

    return main


@scenario(
    "messages_back_in_line",
    ("message redelivery", "inbox order"),
    A=v("A", _voter("v1")),
    B=v("B", _voter("v2")),
)
async def messages_back_in_line(h: Harness) -> None:
    """Two votes received by a superseded suffix and a third still in the inbox: the re-run
    receives them in the order sent, each once."""
    run = await h.start("A")
    await h.send(run, "vote", 1)
    await h.send(run, "vote", 2)
    await h.tick(run, "A")
    await h.send(run, "vote", 3)
    await h.tick(run, "B")


def _spawner(first: str | None) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        if first is not None:
            await ask(ctx, first)
        out = await ctx.spawn("mail", {"to": "team@example.com"})
        await ctx.wait_for_message("go")
        return out

    return main


async def _mail_child(ctx: toren.Context, input: Any) -> Any:
    sent = await ctx.tool("send_email", {"to": input["to"], "body": "report"})
    return {"sent": sent, "note": await ask(ctx, "summarise the report")}


@scenario(
    "spawn_moved",
    ("child", "moved spawn", "continues", "reuse across moved spawns", "kind_mismatch"),
    A=v("A", _spawner(None), children={"mail": _mail_child}),
    B=v("B", _spawner("think first"), children={"mail": _mail_child}),
)
async def spawn_moved(h: Harness) -> None:
    """A step added before a spawn moves it from 0 to 1: the new child main/1 continues
    the superseded main/0 and reuses its email."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


def _two_spawns(order: tuple[str, str]) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        out = [await ctx.spawn("mail", {"to": to}) for to in order]
        await ctx.wait_for_message("go")
        return out

    return main


@scenario(
    "spawn_order_changed",
    ("child", "changed spawn order", "continues", "nth-to-nth reuse of children"),
    A=v("A", _two_spawns(("a@example.com", "b@example.com")), children={"mail": _mail_child}),
    B=v("B", _two_spawns(("b@example.com", "a@example.com")), children={"mail": _mail_child}),
)
async def spawn_order_changed(h: Harness) -> None:
    """Two spawns swap order: each new child continues the superseded child with the same
    input; no email is sent twice."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


def _child_prompt(prompt: str) -> AgentFn:
    async def child(ctx: toren.Context, input: Any) -> Any:
        await ask(ctx, "child step 0")
        note = await ask(ctx, prompt)
        await ctx.tool("send_email", {"to": "c@example.com", "body": "from child"})
        await ctx.wait_for_message("go")
        return note

    return child


async def _holder(ctx: toren.Context, input: Any) -> Any:
    await ask(ctx, "parent step")
    return await ctx.spawn("inner", None)


@scenario(
    "child_code_change",
    ("child", "digest_mismatch in a child stream", "parent unaffected", "reuse", "child waits"),
    A=v("A", _holder, children={"inner": _child_prompt("child v1")}),
    B=v("B", _holder, children={"inner": _child_prompt("child v2")}),
)
async def child_code_change(h: Harness) -> None:
    """A child still in flight (waiting for a message) has its second prompt changed:
    main/1 is invalidated at 1, the parent's step and the child's first replay, the
    child's email is reused."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


def _done_child(prompt: str) -> AgentFn:
    async def child(ctx: toren.Context, input: Any) -> Any:
        await ask(ctx, "child step 0")
        return await ask(ctx, prompt)

    return child


@scenario(
    "completed_child_code_change",
    ("child", "completed child replays whole", "parent unaffected"),
    A=v("A", parked(_holder), children={"inner": _done_child("child v1")}),
    B=v("B", parked(_holder), children={"inner": _done_child("child v2")}),
)
async def completed_child_code_change(h: Harness) -> None:
    """A child that completed replays from its recorded completion: a change to its code
    does not re-run it (its output is the recorded one), nothing is invalidated."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


def _with_tool_calls(final: str) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        messages: list[Any] = [{"role": "user", "content": "find k1 [call]"}]
        spec = {"name": "lookup", "description": "look a key up"}
        reply = await ctx.model("scripted:echo", messages, tools=[spec], temperature=0.2)
        messages.append(reply.message())
        for call in reply.tool_calls:
            result = await ctx.tool(call.name, call.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
        messages.append({"role": "user", "content": final})
        answer = await ctx.model("scripted:echo", messages, tools=[spec], temperature=0.2)
        await ctx.wait_for_message("go")
        return answer.text

    return main


@scenario(
    "model_tool_loop",
    ("model with tools", "tool specs as blobs", "params", "digest_mismatch"),
    A=v("A", _with_tool_calls("answer now")),
    B=v("B", _with_tool_calls("answer briefly")),
)
async def model_tool_loop(h: Harness) -> None:
    """A model asks for a tool (tool specs and params in the request); the final prompt is
    edited under B: invalidation at 2, the first call and the lookup replay."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


# -- fix forward ----------------------------------------------------------------------------


def _forkable(tag: str) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        messages: list[Any] = []
        for i in range(4):
            text = f"turn {i} of {input['topic']}" + (f" {tag}" if i >= 2 else "")
            messages.append({"role": "user", "content": text})
            messages.append((await ctx.model("scripted:echo", messages)).message())
        await ctx.tool("send_email", {"to": "f@example.com", "body": messages[-1]["content"]})
        return messages[-1]["content"]

    return main


@scenario(
    "fork_from_step",
    ("fork", "RunForked", "pins", "reuse pointer dropped"),
    A=v("A", _forkable("[v1]")),
    B=v("B", _forkable("[v2]")),
)
async def fork_from_step(h: Harness) -> None:
    """A completed run is forked at main:2 under B: the two copied steps replay (pinned),
    the rest runs live; the source is untouched. A second fork changes the input."""
    run = await h.start("A", {"topic": "tides"})
    await h.tick(run, "A")
    fork = await h.fork(run, "B", "main:2", "f1")
    await h.tick(fork, "B")
    other = await h.fork(run, "B", "main:1", "f2", input={"topic": "winds"})
    await h.tick(other, "B")


# -- the invalidation-storm guard -----------------------------------------------------------


def napping(fn: AgentFn) -> AgentFn:
    """``fn``, a ten-minute durable sleep, then a wait for "go"."""

    async def main(ctx: toren.Context, input: Any) -> Any:
        out = await fn(ctx, input)
        await ctx.sleep(600)
        await ctx.wait_for_message("go")
        return out

    return main


@scenario(
    "storm_guard_rollout",
    ("storm guard", "rolling deploy", "back off", "digest_mismatch", "sleep"),
    A=v("A", napping(chain(4, {2: "[v1]"}))),
    B=v("B", napping(chain(4, {2: "[v2]"}))),
)
async def storm_guard_rollout(h: Harness) -> None:
    """During a rolling deploy B (its workers started last) invalidates A's suffix; an A
    worker still live then meets B's suffix and backs off without writing anything; B
    finishes the run."""
    t0 = h.clock.now()
    await h.worker("w-a", "A", started_at=t0 - 100)
    await h.worker("w-b", "B", started_at=t0 - 10)
    run = await h.start("A")
    await h.tick(run, "A")  # A started first: A writes (nothing of B's to overwrite)
    await h.advance(600)
    await h.tick(run, "B")
    await h.advance(600)
    await h.tick(run, "A", plan=False)  # backs off: the plan does not model the guard
    await h.advance(30)  # the drain window
    await h.tick(run, "B")
    await h.send(run, "go")
    await h.tick(run, "B")


@scenario(
    "storm_guard_rollback",
    ("storm guard", "rollback", "back off", "digest_mismatch", "sleep"),
    A=v("A", napping(chain(3, {1: "[v1]"}))),
    B=v("B", napping(chain(3, {1: "[v2]"}))),
)
async def storm_guard_rollback(h: Harness) -> None:
    """A, then B rolled out (B invalidates A's suffix), then a rollback to A: A's new
    workers started last, so A invalidates B's suffix, and a B worker still live backs
    off."""
    t0 = h.clock.now()
    await h.worker("w-a", "A", started_at=t0 - 100)
    await h.worker("w-b", "B", started_at=t0 - 50)
    run = await h.start("A")
    await h.tick(run, "A", plan=False)  # B is newer, but A has nothing of B's to overwrite
    await h.advance(600)
    await h.tick(run, "B")
    await h.worker("w-a2", "A", started_at=h.clock.now())  # the rollback's workers
    await h.advance(600)
    await h.tick(run, "A")
    await h.advance(600)
    await h.tick(run, "B", plan=False)  # backs off
    await h.advance(30)
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "A")


# -- more ----------------------------------------------------------------------------------


async def _hanger(ctx: toren.Context, input: Any) -> Any:
    first = await ask(ctx, "before the crash")
    done = await ctx.tool("hang", {"step": "one"})
    return {"first": first, "done": done}


@scenario(
    "crash_mid_step",
    ("crash recovery", "expired lease", "in-flight step runs again", "saved cost"),
    A=v("A", _hanger),
)
async def crash_mid_step(h: Harness) -> None:
    """The worker dies while a tool runs: that step has no event. Once the lease expires
    another tick recovers the run, replays the model call (saved) and runs the tool again
    (at-least-once for the step in flight only)."""
    run = await h.start("A")
    await h.crash(run, "A")
    await h.tick(run, "A")


async def _newer_events(ctx: toren.Context, input: Any) -> Any:
    a = await ask(ctx, "one")
    await ctx.wait_for_message("go")
    b = await ask(ctx, "two")
    return [a, b]


@scenario(
    "unknown_events_ignored",
    ("forward compatibility", "unknown event types"),
    A=v("A", _newer_events),
)
async def unknown_events_ignored(h: Harness) -> None:
    """Events of types a newer release wrote (in a stream and at the run level) are kept
    and ignored by the fold: the run replays and goes on."""
    run = await h.start("A")
    await h.tick(run, "A")
    h.inject(run, "FutureStepNote", '{"note":"from 9.9","position_hint":0}', stream="main")
    h.inject(run, "FutureRunThing", '{"x":1}')
    await h.send(run, "go")
    await h.tick(run, "A")


def _looping(max_steps: int) -> AgentFn:
    from toren.agents.loop import LoopSpec, make_loop

    return make_loop(
        LoopSpec(
            agent=AGENT,
            process="main",
            model="scripted:echo",
            instructions="Be brief.",
            tools=(ToolSpec("lookup", "look a key up"),),
            params={"temperature": 0.0},
            limits=toren.Limits(max_steps=max_steps),
        )
    )


@scenario(
    "builtin_loop",
    ("built-in tool-calling loop", "max_steps", "LimitExceeded", "retry raises max_steps"),
    A=v("A", _looping(5), limits=toren.Limits(max_steps=5)),
)
async def builtin_loop(h: Harness) -> None:
    """The built-in loop: one run answers in a turn; another keeps calling a tool until
    max_steps stops it, and a retry raising max_steps lets it go two steps further."""
    quick = await h.start("A", {"message": "hello"}, name="quick")
    await h.tick(quick, "A")
    run = await h.start("A", "find k1 [call]")
    await h.tick(run, "A")
    await h.retry(run, "A", max_steps=7)
    await h.tick(run, "A")


async def _timed_tools(ctx: toren.Context, input: Any) -> Any:
    total = await ctx.tool("add", {"a": 1, "b": 2})
    try:
        await ctx.tool("stall")
    except toren.ToolFailed as exc:
        return {"total": total, "error": exc.message}
    return {"total": total}


@scenario(
    "tool_timeout",
    ("limits", "step_timeout", "tool error"),
    A=v("A", _timed_tools, limits=toren.Limits(step_timeout=0.05)),
)
async def tool_timeout(h: Harness) -> None:
    """A tool that never returns is ended by limits.step_timeout: a recorded failure."""
    run = await h.start("A")
    await h.tick(run, "A")


async def _asks_in_child(ctx: toren.Context, input: Any) -> Any:
    await ask(ctx, "prepare")
    verdict = await ctx.wait_for_message("verdict", timeout=3600)
    return {"verdict": verdict}


async def _two_sleepers(ctx: toren.Context, input: Any) -> Any:
    return list(await asyncio.gather(ctx.spawn("nap", {"s": 600}), ctx.spawn("nap", {"s": 60})))


async def _nap(ctx: toren.Context, input: Any) -> Any:
    await ctx.sleep(input["s"])
    return input["s"]


@scenario(
    "children_wait",
    ("child", "gather", "sleep in a child", "message wait in a child", "park"),
    A=v("A", _two_sleepers, children={"nap": _nap}),
)
async def children_wait(h: Harness) -> None:
    """Two children sleep concurrently (600 s and 60 s): the run parks until the earlier
    timer, wakes, parks again for the later one, then completes."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.advance(60)
    await h.tick(run, "A")
    await h.advance(540)
    await h.tick(run, "A")


async def _judge(ctx: toren.Context, input: Any) -> Any:
    out = await ctx.spawn("judge", {"case": 7})
    return {"child": out, "after": await ask(ctx, "wrap up")}


@scenario(
    "child_message_wait",
    ("child", "message wait with timeout in a child", "park"),
    A=v("A", _judge, children={"judge": _asks_in_child}),
)
async def child_message_wait(h: Harness) -> None:
    """A child waits for a message (with a timeout): the whole run parks on its inbox;
    the message wakes it and the child and then the parent finish."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "verdict", {"guilty": False})
    await h.tick(run, "A")


async def _two_models(ctx: toren.Context, input: Any) -> Any:
    base = [{"role": "system", "content": "shared"}]
    left, right = await asyncio.gather(
        ctx.model("scripted:echo", [*base, {"role": "user", "content": "left"}]),
        ctx.model("scripted:echo", [*base, {"role": "user", "content": "a longer right side"}]),
    )
    return [left.text, right.text]


@scenario("gather_models", ("model", "gather", "blobs shared"), A=v("A", _two_models))
async def gather_models(h: Harness) -> None:
    """Two model calls started together in one stream share a message body."""
    run = await h.start("A")
    await h.tick(run, "A")


async def _delegating(ctx: toren.Context, input: Any) -> Any:
    await ask(ctx, "delegate")
    return await ctx.spawn("steps", {"n": 3})


async def _child_steps(ctx: toren.Context, input: Any) -> Any:
    out = [await ask(ctx, f"child {i}") for i in range(input["n"])]
    await ctx.tool("send_email", {"to": "k@example.com", "body": "child done"})
    return out


@scenario(
    "fork_in_child",
    ("fork", "fork inside a child stream", "pins of ancestors"),
    A=v("A", _delegating, children={"steps": _child_steps}),
)
async def fork_in_child(h: Harness) -> None:
    """A fork at main/1:2 copies the parent's steps up to the spawn and the child's first
    two; the child's third step and its email run live in the fork."""
    run = await h.start("A")
    await h.tick(run, "A")
    fork = await h.fork(run, "A", "main/1:2", "f1")
    await h.tick(fork, "A")


def _report_after(prompt: str) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        draft = await ask(ctx, prompt)
        await ctx.tool("send_email", {"to": "ops@example.com", "body": "heads up"})
        closing = await ask(ctx, "closing words")
        return await ctx.tool("file_report", {"text": closing + " / " + draft})

    return main


@scenario(
    "retry_under_changed_code",
    ("retry", "digest_mismatch after a retry", "reuse", "slots ~1"),
    A=v("A", _report_after("draft v1"), broken=True),
    B=v("B", _report_after("draft v2")),
)
async def retry_under_changed_code(h: Harness) -> None:
    """The fix deployed with the retry also edits the first prompt: the retried run is
    invalidated from 0 (its events in the ~1 slots), the email reused, the report filed."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.retry(run, "B")
    await h.tick(run, "B")


@scenario(
    "fork_after_invalidation",
    ("fork", "invalidation", "reuse pointer dropped", "superseded steps not copied"),
    A=v("A", parked(chain(5, {1: "[v1]"}, email_at=3))),
    B=v("B", chain(5, {1: "[v2]"}, email_at=3)),
)
async def fork_after_invalidation(h: Harness) -> None:
    """A run invalidated at 1 under B (its email reused) is forked after the email: the
    fork copies the current view only, the reused email without its reuse pointer."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")
    fork = await h.fork(run, "B", "main:5", "f1")
    await h.tick(fork, "B")


def _approver(prompt: str, *, in_child: bool) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        await ask(ctx, prompt)
        if in_child:
            got = await ctx.spawn("approve", None)
        else:
            got = await ctx.wait_for_message("approve")
        await ctx.wait_for_message("done")
        return got

    return main


async def _approve_child(ctx: toren.Context, input: Any) -> Any:
    return await ctx.wait_for_message("approve")


@scenario(
    "message_across_streams",
    ("message redelivery", "child", "parent_invalidated", "kind_mismatch"),
    A=v("A", _approver("v1", in_child=True), children={"approve": _approve_child}),
    B=v("B", _approver("v1", in_child=False), children={"approve": _approve_child}),
)
async def message_across_streams(h: Harness) -> None:
    """The approval a child received goes back in line when new code waits for it in the
    parent instead: the child is superseded, the parent's wait receives the message."""
    run = await h.start("A")
    await h.send(run, "approve", "yes")
    await h.tick(run, "A")
    await h.send(run, "done")
    await h.tick(run, "B")


async def _hostile(ctx: toren.Context, input: Any) -> Any:
    got = await ctx.tool("lookup", {"key": "naïve 🚀 \u202eevil\u202c \x00 end"})
    reply = await ask(ctx, "zalgo z\u0351\u0352 and emoji 👩\u200d💻 and tab\tend")
    return {"got": got, "reply": reply, "input": input}


@scenario(
    "hostile_strings",
    ("unicode", "NUL", "bidi controls", "JSON escaping as stored"),
    A=v("A", _hostile),
)
async def hostile_strings(h: Harness) -> None:
    """Strings with NUL, bidi controls, combining marks and emoji in input, tool
    arguments, results and messages are stored and replayed as given."""
    run = await h.start("A", {"text": 'quote " backslash \\ ünï \U0001f600'})
    await h.tick(run, "A")


def _quick(what: str) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        await ctx.sleep(0)
        none = await ctx.wait_for_message("instant", timeout=0)
        await (ctx.now() if what == "now" else ctx.random())
        await ctx.wait_for_message("go")
        return {"none": none}

    return main


@scenario(
    "zero_waits_and_value_change",
    ("sleep 0", "message wait with timeout 0", "value", "digest_mismatch of a value"),
    A=v("A", _quick("now")),
    B=v("B", _quick("random")),
)
async def zero_waits_and_value_change(h: Harness) -> None:
    """A zero sleep and a zero-timeout wait complete in the tick; new code reads random
    where the log has the clock: a digest mismatch at 2 (same kind, value)."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


async def _budgeted(ctx: toren.Context, input: Any) -> Any:
    for i in range(4):
        await ask(ctx, f"call {i}")
        if ctx.usage.steps >= 3:
            break
    first = await ctx.wait_for_message("go")
    second = await ctx.wait_for_message("go2")
    return {"steps": ctx.usage.steps, "got": [first, second]}


@scenario(
    "usage_then_waits",
    ("ctx.usage", "replay-exact usage", "plan of a usage branch", "message wait"),
    A=v("A", _budgeted),
)
async def usage_then_waits(h: Harness) -> None:
    """Agent code stops on ctx.usage after three calls, then receives two messages. The
    third tick replays the usage branch exactly; the plan made before it does not (see
    README.md, known disagreements: the plan reads ctx.usage as zero)."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go", 1)
    await h.tick(run, "A")
    await h.send(run, "go2", 2)
    await h.tick(run, "A")


def _shortening_child(steps: int) -> AgentFn:
    async def child(ctx: toren.Context, input: Any) -> Any:
        out = [await ask(ctx, f"child part {i}") for i in range(steps)]
        if steps > 1:
            await ctx.wait_for_message("go")
        return out

    return child


async def _spawn_one(ctx: toren.Context, input: Any) -> Any:
    return await ctx.spawn("part", {"k": 1})


@scenario(
    "child_stream_ended",
    ("child", "stream_ended in a child stream"),
    A=v("A", _spawn_one, children={"part": _shortening_child(3)}),
    B=v("B", _spawn_one, children={"part": _shortening_child(1)}),
)
async def child_stream_ended(h: Harness) -> None:
    """A child in flight (waiting) whose new code returns after its first step: main/0
    is invalidated from 1 (stream_ended) and completes; the parent goes on."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


def _spawn_to(to: str) -> AgentFn:
    async def main(ctx: toren.Context, input: Any) -> Any:
        out = await ctx.spawn("mail", {"to": to})
        await ctx.wait_for_message("go")
        return out

    return main


@scenario(
    "spawn_input_changed",
    ("child", "digest_mismatch at a spawn", "parent_invalidated", "no continuation"),
    A=v("A", _spawn_to("a@example.com"), children={"mail": _mail_child}),
    B=v("B", _spawn_to("b@example.com"), children={"mail": _mail_child}),
)
async def spawn_input_changed(h: Harness) -> None:
    """A spawn with new input is new work: the old child is invalidated with its spawn,
    the new one does not continue it, and its email (new arguments) is sent."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")


def _leaf_waits(prompt: str) -> AgentFn:
    async def leaf(ctx: toren.Context, input: Any) -> Any:
        await ctx.tool("send_email", {"to": "leaf@example.com", "body": "leaf"})
        note = await ask(ctx, prompt)
        await ctx.wait_for_message("go")
        return note

    return leaf


async def _middle_spawns(ctx: toren.Context, input: Any) -> Any:
    await ask(ctx, "middle")
    return {"leaf": await ctx.spawn("leaf", None)}


async def _top(ctx: toren.Context, input: Any) -> Any:
    await ask(ctx, "top")
    return await ctx.spawn("middle", None)


@scenario(
    "grandchild_code_change",
    ("nested children", "grandchild in flight", "digest_mismatch in a grandchild"),
    A=v("A", _top, children={"middle": _middle_spawns, "leaf": _leaf_waits("leaf v1")}),
    B=v("B", _top, children={"middle": _middle_spawns, "leaf": _leaf_waits("leaf v2")}),
)
async def grandchild_code_change(h: Harness) -> None:
    """The run parks in a grandchild (main/1/1) after its prompt; the prompt changes:
    main/1/1 is invalidated at 1 only, the parent, the child and the grandchild's email
    replay."""
    run = await h.start("A")
    await h.tick(run, "A")
    await h.send(run, "go")
    await h.tick(run, "B")
