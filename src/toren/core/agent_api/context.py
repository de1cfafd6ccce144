"""The context API: what agent code is written against.

Every ``ctx.<effect>(...)`` is one durable step. Its position in the stream is taken when it
is *called* (these are plain methods returning awaitables), so steps started together with
``asyncio.gather`` get the same positions on every replay, whatever order they finish in.
The replay decision is taken at call time as well; only the live execution is awaited.

Branches run side by side with :meth:`Context.gather` and :meth:`Context.task_group`
(:mod:`toren.core.agent_api.combinators`): the engine knows their branches, so it can tell that
every one waits on a durable wait and park the run without reading asyncio's internals.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, overload

from toren.core.agent_api import combinators
from toren.core.contract.digest import request_digest
from toren.core.contract.model_types import (
    DeltaCallback,
    ModelRequest,
    ModelResponse,
    ToolSpec,
    frozen,
)
from toren.core.contract.values import StepKind, Totals
from toren.errors import InvalidInput

if TYPE_CHECKING:
    from toren.core.agent_api.branches import Branches
    from toren.core.agent_api.program import AgentProgram
    from toren.core.contract.digest import HashCache, HashedRequest

T = TypeVar("T")


@dataclass(frozen=True)
class RunUsage:
    """``ctx.usage``: what the run has spent so far, money as a ``Decimal`` (an edge)."""

    input_tokens: int
    output_tokens: int
    cost_usd: Decimal
    steps: int

    @classmethod
    def from_totals(cls, totals: Totals) -> RunUsage:
        # ``nano / 10**9`` unnormalised (``10``, not ``1E+1`` as from_nano would give):
        # agent code quotes this value in messages runs record (the built-in loop's
        # max_cost_usd failure), so its spelling is part of the log.
        cost = Decimal(totals.cost_nanousd) / Decimal(10**9)
        return cls(totals.input_tokens, totals.output_tokens, cost, totals.steps)


class StepRunner(Protocol):
    """What a context calls: the tick's steps (``toren.core.drivers.steps.LiveSteps``) or the dry
    run of ``toren plan`` (``toren.core.drivers.plan.PlanRunner``). Each ``*_step`` takes the replay
    decision synchronously, at call time, and returns what to await."""

    run_id: str
    hashes: HashCache

    @property
    def branches(self) -> Branches: ...  # what ctx.gather and ctx.task_group tell the engine

    @property
    def raised_limits(self) -> Mapping[str, Any]: ...

    def usage(self) -> RunUsage: ...

    def model_step(
        self,
        ctx: Context,
        pos: int,
        hashed: HashedRequest,
        request: ModelRequest,
        on_delta: Callable[[str], None] | None,
    ) -> Awaitable[ModelResponse]: ...

    def tool_step(
        self, ctx: Context, pos: int, digest: str, name: str, args: dict[str, Any]
    ) -> Awaitable[Any]: ...

    def value_step(self, ctx: Context, pos: int, digest: str, what: str) -> Awaitable[Any]: ...

    def sleep_step(
        self, ctx: Context, pos: int, digest: str, seconds: float
    ) -> Awaitable[None]: ...

    def message_step(
        self, ctx: Context, pos: int, digest: str, name: str, timeout: float | None
    ) -> Awaitable[Any]: ...

    def child_step(
        self, ctx: Context, pos: int, digest: str, process: str, input: Any
    ) -> Awaitable[Any]: ...


class Context:
    """One stream of a run. The root stream is named after the run's process; a child
    spawned at position ``k`` of stream ``s`` runs in stream ``f"{s}/{k}"``."""

    def __init__(self, runner: StepRunner, stream: str, program: AgentProgram, input: Any) -> None:
        self._runner = runner
        self._next = 0
        self.stream = stream
        self.program = program
        self.input = input

    @property
    def run_id(self) -> str:
        return self._runner.run_id

    @property
    def agent(self) -> str:
        return self.program.agent

    @property
    def process(self) -> str:
        return self.program.process

    @property
    def usage(self) -> RunUsage:
        """What the run has spent (tokens, estimated cost, steps) as of this point of the
        code: on replay, the totals as they stood when the step just replayed was
        recorded, as the live run saw them here; live, everything spent so far. Code that
        decides on it (a budget) takes the same branch on every replay."""
        return self._runner.usage()

    @property
    def raised_limits(self) -> Mapping[str, Any]:
        """Limits a retry of this run raised (``toren runs retry --max-steps 50``):
        ``max_steps`` and ``max_cost_usd``, when set. Agent code that enforces agent.yaml's
        limits itself applies them with :func:`toren.core.agent_api.program.raised`."""
        return self._runner.raised_limits

    def _position(self) -> int:
        pos = self._next
        self._next += 1
        return pos

    @property
    def positions_taken(self) -> int:
        return self._next

    # -- effects -------------------------------------------------------------------------

    def model(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[ToolSpec | Mapping[str, Any]] = (),
        on_delta: DeltaCallback | None = None,
        **params: Any,
    ) -> Awaitable[ModelResponse]:
        """Call a model, ``"provider:model"`` (``"openai:gpt-4o-mini"``,
        ``"scripted:script.yaml"``). Raises ``ModelCallFailed`` after retries."""
        provider, sep, name = model.partition(":")
        if not sep or not provider or not name:
            raise InvalidInput(
                f"model {model!r} is not of the form 'provider:model' "
                "(e.g. 'openai:gpt-4o-mini' or 'scripted:script.yaml')"
            )
        specs = (
            tuple(t if isinstance(t, ToolSpec) else _tool_spec(t) for t in tools) if tools else ()
        )
        # Built without the dataclass __init__ (``frozen``), deliberately: ModelRequest has
        # no __post_init__, so its __init__ would check nothing the agent passed (a
        # dataclass checks no types), only add a setattr per field, ~2,200 instructions on
        # every ctx.model, replayed ones included (~0.8% of a replayed step). What is
        # checked is checked here (the model's form, the tools) and by the digest, which
        # refuses messages and params that are not JSON. tests/test_vocabulary.py fails if
        # ModelRequest gains a __post_init__ (this would then skip it).
        request = frozen(
            ModelRequest,
            provider=provider,
            model=name,
            messages=tuple(messages),
            tools=specs,
            params=params,
        )
        pos = self._position()
        hashed = self._runner.hashes.model(request)
        return self._runner.model_step(self, pos, hashed, request, on_delta)

    def tool(self, name: str, args: Mapping[str, Any] | None = None) -> Awaitable[Any]:
        """Run a tool of this agent. Raises ``ToolFailed`` if the tool raised."""
        args = dict(args or {})
        pos = self._position()
        digest = request_digest(StepKind.TOOL, {"name": name, "args": args})
        return self._runner.tool_step(self, pos, digest, name, args)

    def now(self) -> Awaitable[float]:
        """The current time (epoch seconds), recorded: replay returns the same instant."""
        return self._value("now")

    def random(self) -> Awaitable[float]:
        return self._value("random")

    def uuid(self) -> Awaitable[str]:
        return self._value("uuid")

    def _value(self, what: str) -> Awaitable[Any]:
        pos = self._position()
        digest = request_digest(StepKind.VALUE, {"what": what})
        return self._runner.value_step(self, pos, digest, what)

    def sleep(self, seconds: float) -> Awaitable[None]:
        """A durable timer: survives restarts; long sleeps park the run (status waiting)."""
        if not isinstance(seconds, (int, float)) or seconds < 0:
            raise InvalidInput(f"sleep seconds must be a non-negative number, got {seconds!r}")
        pos = self._position()
        digest = request_digest(StepKind.SLEEP, {"seconds": seconds})
        return self._runner.sleep_step(self, pos, digest, seconds)  # as given: see TimerScheduled

    def wait_for_message(self, name: str, timeout: float | None = None) -> Awaitable[Any]:
        """Wait for a message named ``name`` sent to this run; None after ``timeout``."""
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise InvalidInput(f"timeout must be a non-negative number, got {timeout!r}")
        pos = self._position()
        digest = request_digest(StepKind.MESSAGE, {"name": name, "timeout": timeout})
        return self._runner.message_step(self, pos, digest, name, timeout)

    # -- branches --------------------------------------------------------------------------

    @overload
    def gather(
        self, *aws: Awaitable[T], return_exceptions: Literal[False] = False
    ) -> Awaitable[list[T]]: ...

    @overload
    def gather(
        self, *aws: Awaitable[T], return_exceptions: bool
    ) -> Awaitable[list[T | BaseException]]: ...

    def gather(self, *aws: Awaitable[Any], return_exceptions: bool = False) -> Awaitable[Any]:
        """Run ``aws`` side by side as branches the engine knows; their results in order.
        Branches start at once and in order, as with ``asyncio.gather`` (so their steps
        take the positions they would there). Unlike ``asyncio.gather``, the first error
        cancels the other branches and waits for them before it is raised, as itself;
        ``return_exceptions=True`` returns ordinary errors in place (never an abort of the
        run). Await it once. See docs/agent-code.md."""
        return combinators.gather(
            *aws, return_exceptions=return_exceptions, branches=self._runner.branches
        )

    def task_group(self) -> combinators.TaskGroup:
        """``async with ctx.task_group() as tg: tg.create_task(...)``: an
        ``asyncio.TaskGroup`` whose branches the engine knows (a failure cancels the body
        and the other branches; errors come out as an ``ExceptionGroup``; an abort of the
        run as itself). See docs/agent-code.md."""
        return combinators.TaskGroup(self._runner.branches)

    def spawn(self, process: str, input: Any = None) -> Awaitable[Any]:
        """Run another process of this agent as a child stream and return its output."""
        pos = self._position()
        digest = request_digest(StepKind.CHILD, {"process": process, "input": input})
        return self._runner.child_step(self, pos, digest, process, input)


def _tool_spec(data: Mapping[str, Any]) -> ToolSpec:
    return ToolSpec(
        name=str(data["name"]),
        description=str(data.get("description", "")),
        parameters=dict(data.get("parameters") or {"type": "object", "properties": {}}),
    )
