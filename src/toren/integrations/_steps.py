"""What the framework integrations share: the ``max_steps`` check before each step, the
text prompt a framework agent takes, and the tools mapping the engine sees. Each
integration names its framework in the messages (``framework``: "pydantic-ai agent",
"OpenAI Agents SDK agent")."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from toren.core.agent_api.program import ToolDef, raised
from toren.core.contract.model_types import ToolSpec
from toren.errors import InvalidInput, LimitExceeded

if TYPE_CHECKING:
    from toren.core.agent_api.context import Context

__all__ = ["StepTools", "check_steps", "prompt_of"]


def check_steps(ctx: Context, framework: str, what: str) -> None:
    """agent.yaml's ``limits.max_steps`` (raised by a retry, never lowered), counted in
    the run's steps. Checked before the step is taken, from positions a replay takes the
    same way, so a replay stops where the live run did."""
    limits = raised(ctx.program.limits, ctx.raised_limits)
    taken = ctx.positions_taken
    if limits.max_steps is not None and taken >= limits.max_steps:
        raise LimitExceeded(
            f"agent {ctx.agent!r} process {ctx.process!r} stopped at "
            f"max_steps={limits.max_steps}: {taken} steps taken and the {framework} "
            f"asked for one more ({what}). Raise limits.max_steps in agent.yaml if the task "
            "needs more steps.",
            limit="max_steps",
            value=limits.max_steps,
            steps=taken,
        )


def prompt_of(input: object, framework: str) -> str:
    """The run's input as the framework agent's text prompt: a string, or an object with
    a ``prompt`` string."""
    if isinstance(input, str):
        return input
    if isinstance(input, Mapping) and isinstance(input.get("prompt"), str):
        return str(input["prompt"])
    article = "an" if framework[:1].lower() in "aeiou" else "a"
    raise InvalidInput(
        f"{article} {framework} takes a text prompt; found {type(input).__name__} "
        f"{json.dumps(input, default=str)[:200]}; expected a string, or an object with a "
        "'prompt' string"
    )


class StepTools(Mapping[str, ToolDef]):
    """The tools of a framework agent as the engine sees them: those it declares (kept by
    reference: an integration may declare more as it meets them), and any other name its
    steps use as a tool with side effects, run by ``fn``."""

    def __init__(self, known: Mapping[str, ToolDef], fn: Callable[..., Any]) -> None:
        self._known, self._fn = known, fn

    def __getitem__(self, name: str) -> ToolDef:
        found = self._known.get(name)
        return found or ToolDef(name=name, fn=self._fn, spec=ToolSpec(name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)

    def __iter__(self) -> Iterator[str]:
        return iter(self._known)

    def __len__(self) -> int:
        return len(self._known)
