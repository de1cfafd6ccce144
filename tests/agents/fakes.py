"""A small in-memory stand-in for ``toren.core.agent_api.context.Context`` (no journal, no replay).

It implements exactly the surface the built-in loop uses, and records every step so tests
can assert what was asked, in which order, and what ran concurrently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from toren.core.agent_api import combinators
from toren.core.agent_api.program import AgentProgram
from toren.errors import ToolFailed
from toren.providers.base import ModelResponse, ToolCall, ToolSpec, Usage


@dataclass
class FakeUsage:
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    steps: int = 0


@dataclass
class ModelCall:
    model: str
    messages: list[dict[str, Any]]
    tools: tuple[ToolSpec, ...]
    params: dict[str, Any]


Responder = Callable[[ModelCall], ModelResponse]


def text(value: str, **usage: int) -> ModelResponse:
    return ModelResponse(text=value, usage=Usage(**usage))


def calls(*items: tuple[str, Mapping[str, Any]], **usage: int) -> ModelResponse:
    return ModelResponse(
        text="",
        tool_calls=tuple(
            ToolCall(id=f"c{i}", name=name, arguments=dict(args))
            for i, (name, args) in enumerate(items)
        ),
        usage=Usage(**usage),
        finish_reason="tool_calls",
    )


@dataclass
class FakeContext:
    program: AgentProgram | None = None
    responses: Sequence[ModelResponse] | Responder = ()
    inbox: dict[str, list[Any]] = field(default_factory=dict)
    cost_per_call: Decimal = Decimal(0)
    run_id: str = "run-test"
    stream: str = "main"
    process: str = "main"
    agent: str = "test-agent"
    usage: FakeUsage = field(default_factory=FakeUsage)
    model_calls: list[ModelCall] = field(default_factory=list)
    steps: list[tuple[str, str]] = field(default_factory=list)
    raised_limits: dict[str, Any] = field(default_factory=dict)

    async def model(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[ToolSpec] = (),
        on_delta: Any = None,
        **params: Any,
    ) -> ModelResponse:
        call = ModelCall(model, [dict(m) for m in messages], tuple(tools), params)
        self._step("model", model)
        self.model_calls.append(call)
        if callable(self.responses):
            response = self.responses(call)
        else:
            index = len(self.model_calls) - 1
            response = self.responses[index] if index < len(self.responses) else text("done")
        self.usage.input_tokens += response.usage.input_tokens
        self.usage.output_tokens += response.usage.output_tokens
        self.usage.cost_usd += self.cost_per_call
        return response

    async def tool(self, name: str, args: Mapping[str, Any]) -> Any:
        self._step("tool", name)
        assert self.program is not None, "FakeContext needs a program to run tools"
        tool = self.program.tools[name]
        try:
            return await tool.fn(**dict(args))
        except Exception as exc:
            raise ToolFailed(f"{type(exc).__name__}: {exc}") from exc

    async def wait_for_message(self, name: str, timeout: float | None = None) -> Any | None:
        self._step("wait_for_message", name)
        queue = self.inbox.get(name) or []
        return queue.pop(0) if queue else None

    async def now(self) -> float:
        self._step("now", "")
        return 0.0

    async def sleep(self, seconds: float) -> None:
        self._step("sleep", str(seconds))
        await asyncio.sleep(0)

    def gather(self, *aws: Any, return_exceptions: bool = False) -> Any:
        return combinators.gather(*aws, return_exceptions=return_exceptions)

    def _step(self, kind: str, detail: str) -> None:
        self.usage.steps += 1
        self.steps.append((kind, detail))
