"""The built-in tool-calling loop: an :data:`AgentFn` made from an agent.yaml process.

One turn is a model call; if the model asked for tools, every tool call of the turn starts
at once, each its own step, and their results go back to the model in the order the model
asked for them. A failed tool is not a failed run: its error text is what the model sees,
and the model decides what to do next (the run row counts it in ``tool_errors``), unless
agent.yaml sets ``on_tool_error: fail``: then the tool's failure fails the run, as it would
from ``entry:`` code, retryable. Nor is a tool call whose arguments the model
garbled (not a JSON object): it is answered with the problem, and the tool is not run.
The loop ends on an answer without tool calls, or on a limit (``LimitExceeded`` naming
the limit and the setting).

The tool calls of a turn are structured, as in a task group: they run as the branches of
one ``ctx.gather`` (so the engine knows them, and parks a turn whose calls all wait on a
human without reading asyncio's internals). Anything else a tool call raises (an agent
bug, an engine abort) cancels its siblings and waits for them to unwind before it
propagates, as itself. A sibling left running would go on working (a tool sending an
email, say) after the run has failed or been given back. Positions: each call takes its
step's position in its branch's first slice, and branches start in the model's order of
calls, so positions follow that order on every replay (as they did with the bare
``asyncio`` combinators this replaced).

Determinism: replay re-executes this code and must make the same requests in the same
order. Everything the loop decides on is either recorded (model responses, tool results)
or a pure function of them, and tool results are serialised with sorted keys so that a
result read back from the log (where JSON key order is not guaranteed, e.g. Postgres
JSONB) produces byte-identical messages to the live run.

Limits follow the same rule. ``max_steps`` counts the loop's own steps (model calls, tool
calls, waits), which replay reproduces exactly. ``max_cost_usd`` is checked against
``ctx.usage.cost_usd``, which on replay is the run's spending as it stood when the step
being replayed was recorded (what the live run saw at that point), so a check that passed
live passes on replay too; once live, it is everything spent, superseded steps included.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from toren.agents.config import HumanConfig
from toren.core.agent_api.program import AgentFn, Limits, raised
from toren.errors import InvalidInput, LimitExceeded, ToolFailed
from toren.providers.base import ModelResponse, ToolCall, ToolSpec

if TYPE_CHECKING:
    from toren.core.agent_api.context import Context

__all__ = ["ASK_HUMAN_SPEC", "LoopSpec", "make_loop", "parse_input", "tool_result_text"]

ASK_HUMAN_SPEC = ToolSpec(
    name="ask_human",
    description=(
        "Ask a human operator a question and wait for the answer. Use it when you need a "
        "decision, an approval or information only a person has."
    ),
    parameters={
        "type": "object",
        "properties": {
            "question": {"type": "string", "description": "The question for the human."}
        },
        "required": ["question"],
        "additionalProperties": False,
    },
)


@dataclass(frozen=True)
class LoopSpec:
    """Everything the loop needs from agent.yaml for one process."""

    agent: str
    process: str
    model: str
    instructions: str = ""
    tools: tuple[ToolSpec, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    human: HumanConfig | None = None  # set when the process offers ``ask_human``
    # agent.yaml's ``on_tool_error``: "continue" (the model sees the error) or "fail"
    on_tool_error: str = "continue"

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        return (*self.tools, ASK_HUMAN_SPEC) if self.human is not None else self.tools


def parse_input(value: object) -> str:
    """A run input for the loop: a string, or a mapping with a string ``message``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("message"), str):
        return str(value["message"])
    raise InvalidInput(
        "the built-in agent loop takes a string or {'message': '...'} as input; "
        f"found {_short(value)}"
    )


def tool_result_text(result: object) -> str:
    """A tool result as the content of a tool message. Sorted keys: see module docstring."""
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False, sort_keys=True, default=str)


def make_loop(spec: LoopSpec) -> AgentFn:
    """The :data:`AgentFn` that runs ``spec`` with the built-in loop."""

    async def run(ctx: Context, input: object) -> dict[str, object]:
        return await _Loop(spec, ctx).run(parse_input(input))

    run.__name__ = run.__qualname__ = f"loop[{spec.agent}/{spec.process}]"
    return run


class _Loop:
    def __init__(self, spec: LoopSpec, ctx: Context) -> None:
        self.spec = spec
        self.ctx = ctx
        self.specs = spec.tool_specs()
        self.names = {s.name for s in self.specs}
        self.steps = 0  # steps this loop has taken; see "Limits" in the module docstring

    async def run(self, message: str) -> dict[str, object]:
        messages: list[dict[str, object]] = []
        if self.spec.instructions:
            messages.append({"role": "system", "content": self.spec.instructions})
        messages.append({"role": "user", "content": message})
        turns = tool_calls = 0
        while True:
            self._check_limits(next_steps=1)
            self.steps += 1
            response = await self.ctx.model(
                self.spec.model, messages, tools=self.specs, **self.spec.params
            )
            turns += 1
            messages.append(response.message())
            if not response.tool_calls:
                return self._answer(response, turns, tool_calls)
            needed = self._steps_for(response.tool_calls)
            self._check_limits(next_steps=needed)
            self.steps += needed
            results = await self.ctx.gather(*(self._run_tool(c) for c in response.tool_calls))
            tool_calls += len(results)
            messages.extend(results)

    def _answer(self, response: ModelResponse, turns: int, tool_calls: int) -> dict[str, object]:
        return {
            "answer": response.text,
            "finish_reason": response.finish_reason,
            "turns": turns,
            "tool_calls": tool_calls,
        }

    def _steps_for(self, calls: Sequence[ToolCall]) -> int:
        # A call to an unknown tool, or with garbled arguments, is answered without a step.
        return sum(1 for c in calls if c.name in self.names and c.arguments_error is None)

    async def _run_tool(self, call: ToolCall) -> dict[str, object]:
        if call.name in self.names and call.arguments_error is not None:
            return _garbled_arguments(call)
        try:
            if call.name == ASK_HUMAN_SPEC.name and self.spec.human is not None:
                content = await self._ask_human(call.arguments)
            elif call.name not in self.names:
                content = (
                    f"error: there is no tool named {call.name!r}; "
                    f"available tools: {sorted(self.names)}"
                )
            else:
                content = tool_result_text(await self.ctx.tool(call.name, call.arguments))
        except ToolFailed as exc:
            if self.spec.on_tool_error == "fail":
                # As from entry code: the run fails with the tool's error and traceback,
                # and a retry runs the tool again (the exception names its step).
                raise
            content = f"error: {exc.message}"
        return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}

    async def _ask_human(self, arguments: Mapping[str, object]) -> str:
        human = self.spec.human
        assert human is not None
        reply = await self.ctx.wait_for_message(human.message, timeout=human.timeout)
        if reply is None:
            return f"no answer from a human within {human.timeout:g} seconds"
        if isinstance(reply, Mapping):
            for key in ("message", "text", "answer"):
                if isinstance(reply.get(key), str):
                    return str(reply[key])
        return tool_result_text(reply)

    def _check_limits(self, *, next_steps: int) -> None:
        limits = raised(self.spec.limits, self.ctx.raised_limits)  # a retry may raise them
        where = f"agent {self.spec.agent!r} process {self.spec.process!r}"
        if limits.max_steps is not None and self.steps + next_steps > limits.max_steps:
            raise LimitExceeded(
                f"{where} stopped at max_steps={limits.max_steps}: {self.steps} steps taken "
                f"and the next turn needs {next_steps} more. Raise limits.max_steps in "
                "agent.yaml if the task needs more steps.",
                limit="max_steps",
                value=limits.max_steps,
                steps=self.steps,
            )
        if limits.max_cost_usd is not None:
            usage = self.ctx.usage
            budget = Decimal(str(limits.max_cost_usd))
            if usage.cost_usd >= budget:
                raise LimitExceeded(
                    f"{where} stopped at max_cost_usd={budget}: the run has spent an "
                    f"estimated ${usage.cost_usd} (price table estimate). Raise "
                    "limits.max_cost_usd in agent.yaml to allow more.",
                    limit="max_cost_usd",
                    value=str(budget),
                    cost_usd=str(usage.cost_usd),
                )


def _garbled_arguments(call: ToolCall) -> dict[str, object]:
    """The answer to a call whose arguments the model garbled (see :class:`ToolCall`). The
    tool is not run: ``{}`` in their place would act on arguments the model never gave.
    Worded like a schema mismatch found by the tool step; ``is_error`` marks it for APIs
    that take the flag (the other error answers above predate it, and adding it to them
    would change the requests of every in-flight run)."""
    return {
        "role": "tool",
        "tool_call_id": call.id,
        "name": call.name,
        "content": f"error: ToolArgumentsError: invalid arguments for tool {call.name!r}: "
        f"{call.arguments_error}. The tool was not run; call it again with its arguments "
        "as one JSON object.",
        "is_error": True,
    }


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
