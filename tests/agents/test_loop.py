"""The built-in loop against a fake context: turns, concurrent tools, errors, limits, HITL."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest

from toren.agents.config import HumanConfig
from toren.agents.loop import LoopSpec, make_loop, parse_input, tool_result_text
from toren.agents.tools import tool_from_function
from toren.core.agent_api.program import AgentProgram, Limits, ToolDef
from toren.errors import InvalidInput, LimitExceeded
from toren.providers.base import ModelResponse, ToolCall

from .fakes import FakeContext, ModelCall, calls, text


def _program(
    *fns: Any, limits: Limits | None = None, human: bool = False, **spec: Any
) -> AgentProgram:
    tools: dict[str, ToolDef] = {t.name: t for t in map(tool_from_function, fns)}
    loop = make_loop(
        LoopSpec(
            agent="a",
            process="main",
            model=spec.pop("model", "scripted:s.yaml"),
            instructions=spec.pop("instructions", "Be helpful."),
            tools=tuple(t.spec for t in tools.values()),
            limits=limits or Limits(),
            human=HumanConfig(timeout=60) if human else None,
            **spec,
        )
    )
    return AgentProgram(agent="a", process="main", fn=loop, tools=tools)


def lookup_order(order_id: str) -> dict[str, str]:
    """Look up an order."""
    return {"order_id": order_id, "status": "shipped"}


def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"boom: {reason}")


async def _run(program: AgentProgram, ctx: FakeContext, input: Any = "hi") -> Any:
    ctx.program = program
    return await asyncio.wait_for(program.fn(ctx, input), 5)  # type: ignore[arg-type]


async def test_answer_without_tools() -> None:
    program = _program(lookup_order, params={"temperature": 0.2})
    ctx = FakeContext(responses=[text("Hello!")])
    out = await _run(program, ctx, {"message": "hi there"})
    assert out == {"answer": "Hello!", "finish_reason": "stop", "turns": 1, "tool_calls": 0}
    call = ctx.model_calls[0]
    assert call.model == "scripted:s.yaml" and call.params == {"temperature": 0.2}
    assert call.messages == [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "hi there"},
    ]
    assert [t.name for t in call.tools] == ["lookup_order"]


async def test_tool_round_trip_feeds_results_back_in_order() -> None:
    ctx = FakeContext(
        responses=[
            calls(("lookup_order", {"order_id": "A-17"}), ("lookup_order", {"order_id": "B-3"})),
            text("Both shipped."),
        ]
    )
    out = await _run(_program(lookup_order), ctx)
    assert out["answer"] == "Both shipped." and out["turns"] == 2 and out["tool_calls"] == 2
    second = ctx.model_calls[1].messages
    assert second[2]["role"] == "assistant" and len(second[2]["tool_calls"]) == 2
    assert second[3] == {
        "role": "tool",
        "tool_call_id": "c0",
        "name": "lookup_order",
        "content": '{"order_id": "A-17", "status": "shipped"}',
    }
    assert second[4]["tool_call_id"] == "c1" and "B-3" in second[4]["content"]
    assert ctx.steps == [
        ("model", "scripted:s.yaml"),
        ("tool", "lookup_order"),
        ("tool", "lookup_order"),
        ("model", "scripted:s.yaml"),
    ]


async def test_tool_calls_of_one_turn_run_concurrently() -> None:
    # Each tool waits until both have started: this only finishes if they overlap.
    started = 0
    both = asyncio.Event()

    async def meet(name: str) -> str:
        """Rendezvous."""
        nonlocal started
        started += 1
        if started == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 2)
        return name

    ctx = FakeContext(responses=[calls(("meet", {"name": "x"}), ("meet", {"name": "y"}))])
    out = await _run(_program(meet), ctx)
    assert out["tool_calls"] == 2
    tool_messages = [m for m in ctx.model_calls[1].messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["x", "y"]


class _EngineAbort(BaseException):
    """Stands for the engine's aborts (``toren.core.drivers.aborts.Abort``): a BaseException."""


def broken() -> str:
    """Never runs: the context fails the call (see _BrokenContext)."""
    return "unreachable"


class _BrokenContext(FakeContext):
    """A context whose tool ``broken`` raises what is not a ToolFailed: an agent bug."""

    async def tool(self, name: str, args: Any) -> Any:
        if name == "broken":
            self._step("tool", name)
            await asyncio.sleep(0)
            raise RuntimeError("bug in the engine")
        return await super().tool(name, args)


def _sibling(progress: list[str]) -> Any:
    async def slow(name: str) -> str:
        """Works for a while."""
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            progress.append("cancelled")
            raise
        progress.append("finished")  # the work a cancelled sibling must never reach
        return name

    return slow


async def test_an_error_that_is_not_tool_failed_cancels_and_awaits_the_sibling_tools() -> None:
    progress: list[str] = []
    ctx = _BrokenContext(responses=[calls(("slow", {"name": "x"}), ("broken", {}))])
    with pytest.raises(RuntimeError, match="bug in the engine"):
        await _run(_program(_sibling(progress), broken), ctx)
    # Cancelled, and done unwinding, before the error left the loop...
    assert progress == ["cancelled"]
    await asyncio.sleep(0.3)
    # ...and its work did not go on afterwards.
    assert progress == ["cancelled"]
    # Steps still took their positions in the order the model asked for the calls.
    assert ctx.steps == [("model", "scripted:s.yaml"), ("tool", "slow"), ("tool", "broken")]


async def test_an_engine_abort_in_a_tool_cancels_the_siblings_and_is_raised_as_itself() -> None:
    progress: list[str] = []

    async def abort() -> str:
        """Stops the run from the outside."""
        raise _EngineAbort("parked")

    ctx = FakeContext(responses=[calls(("abort", {}), ("slow", {"name": "y"}))])
    with pytest.raises(_EngineAbort, match="parked"):  # not wrapped in an exception group
        await _run(_program(abort, _sibling(progress)), ctx)
    assert progress == ["cancelled"]
    await asyncio.sleep(0.3)
    assert progress == ["cancelled"]


async def test_cancelling_the_loop_cancels_and_awaits_every_tool_of_the_turn() -> None:
    progress: list[str] = []
    started = asyncio.Event()

    async def waits(name: str) -> str:
        """Waits until cancelled."""
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            progress.append(f"cancelled {name}")
            raise
        return name

    ctx = FakeContext(responses=[calls(("waits", {"name": "a"}), ("waits", {"name": "b"}))])
    program = _program(waits)
    ctx.program = program
    task = asyncio.ensure_future(program.fn(ctx, "hi"))  # type: ignore[arg-type]
    await asyncio.wait_for(started.wait(), 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(progress) == ["cancelled a", "cancelled b"]


async def test_tool_error_is_fed_back_to_the_model_not_a_crash() -> None:
    ctx = FakeContext(responses=[calls(("explode", {"reason": "disk"})), text("Sorry.")])
    out = await _run(_program(explode), ctx)
    assert out["answer"] == "Sorry."
    tool_message = ctx.model_calls[1].messages[-1]
    assert tool_message["role"] == "tool"
    assert tool_message["content"] == "error: RuntimeError: boom: disk"


async def test_bad_arguments_are_fed_back_too() -> None:
    ctx = FakeContext(responses=[calls(("lookup_order", {"order": "A"})), text("ok")])
    await _run(_program(lookup_order), ctx)
    content = ctx.model_calls[1].messages[-1]["content"]
    assert content.startswith("error: ToolArgumentsError: invalid arguments for tool")
    assert "order_id: Field required" in content


async def test_unknown_tool_is_answered_without_a_step() -> None:
    ctx = FakeContext(responses=[calls(("launch_rockets", {})), text("ok")])
    await _run(_program(lookup_order), ctx)
    content = ctx.model_calls[1].messages[-1]["content"]
    assert (
        content
        == "error: there is no tool named 'launch_rockets'; available tools: ['lookup_order']"
    )
    assert [kind for kind, _ in ctx.steps] == ["model", "model"]


def search(query: str = "") -> str:
    """Search the orders."""
    return f"results for {query!r}"


def garbled(name: str, call_id: str = "c0") -> ToolCall:
    """A tool call whose arguments the model wrote as invalid JSON, as providers report it."""
    raw = '{"query": "A-'
    error = f"not valid JSON (Unterminated string starting at: line 1 column 11): {raw!r}"
    return ToolCall(call_id, name, {}, arguments_error=error, raw_arguments=raw)


async def test_garbled_arguments_are_fed_back_and_the_tool_is_not_run() -> None:
    # Running the tool with {} instead would act on arguments the model never gave.
    first = ModelResponse(
        text="", tool_calls=(garbled("search"), ToolCall("c1", "search", {"query": "B-2"}))
    )
    ctx = FakeContext(responses=[first, text("ok")])

    out = await _run(_program(search), ctx)

    assert out == {"answer": "ok", "finish_reason": "stop", "turns": 2, "tool_calls": 2}
    assert ctx.steps == [
        ("model", "scripted:s.yaml"),
        ("tool", "search"),
        ("model", "scripted:s.yaml"),
    ]
    messages = ctx.model_calls[1].messages
    assert messages[2] == first.message()
    assert messages[3] == {
        "role": "tool",
        "tool_call_id": "c0",
        "name": "search",
        "content": "error: ToolArgumentsError: invalid arguments for tool 'search': not valid "
        'JSON (Unterminated string starting at: line 1 column 11): \'{"query": "A-\'. The '
        "tool was not run; call it again with its arguments as one JSON object.",
        "is_error": True,
    }
    assert messages[4]["content"] == "results for 'B-2'"


async def test_garbled_arguments_take_no_step_and_ask_no_human() -> None:
    first = ModelResponse(text="", tool_calls=(garbled("ask_human"),))
    ctx = FakeContext(responses=[first, text("ok")], inbox={"human": ["yes"]})

    await _run(_program(human=True, limits=Limits(max_steps=2)), ctx)

    assert [kind for kind, _ in ctx.steps] == ["model", "model"]
    assert ctx.inbox["human"] == ["yes"]
    answer = ctx.model_calls[1].messages[-1]["content"]
    assert answer.startswith("error: ToolArgumentsError: invalid arguments for tool 'ask_human'")


async def test_max_steps_stops_the_run_with_a_clear_reason() -> None:
    def forever(call: ModelCall) -> Any:
        return calls(("lookup_order", {"order_id": "A"}))

    ctx = FakeContext(responses=forever)
    with pytest.raises(LimitExceeded) as info:
        await _run(_program(lookup_order, limits=Limits(max_steps=5)), ctx)
    assert "max_steps=5" in str(info.value) and "limits.max_steps" in str(info.value)
    assert info.value.details["limit"] == "max_steps"
    assert ctx.usage.steps <= 5


async def test_max_cost_stops_the_run() -> None:
    def forever(call: ModelCall) -> Any:
        return calls(("lookup_order", {"order_id": "A"}))

    ctx = FakeContext(responses=forever, cost_per_call=Decimal("0.02"))
    with pytest.raises(LimitExceeded) as info:
        await _run(_program(lookup_order, limits=Limits(max_cost_usd=0.05)), ctx)
    assert "max_cost_usd=0.05" in str(info.value) and "$0.06" in str(info.value)
    assert len(ctx.model_calls) == 3


async def test_ask_human_waits_for_a_message() -> None:
    ctx = FakeContext(
        responses=[calls(("ask_human", {"question": "Refund 120 EUR?"})), text("Refunded.")],
        inbox={"human": [{"message": "yes, approved"}]},
    )
    program = _program(lookup_order, human=True)
    out = await _run(program, ctx)
    assert out["answer"] == "Refunded."
    assert ("wait_for_message", "human") in ctx.steps
    assert ctx.model_calls[1].messages[-1]["content"] == "yes, approved"
    assert "ask_human" in [t.name for t in ctx.model_calls[0].tools]


async def test_ask_human_timeout_is_told_to_the_model() -> None:
    ctx = FakeContext(responses=[calls(("ask_human", {"question": "?"})), text("ok")])
    await _run(_program(human=True), ctx)
    assert ctx.model_calls[1].messages[-1]["content"] == "no answer from a human within 60 seconds"


def test_input_shapes() -> None:
    assert parse_input("hi") == "hi"
    assert parse_input({"message": "hi", "extra": 1}) == "hi"
    for bad in (None, 3, {"text": "hi"}, ["hi"]):
        with pytest.raises(InvalidInput, match="string or"):
            parse_input(bad)


def test_tool_results_serialise_with_sorted_keys() -> None:
    # A result read back from Postgres JSONB may come in another key order.
    assert tool_result_text({"b": 1, "a": [1, 2]}) == tool_result_text({"a": [1, 2], "b": 1})
    assert tool_result_text("plain") == "plain"
    assert tool_result_text({"é": 1}) == '{"é": 1}'
