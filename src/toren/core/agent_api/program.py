"""What the engine runs: an agent's processes, its tools and its code version.

The engine never loads agent directories itself; an :class:`AgentResolver` (the agent
loader in ``toren.agents``, or a plain dict-backed registry in tests) hands it an
:class:`AgentProgram` per (agent, process).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

from toren.config import RateLimit
from toren.core.contract.flow import Concurrency
from toren.core.contract.model_types import ToolSpec, Usage
from toren.core.contract.ports import ModelProvider
from toren.core.contract.schedule import ScheduleDef
from toren.core.contract.values import from_nano, retry_limits, to_nano
from toren.errors import AgentNotFound

if TYPE_CHECKING:
    from toren.core.agent_api.context import Context

AgentFn = Callable[["Context", Any], Awaitable[Any]]
Pricing = Callable[[str, Usage], Decimal]  # ("provider:model", usage) -> estimated USD


@dataclass(frozen=True)
class ToolDef:
    """A callable tool. After an invalidation, an identical call of a tool with side effects
    (the default) reuses the recorded result, so a prompt edit never re-sends the email.
    ``side_effects=False`` (a read: looking up an order; MCP's ``readOnlyHint``) and
    ``reexecute=True`` (a result that must be fresh even though the tool acts, such as
    reading and reserving a price) opt out: the tool runs again."""

    name: str
    fn: Callable[..., Any]
    spec: ToolSpec
    reexecute: bool = False
    side_effects: bool = True


@dataclass(frozen=True)
class Limits:
    """A run's limits. ``max_cost_usd`` is money at an edge, so a ``Decimal``; a float, an
    int or a string given here (as 0.1 releases took) is read as the ``Decimal`` it is
    spelled as (``0.1`` -> ``Decimal("0.1")``, never the float's binary expansion), so
    the limit prints as it did in the failure messages runs record."""

    max_steps: int | None = None
    max_cost_usd: Decimal | None = None
    step_timeout: float | None = None

    def __post_init__(self) -> None:
        cost: object = self.max_cost_usd
        if cost is not None and not isinstance(cost, Decimal):
            object.__setattr__(self, "max_cost_usd", usd(cost))


def usd(value: object) -> Decimal:
    """A USD amount from outside (agent.yaml, a retry's recorded ``raise_limits``, user
    code) as the ``Decimal`` its text spells."""
    return value if isinstance(value, Decimal) else Decimal(str(value))


def raised(limits: Limits, raises: Mapping[str, object]) -> Limits:
    """``limits`` with each of ``raises`` (a retry's ``raise_limits``, read by
    :func:`toren.core.contract.values.retry_limits`: ``max_steps``, ``max_cost_nanousd``, or an
    earlier release's numbers) applied where it is higher. A limit is never lowered (a
    check that passed when a step was recorded must pass on replay), and an unset one
    stays unset."""
    raises = retry_limits(raises)
    steps, wanted_steps = limits.max_steps, raises.get("max_steps")
    if steps is not None and wanted_steps is not None and wanted_steps > steps:
        limits = replace(limits, max_steps=wanted_steps)
    cost, wanted_nano = limits.max_cost_usd, raises.get("max_cost_nanousd")
    if cost is not None and wanted_nano is not None and wanted_nano > to_nano(cost):
        limits = replace(limits, max_cost_usd=from_nano(wanted_nano))
    return limits


@dataclass(frozen=True)
class AgentProgram:
    """One process of one agent, ready to run."""

    agent: str
    process: str
    fn: AgentFn
    tools: Mapping[str, ToolDef] = field(default_factory=dict)
    code_version: str = "dev"
    limits: Limits = field(default_factory=Limits)
    processes: tuple[str, ...] = ("main",)
    # Provider instances bound to this agent (a ``scripted`` provider reading the agent's
    # script file, an ``openai`` provider with the agent's base_url). They take precedence
    # over the runtime-wide providers in ``TickDeps.providers``.
    providers: Mapping[str, ModelProvider] = field(default_factory=dict)
    # The agent's price table (defaults plus its agent.yaml overrides); wins over the
    # runtime-wide ``TickDeps.pricing``.
    pricing: Pricing | None = None
    # The agent's schedules (agent.yaml ``schedules:``), the same on each of its processes.
    schedules: tuple[ScheduleDef, ...] = ()
    # The process's concurrency limit (agent.yaml ``concurrency:``; toren.core.contract.flow).
    concurrency: Concurrency | None = None
    # Provider rate limits by "provider:model" (agent.yaml ``rate_limits:``;
    # toren.core.contract.ratelimit); they win over the worker's Settings.rate_limits.
    rate_limits: Mapping[str, RateLimit] = field(default_factory=dict)


class AgentResolver(Protocol):
    def resolve(self, agent: str, process: str) -> AgentProgram: ...

    def names(self) -> list[str]: ...


@dataclass
class Registry:
    """An in-memory resolver: register Python functions as agent processes."""

    programs: dict[tuple[str, str], AgentProgram] = field(default_factory=dict)

    def add(
        self,
        agent: str,
        fn: AgentFn,
        *,
        process: str = "main",
        tools: Mapping[str, ToolDef] | None = None,
        code_version: str = "dev",
        limits: Limits | None = None,
        schedules: Sequence[ScheduleDef] = (),
        concurrency: Concurrency | None = None,
        rate_limits: Mapping[str, RateLimit] | None = None,
    ) -> AgentProgram:
        program = AgentProgram(
            agent=agent,
            process=process,
            fn=fn,
            tools=dict(tools or {}),
            code_version=code_version,
            limits=limits or Limits(),
            schedules=tuple(schedules),
            concurrency=concurrency,
            rate_limits=dict(rate_limits or {}),
        )
        self.programs[(agent, process)] = program
        # Every program of the agent is made anew, each listing all its processes: the
        # agent changed, so a tick kept under its earlier programs replays (the kept tick
        # continues only under the very program it runs, and a child's is not checked).
        processes = tuple(sorted(p for a, p in self.programs if a == agent))
        for key in [key for key in self.programs if key[0] == agent]:
            self.programs[key] = replace(self.programs[key], processes=processes)
        return self.programs[(agent, process)]

    def resolve(self, agent: str, process: str) -> AgentProgram:
        try:
            program = self.programs[(agent, process)]
        except KeyError:
            known = sorted({a for a, _ in self.programs})
            if any(a == agent for a, _ in self.programs):
                procs = sorted(p for a, p in self.programs if a == agent)
                raise AgentNotFound(
                    f"agent {agent!r} has no process {process!r}; its processes are {procs}",
                    process=process,
                ) from None
            raise AgentNotFound(
                f"unknown agent {agent!r}; known agents: {known or 'none'}"
            ) from None
        processes = tuple(sorted(p for a, p in self.programs if a == agent))
        if program.processes != processes:
            # Kept, so that the same registration resolves to the same object every time:
            # a kept (sticky) tick continues only under the very program it runs.
            program = replace(program, processes=processes)
            self.programs[(agent, process)] = program
        return program

    def names(self) -> list[str]:
        return sorted({a for a, _ in self.programs})


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    reexecute: bool = False,
    side_effects: bool = True,
    name: str | None = None,
) -> Any:
    """Mark a function in ``tools.py`` as a tool, with its durability options.

    ``@toren.tool`` or ``@toren.tool(reexecute=True)``. Undecorated public functions of
    ``tools.py`` are tools too, with the defaults. ``side_effects=False`` declares a tool
    that only reads: after an invalidation it runs again instead of reusing the superseded
    result (see :class:`ToolDef`); every recorded step still replays from the log.
    """

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        f.__toren_tool__ = {  # type: ignore[attr-defined]
            "reexecute": reexecute,
            "side_effects": side_effects,
            "name": name or f.__name__,
        }
        return f

    return mark(fn) if fn is not None else mark
