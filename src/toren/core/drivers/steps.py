"""The step handlers of a tick: what each ``ctx.<effect>`` does with the journal's answer.

A replayed step answers from the log at no cost (:mod:`toren.core.drivers.effects` ``replay_*``); a
live one runs its effect (``call_model``, ``call_tool``, ``make_value``, a timer, a message wait, a
child stream), and the run's state (:class:`~toren.core.drivers.tickstate.TickState`, given to
:class:`LiveSteps`) stamps and commits what the effect returns before the agent code continues. The
decision itself, and the reuse claims that travel with it, are the journal's
(:mod:`toren.core.contract.journal`) and its policy's (:mod:`toren.core.contract.policy`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal
from typing import Any

from toren.core.agent_api.branches import Branches
from toren.core.agent_api.context import Context, RunUsage
from toren.core.agent_api.program import AgentProgram, ToolDef
from toren.core.contract import policy
from toren.core.contract.digest import HashedRequest
from toren.core.contract.events import (
    ChildCompleted,
    ChildStarted,
    ModelCallCutOff,
    ModelCallRecorded,
    TimerScheduled,
)
from toren.core.contract.failures import failure_dict, tagged
from toren.core.contract.journal import Replay
from toren.core.contract.model_types import (
    CancelledWithUsage,
    ModelRequest,
    ModelResponse,
    Usage,
)
from toren.core.contract.ports import ModelProvider
from toren.core.contract.ratelimit import PACED, Throttled
from toren.core.contract.replay import Step
from toren.core.contract.text import repair_text
from toren.core.contract.values import RunStatus, StepKind, Totals, recorded_nano, to_nano
from toren.core.drivers.effects import (
    call_model,
    call_tool,
    json_value,
    make_value,
    recorded_error,
    replay_child,
    replay_message,
    replay_model,
    replay_tool,
    replay_value,
    reported_usage,
    tool_result,
)
from toren.core.drivers.pacing import Pacing, limit_for
from toren.core.drivers.tickstate import TickState
from toren.core.drivers.waits import DurableWaits
from toren.errors import (
    LimitExceeded,
    ModelCallFailed,
    ProviderUnavailable,
    StepFailed,
)

_reported_usage = reported_usage  # the name tests and older callers import
log = logging.getLogger("toren.tick")
_NOTHING_USED = (0, 0, 0)  # a step that used no tokens and cost nothing


class LiveSteps:
    """The step handlers of a tick: the :class:`~toren.core.agent_api.context.StepRunner` the
    agent's contexts call, as :class:`~toren.core.drivers.plan.PlanRunner` is for the plan. Given
    the run's state; made by the driver (:class:`~toren.core.drivers.tick.TickRunner`) for the
    root context and never kept by it nor by the state, so references run one way
    (steps -> state) and a finished tick is freed without the cycle collector."""

    __slots__ = ("hashes", "run_id", "state", "waits")

    def __init__(self, state: TickState) -> None:
        self.state = state
        self.waits = DurableWaits(state)
        self.run_id = state.run_id
        self.hashes = state.hashes

    @property
    def branches(self) -> Branches:
        return self.state.parker.branches

    @property
    def raised_limits(self) -> Mapping[str, object]:
        return self.state.journal.raised_limits

    def usage(self) -> RunUsage:
        return self.state.usage()

    def model_step(
        self,
        ctx: Context,
        pos: int,
        hashed: HashedRequest,
        request: ModelRequest,
        on_delta: Callable[[str], None] | None,
    ) -> Awaitable[ModelResponse]:
        answer = self.state.ask(ctx.stream, pos, StepKind.MODEL, hashed.digest)
        if isinstance(answer, Replay):
            return self._replay_model(ctx.stream, answer.step, hashed)
        return self._live_model(ctx, pos, answer.generation, hashed, request, on_delta)

    async def _replay_model(self, stream: str, step: Step, hashed: HashedRequest) -> ModelResponse:
        state = self.state
        state.bodies.replayed(stream, step, hashed)
        state.replayed += 1
        if state.interrupted:
            payload = step.first.payload
            assert isinstance(payload, ModelCallRecorded)
            state.writer.add(Totals(saved_nanousd=recorded_nano(payload.cost_usd)))
        return replay_model(step)

    async def _record_cut_off(
        self,
        ctx: Context,
        pos: int,
        hashed: HashedRequest,
        request: ModelRequest,
        usage: Usage,
        started: float,
    ) -> None:
        """Record what a model call cut off in flight had billed (``ModelCallCutOff``, a
        run-level event: the step itself stays unrecorded and runs again), so the run's
        cost holds every call served. Best effort: the tick is being stopped, and a
        write that fails (the lease gone) loses only this count."""
        pricing = ctx.program.pricing or self.state.deps.pricing
        cost = pricing(f"{request.provider}:{request.model}", usage) if pricing else Decimal(0)
        reason = str(self.state.abort if self.state.abort is not None else RunStatus.CANCELLED)
        payload = ModelCallCutOff(
            stream=ctx.stream,
            position=pos,
            request_digest=hashed.digest,
            provider=request.provider,
            model=request.model,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost_usd=str(cost),
            latency_ms=round((self.state.monotonic() - started) * 1000, 3),
            reason=reason,
        )
        used = Totals(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost_nanousd=to_nano(cost) if cost else 0,
        )
        try:
            await self.state.write([self.state.run_event(payload)], used=used)
        except BaseException:  # the cancellation in flight is re-raised by the caller
            log.warning(
                "run %s: could not record the usage of a model call cut off at %s:%d "
                "(%d input, %d output tokens)",
                self.run_id,
                ctx.stream,
                pos,
                usage.input_tokens,
                usage.output_tokens,
            )

    def _provider(self, name: str, program: AgentProgram) -> ModelProvider:
        provider = program.providers.get(name) or self.state.deps.providers.get(name)
        if provider is None:
            known = sorted({*program.providers, *self.state.deps.providers})
            raise ProviderUnavailable(
                f"no model provider {name!r} is configured for agent {program.agent!r}; "
                f"configured providers: {known or 'none'}"
            )
        return provider

    def _check_budget(self, program: AgentProgram) -> None:
        state = self.state
        limit = policy.over_budget(
            state.limits(program), lambda: state.journal.spent().cost_nanousd
        )
        if limit is not None:
            raise LimitExceeded(
                f"run {self.run_id!r} has spent ${state.usage().cost_usd} of its "
                f"${limit} budget (limits.max_cost_usd); no further model calls are made"
            )

    async def _live_model(
        self,
        ctx: Context,
        pos: int,
        gen: int,
        hashed: HashedRequest,
        request: ModelRequest,
        on_delta: Callable[[str], None] | None,
    ) -> ModelResponse:
        state = self.state
        async with state.busy():
            self._check_budget(ctx.program)
            provider = self._provider(request.provider, ctx.program)

            def delta(text: str) -> None:
                text = repair_text(text)  # half a pair at a chunk's edge: see core/contract/text.py
                state.publish(
                    {"type": "delta", "stream": ctx.stream, "position": pos, "text": text}
                )
                if on_delta is not None:
                    on_delta(text)

            limit = limit_for(ctx.program, state, request)
            while True:
                slot = None
                if limit is not None:  # a fleet rate limit: wait for this call's slot
                    slot = await Pacing(state).slot(ctx.stream, pos, request, limit)
                started = state.monotonic()
                paced = PACED.set(slot is not None)
                try:
                    call = await call_model(
                        provider,
                        request,
                        hashed,
                        ctx.program,
                        bodies=state.bodies,
                        stream=ctx.stream,
                        pricing=ctx.program.pricing or state.deps.pricing,
                        monotonic=state.monotonic,
                        on_delta=delta,
                    )
                except CancelledWithUsage as cut:  # cut off in flight: count what it billed
                    await self._record_cut_off(ctx, pos, hashed, request, cut.usage, started)
                    raise
                except Throttled as exc:  # a 429 of a limited model: the fleet waits
                    assert slot is not None
                    await Pacing(state).throttled(slot, exc)
                    continue
                finally:
                    PACED.reset(paced)
                if slot is not None:
                    await Pacing(state).settle(
                        slot, call.used[0] + call.used[1], bool(call.response)
                    )
                break
            error = call.payload.error
            stored = await state.write(
                [state.event(ctx.stream, pos, gen, hashed.digest, call.payload)],
                blobs=call.blobs,
                step=call.used,
            )
            state.executed += 1
            if state.deps.telemetry is not None:
                state.deps.telemetry.on_model_call(
                    self.run_id,
                    ctx.stream,
                    pos,
                    request,
                    call.response,
                    call.latency_s,
                    False,
                    error=None if error is None else error["message"],
                    cost_usd=Decimal(call.payload.cost_usd),  # the recorded price, exactly
                )
            if error is not None:
                raise tagged(recorded_error(ModelCallFailed, error), stored[-1].seq)
            assert call.response is not None
            return call.response

    def tool_step(
        self, ctx: Context, pos: int, digest: str, name: str, args: dict[str, object]
    ) -> Awaitable[object]:
        tooldef = ctx.program.tools.get(name)
        reusable = policy.tool_reusable(tooldef)  # the plan asks the same (see policy.py)
        answer = self.state.ask(ctx.stream, pos, StepKind.TOOL, digest, reusable)
        if isinstance(answer, Replay):
            return self._replay(replay_tool, answer.step)
        return self._live_tool(
            ctx, pos, answer.generation, digest, name, args, tooldef, answer.reuse
        )

    async def _replay(self, answer: Callable[[Step], object], step: Step) -> object:
        self.state.replayed += 1
        return answer(step)

    async def _live_tool(
        self,
        ctx: Context,
        pos: int,
        gen: int,
        digest: str,
        name: str,
        args: dict[str, object],
        tooldef: ToolDef | None,
        reuse: Step | None,
    ) -> object:
        state = self.state
        async with state.busy():
            payload = await call_tool(
                name, args, tooldef, reuse, ctx.program, monotonic=state.monotonic
            )
            stored = await state.write(
                [state.event(ctx.stream, pos, gen, digest, payload)],
                step=_NOTHING_USED,
            )
            state.executed += 1
            if state.deps.telemetry is not None:
                state.deps.telemetry.on_tool_call(
                    self.run_id,
                    ctx.stream,
                    pos,
                    name,
                    payload.latency_ms / 1000,
                    False,
                    error=None if payload.error is None else payload.error["message"],
                )
            return tool_result(payload, stored[-1].seq)

    def value_step(self, ctx: Context, pos: int, digest: str, what: str) -> Awaitable[object]:
        answer = self.state.ask(ctx.stream, pos, StepKind.VALUE, digest)
        if isinstance(answer, Replay):
            return self._replay(replay_value, answer.step)
        return self._live_value(ctx, pos, answer.generation, digest, what)

    async def _live_value(self, ctx: Context, pos: int, gen: int, digest: str, what: str) -> object:
        state = self.state
        async with state.busy():
            payload = make_value(what, state.clock.now, state.deps.random, state.deps.uuid)
            await state.write(
                [state.event(ctx.stream, pos, gen, digest, payload)], step=_NOTHING_USED
            )
            state.executed += 1
            return payload.value

    def sleep_step(self, ctx: Context, pos: int, digest: str, seconds: float) -> Awaitable[None]:
        answer = self.state.ask(ctx.stream, pos, StepKind.SLEEP, digest)
        if isinstance(answer, Replay):
            step = answer.step
            if step.complete:
                self.state.replayed += 1
                return _done(None)
            payload = step.first.payload
            assert isinstance(payload, TimerScheduled)
            return self.waits.await_timer(
                ctx, pos, step.first.generation, step.digest, payload.fire_at
            )
        return self.waits.start_timer(ctx, pos, answer.generation, digest, seconds)

    def message_step(
        self, ctx: Context, pos: int, digest: str, name: str, timeout: float | None
    ) -> Awaitable[object]:
        answer = self.state.ask(ctx.stream, pos, StepKind.MESSAGE, digest)
        if isinstance(answer, Replay):
            step = answer.step
            if step.complete:
                self.state.replayed += 1
                return _done(replay_message(step))
            first = step.first.payload
            assert isinstance(first, TimerScheduled)
            return self.waits.await_message(
                ctx, pos, step.first.generation, step.digest, name, first.fire_at
            )
        return self.waits.start_message_wait(ctx, pos, answer.generation, digest, name, timeout)

    def child_step(
        self, ctx: Context, pos: int, digest: str, process: str, input: object
    ) -> Awaitable[object]:
        answer = self.state.ask(ctx.stream, pos, StepKind.CHILD, digest)
        if isinstance(answer, Replay):
            step = answer.step
            if step.complete:
                self.state.replayed += 1
                try:
                    return _done(replay_child(step))
                except StepFailed as exc:
                    return _fail(exc)
            return self._run_child(
                ctx, pos, step.first.generation, step.digest, process, input, False
            )
        return self._run_child(
            ctx, pos, answer.generation, digest, process, input, True, answer.continues
        )

    async def _run_child(
        self,
        ctx: Context,
        pos: int,
        gen: int,
        digest: str,
        process: str,
        input: object,
        live: bool,
        continues: str | None = None,
    ) -> object:
        child_stream = f"{ctx.stream}/{pos}"
        program = self.state.deps.agents.resolve(ctx.agent, process)
        if live:
            started = ChildStarted(
                process=process, input=input, child_stream=child_stream, continues=continues
            )
            async with self.state.busy():
                await self.state.write([self.state.event(ctx.stream, pos, gen, digest, started)])
        child = Context(self, child_stream, program, input)
        try:
            output = await program.fn(child, input)
            self.state.end_stream(child)
            output = json_value(output, f"the output of child stream {child_stream!r}")
        except (Exception, LimitExceeded) as exc:
            err = failure_dict(exc)
            async with self.state.busy():
                stored = await self.state.write(
                    [
                        self.state.event(
                            ctx.stream, pos, gen, digest, ChildCompleted(error=err), True
                        )
                    ]
                )
            prefix = f"child process {process!r} (stream {child_stream!r}) failed: "
            raise tagged(recorded_error(StepFailed, err, prefix), stored[-1].seq) from exc
        async with self.state.busy():
            await self.state.write(
                [
                    self.state.event(
                        ctx.stream, pos, gen, digest, ChildCompleted(output=output), True
                    )
                ]
            )
        return output


async def _done(value: Any) -> Any:
    return value


async def _fail(exc: BaseException) -> object:
    raise exc
