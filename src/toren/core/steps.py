"""The steps of a tick: what each ``ctx.<effect>`` does with the journal's answer. A
replayed step answers from the log at no cost (:mod:`toren.core.effects` ``replay_*``); a
live one runs its effect (``call_model``, ``call_tool``, ``make_value``, a timer, a
message wait, a child stream), and the tick stamps and commits what the effect returns
before the agent code continues. The decision itself, and the reuse claims that travel
with it, are the journal's (:mod:`toren.core.journal`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

from toren.core.context import Context
from toren.core.digest import HashedRequest
from toren.core.effects import (
    call_model,
    call_tool,
    json_value,
    make_value,
    message_timer,
    recorded_error,
    replay_child,
    replay_message,
    replay_model,
    replay_tool,
    replay_value,
    reported_usage,
    sleep_timer,
    tool_result,
)
from toren.core.events import (
    ChildCompleted,
    ChildStarted,
    MessageReceived,
    ModelCallCutOff,
    ModelCallRecorded,
    TimerFired,
    TimerScheduled,
)
from toren.core.failures import failure_dict, tagged
from toren.core.journal import Replay
from toren.core.model_types import (
    CancelledWithUsage,
    ModelRequest,
    ModelResponse,
    Usage,
)
from toren.core.ports import ModelProvider
from toren.core.program import AgentProgram, ToolDef
from toren.core.replay import Step
from toren.core.text import repair_text
from toren.core.tickstate import TickState
from toren.core.values import RunStatus, StepKind, Totals, to_nano
from toren.errors import (
    LimitExceeded,
    MessageConsumed,
    ModelCallFailed,
    ProviderUnavailable,
    StepFailed,
    StorageError,
)

_reported_usage = reported_usage  # the name tests and older callers import
log = logging.getLogger("toren.tick")
_NOTHING_USED = (0, 0, 0)  # a step that used no tokens and cost nothing


class Steps(TickState):
    """The step methods of a tick (:class:`~toren.core.tick.TickRunner`): the
    :class:`~toren.core.context.StepRunner` the agent's contexts call."""

    def model_step(
        self,
        ctx: Context,
        pos: int,
        hashed: HashedRequest,
        request: ModelRequest,
        on_delta: Callable[[str], None] | None,
    ) -> Awaitable[ModelResponse]:
        answer = self._request(ctx.stream, pos, StepKind.MODEL, hashed.digest)
        if isinstance(answer, Replay):
            return self._replay_model(ctx.stream, answer.step, hashed)
        return self._live_model(ctx, pos, answer.generation, hashed, request, on_delta)

    async def _replay_model(self, stream: str, step: Step, hashed: HashedRequest) -> ModelResponse:
        self.bodies.replayed(stream, step, hashed)
        self.replayed += 1
        if self._interrupted:
            payload = step.first.payload
            assert isinstance(payload, ModelCallRecorded)
            self.writer.add(Totals(saved_nanousd=to_nano(payload.cost_usd)))
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
        pricing = ctx.program.pricing or self.deps.pricing
        cost = pricing(f"{request.provider}:{request.model}", usage) if pricing else Decimal(0)
        reason = str(self._abort if self._abort is not None else RunStatus.CANCELLED)
        payload = ModelCallCutOff(
            stream=ctx.stream,
            position=pos,
            request_digest=hashed.digest,
            provider=request.provider,
            model=request.model,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost_usd=str(cost),
            latency_ms=round((self.monotonic() - started) * 1000, 3),
            reason=reason,
        )
        used = Totals(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost_nanousd=to_nano(cost) if cost else 0,
        )
        try:
            await self._write([self._run_event(payload)], used=used)
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
        provider = program.providers.get(name) or self.deps.providers.get(name)
        if provider is None:
            known = sorted({*program.providers, *self.deps.providers})
            raise ProviderUnavailable(
                f"no model provider {name!r} is configured for agent {program.agent!r}; "
                f"configured providers: {known or 'none'}"
            )
        return provider

    def _check_budget(self, program: AgentProgram) -> None:
        limit = self.limits(program).max_cost_usd
        if limit is not None and self.journal.spent().cost_nanousd >= to_nano(limit):
            raise LimitExceeded(
                f"run {self.run_id!r} has spent ${self.usage().cost_usd} of its "
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
        async with self._busy():
            self._check_budget(ctx.program)
            provider = self._provider(request.provider, ctx.program)

            def delta(text: str) -> None:
                text = repair_text(text)  # half a pair at a chunk's edge: see core/text.py
                self._publish(
                    {"type": "delta", "stream": ctx.stream, "position": pos, "text": text}
                )
                if on_delta is not None:
                    on_delta(text)

            started = self.monotonic()
            try:
                call = await call_model(
                    provider,
                    request,
                    hashed,
                    ctx.program,
                    bodies=self.bodies,
                    stream=ctx.stream,
                    pricing=ctx.program.pricing or self.deps.pricing,
                    monotonic=self.monotonic,
                    on_delta=delta,
                )
            except CancelledWithUsage as cut:  # cut off in flight: count what it billed
                await self._record_cut_off(ctx, pos, hashed, request, cut.usage, started)
                raise
            error = call.payload.error
            stored = await self._write(
                [self._event(ctx.stream, pos, gen, hashed.digest, call.payload)],
                blobs=call.blobs,
                step=call.used,
            )
            self.executed += 1
            if self.deps.telemetry is not None:
                self.deps.telemetry.on_model_call(
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
        self, ctx: Context, pos: int, digest: str, name: str, args: dict[str, Any]
    ) -> Awaitable[Any]:
        tooldef = ctx.program.tools.get(name)
        # Reuse guards side effects; a tool declared free of them runs again (fresh data).
        reusable = tooldef is None or (tooldef.side_effects and not tooldef.reexecute)
        answer = self._request(ctx.stream, pos, StepKind.TOOL, digest, reusable)
        if isinstance(answer, Replay):
            return self._replay(replay_tool, answer.step)
        return self._live_tool(
            ctx, pos, answer.generation, digest, name, args, tooldef, answer.reuse
        )

    async def _replay(self, answer: Callable[[Step], Any], step: Step) -> Any:
        self.replayed += 1
        return answer(step)

    async def _live_tool(
        self,
        ctx: Context,
        pos: int,
        gen: int,
        digest: str,
        name: str,
        args: dict[str, Any],
        tooldef: ToolDef | None,
        reuse: Step | None,
    ) -> Any:
        async with self._busy():
            payload = await call_tool(
                name, args, tooldef, reuse, ctx.program, monotonic=self.monotonic
            )
            stored = await self._write(
                [self._event(ctx.stream, pos, gen, digest, payload)],
                step=_NOTHING_USED,
            )
            self.executed += 1
            if self.deps.telemetry is not None:
                self.deps.telemetry.on_tool_call(
                    self.run_id,
                    ctx.stream,
                    pos,
                    name,
                    payload.latency_ms / 1000,
                    False,
                    error=None if payload.error is None else payload.error["message"],
                )
            return tool_result(payload, stored[-1].seq)

    def value_step(self, ctx: Context, pos: int, digest: str, what: str) -> Awaitable[Any]:
        answer = self._request(ctx.stream, pos, StepKind.VALUE, digest)
        if isinstance(answer, Replay):
            return self._replay(replay_value, answer.step)
        return self._live_value(ctx, pos, answer.generation, digest, what)

    async def _live_value(self, ctx: Context, pos: int, gen: int, digest: str, what: str) -> Any:
        async with self._busy():
            payload = make_value(what, self.clock.now, self.deps.random, self.deps.uuid)
            await self._write(
                [self._event(ctx.stream, pos, gen, digest, payload)], step=_NOTHING_USED
            )
            self.executed += 1
            return payload.value

    def sleep_step(self, ctx: Context, pos: int, digest: str, seconds: float) -> Awaitable[None]:
        answer = self._request(ctx.stream, pos, StepKind.SLEEP, digest)
        if isinstance(answer, Replay):
            step = answer.step
            if step.complete:
                self.replayed += 1
                return _done(None)
            payload = step.first.payload
            assert isinstance(payload, TimerScheduled)
            return self._await_timer(ctx, pos, step.first.generation, step.digest, payload.fire_at)
        return self._start_timer(ctx, pos, answer.generation, digest, seconds)

    async def _start_timer(
        self, ctx: Context, pos: int, gen: int, digest: str, seconds: float
    ) -> None:
        async with self._busy():
            timer = sleep_timer(seconds, self.clock.now())
            await self._write([self._event(ctx.stream, pos, gen, digest, timer)])
        await self._await_timer(ctx, pos, gen, digest, timer.fire_at)

    async def _await_timer(
        self, ctx: Context, pos: int, gen: int, digest: str, fire_at: float
    ) -> None:
        async with self._busy():
            while (left := fire_at - self.clock.now()) > 0:
                if left <= self.deps.settings.inline_wait:
                    await self.clock.sleep(left)
                else:
                    await self.parker.park(fire_at, ())
            event = self._event(
                ctx.stream, pos, gen, digest, TimerFired(fired_at=self.clock.now()), done=True
            )
            await self._write([event])
            self.executed += 1

    def message_step(
        self, ctx: Context, pos: int, digest: str, name: str, timeout: float | None
    ) -> Awaitable[Any]:
        answer = self._request(ctx.stream, pos, StepKind.MESSAGE, digest)
        if isinstance(answer, Replay):
            step = answer.step
            if step.complete:
                self.replayed += 1
                return _done(replay_message(step))
            first = step.first.payload
            assert isinstance(first, TimerScheduled)
            return self._await_message(
                ctx, pos, step.first.generation, step.digest, name, first.fire_at
            )
        return self._start_message_wait(ctx, pos, answer.generation, digest, name, timeout)

    async def _start_message_wait(
        self, ctx: Context, pos: int, gen: int, digest: str, name: str, timeout: float | None
    ) -> Any:
        deadline = None
        if timeout is not None:
            async with self._busy():
                timer = message_timer(name, timeout, self.clock.now())
                deadline = timer.fire_at
                await self._write([self._event(ctx.stream, pos, gen, digest, timer)])
        return await self._await_message(ctx, pos, gen, digest, name, deadline)

    async def _await_message(
        self, ctx: Context, pos: int, gen: int, digest: str, name: str, deadline: float | None
    ) -> Any:
        async with self._busy():
            while True:
                # One taker at a time: two waits on one name must not both take a message.
                async with self._inbox:
                    received = await self._take_message(ctx, pos, gen, digest, name, deadline)
                if received is not None:
                    self.executed += 1
                    return received.payload
                now = self.clock.now()
                if deadline is not None and now >= deadline:
                    fired = TimerFired(fired_at=now)
                    await self._write([self._event(ctx.stream, pos, gen, digest, fired, True)])
                    self.executed += 1
                    return None
                if deadline is not None and deadline - now <= self.deps.settings.inline_wait:
                    await self.clock.sleep(min(deadline - now, self.deps.settings.poll_interval))
                else:
                    await self.parker.park(deadline, (name,))

    async def _take_message(
        self, ctx: Context, pos: int, gen: int, digest: str, name: str, deadline: float | None
    ) -> MessageReceived | None:
        """Record the next message named ``name`` as received by this step: first one that
        only superseded steps received (it goes back in line), then the inbox's oldest,
        unless it was sent after the wait's deadline (the timeout came first, even if this
        worker only sees both now; the message stays for a later wait).

        A message another writer consumed between the read and this step's write is
        refused by the store (``MessageConsumed``: nothing written, the lease still
        holds); the step then reads the next one, so the run takes it, or waits, in this
        tick and under its lease. A write whose lease fence failed ends the tick as
        ever (lease lost)."""
        received = self.journal.redeliverable(name)
        if received is not None:
            event = self._event(ctx.stream, pos, gen, digest, received, done=deadline is not None)
            await self._write([event])
            return received
        refused: set[int] = set()
        while True:
            try:
                message = await self.store.next_message(self.run_id, [name])
            except StorageError as exc:  # a corrupt inbox row, say: not the agent's to see
                raise self._halt(exc) from None
            if message is None or (deadline is not None and message.created_at > deadline):
                return None
            if message.id in refused:  # the store offers again what it just refused
                raise self._halt(
                    StorageError(
                        f"run {self.run_id!r}: the inbox offers message {message.id} "
                        f"({name!r}) again after refusing it as consumed"
                    )
                ) from None
            received = MessageReceived(name=name, payload=message.payload, inbox_id=message.id)
            event = self._event(ctx.stream, pos, gen, digest, received, done=deadline is not None)
            try:
                await self._write([event], consume=message.id)
            except MessageConsumed as exc:
                refused.add(message.id)
                log.info(
                    "run %s: message %d (%r) was consumed by another writer before step "
                    "%s:%d took it; taking the next one (%s)",
                    self.run_id,
                    message.id,
                    name,
                    ctx.stream,
                    pos,
                    exc,
                )
                continue
            return received

    def child_step(
        self, ctx: Context, pos: int, digest: str, process: str, input: Any
    ) -> Awaitable[Any]:
        answer = self._request(ctx.stream, pos, StepKind.CHILD, digest)
        if isinstance(answer, Replay):
            step = answer.step
            if step.complete:
                self.replayed += 1
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
        input: Any,
        live: bool,
        continues: str | None = None,
    ) -> Any:
        child_stream = f"{ctx.stream}/{pos}"
        program = self.deps.agents.resolve(ctx.agent, process)
        if live:
            started = ChildStarted(
                process=process, input=input, child_stream=child_stream, continues=continues
            )
            async with self._busy():
                await self._write([self._event(ctx.stream, pos, gen, digest, started)])
        child = Context(self, child_stream, program, input)
        try:
            output = await program.fn(child, input)
            self._end_stream(child)
            output = json_value(output, f"the output of child stream {child_stream!r}")
        except (Exception, LimitExceeded) as exc:
            err = failure_dict(exc)
            async with self._busy():
                stored = await self._write(
                    [self._event(ctx.stream, pos, gen, digest, ChildCompleted(error=err), True)]
                )
            prefix = f"child process {process!r} (stream {child_stream!r}) failed: "
            raise tagged(recorded_error(StepFailed, err, prefix), stored[-1].seq) from exc
        async with self._busy():
            await self._write(
                [self._event(ctx.stream, pos, gen, digest, ChildCompleted(output=output), True)]
            )
        return output


async def _done(value: Any) -> Any:
    return value


async def _fail(exc: BaseException) -> Any:
    raise exc
