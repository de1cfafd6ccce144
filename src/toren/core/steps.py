"""The steps of a tick: what each ``ctx.<effect>`` does once the replay decision is taken.
A replayed step answers from the log at no cost; a live one executes (a model call, a
tool, the clock, a timer, a message wait, a child stream) and is committed to the log
before the agent code continues.
"""

from __future__ import annotations

import asyncio
import inspect
import random as _random
import time
import uuid as _uuid
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from toren.core.context import Context
from toren.core.digest import (
    HashedRequest,
    canonical_json,
    message_list_node,
)
from toren.core.events import (
    ChildCompleted,
    ChildStarted,
    MessageReceived,
    ModelCallRecorded,
    TimerFired,
    TimerScheduled,
    ToolCallRecorded,
    ValueRecorded,
)
from toren.core.failures import failure_dict, tagged
from toren.core.model_types import ModelRequest, ModelResponse, ToolSpec, Usage, frozen
from toren.core.ports import ModelProvider
from toren.core.program import AgentProgram, ToolDef
from toren.core.records import RunDelta
from toren.core.replay import (
    Replay,
    Step,
    continued_child,
    redeliverable_message,
    reusable_tool,
)
from toren.core.text import repair, repair_text
from toren.core.values import to_nano
from toren.errors import (
    LimitExceeded,
    ModelCallFailed,
    ProviderUnavailable,
    StepFailed,
    StorageError,
    ToolFailed,
)

if TYPE_CHECKING:
    pass
from toren.core.tickstate import TickState, error_dict, json_value, recorded_error

_ZERO = Decimal(0)


class Steps(TickState):
    """The step methods of a tick (:class:`~toren.core.tick.TickRunner`)."""

    def model_step(
        self,
        ctx: Context,
        pos: int,
        hashed: HashedRequest,
        request: ModelRequest,
        on_delta: Callable[[str], None] | None,
    ) -> Awaitable[ModelResponse]:
        decision, gen = self._decide(ctx.stream, pos, "model", hashed.digest)
        if isinstance(decision, Replay):
            return self._replay_model(ctx.stream, decision.step, hashed)
        return self._live_model(ctx, pos, gen, hashed, request, on_delta)

    async def _replay_model(self, stream: str, step: Step, hashed: HashedRequest) -> ModelResponse:
        payload = step.first.payload
        assert isinstance(payload, ModelCallRecorded)
        if step.digest != hashed.digest:  # a fork's pinned step, recorded for other messages
            self._lists.pop(stream, None)
        elif payload.message_list is not None:
            self._lists[stream] = (hashed.messages, payload.message_list)
        self.replayed += 1
        if self._interrupted:
            self._pending.saved += to_nano(payload.cost_usd)
        if payload.error is not None:
            raise tagged(recorded_error(ModelCallFailed, payload.error), step.first.seq)
        return ModelResponse.from_dict(payload.response or {})

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
        if limit is not None and self._usage_by_seq.spent()[2] >= to_nano(limit):
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

            started = time.perf_counter()
            response: ModelResponse | None = None
            error: dict[str, Any] | None = None
            try:
                call = provider.complete(request, on_delta=delta)
                if ctx.program.limits.step_timeout is None:
                    response = await call
                else:
                    response = await self._timed(call, ctx.program, "model call")
            except StepFailed as exc:
                error = repair({**exc.details, **error_dict(exc)})
            recorded = None
            if response is not None:  # paid for: recorded whatever its strings hold
                response, recorded = repaired_response(response)
            latency = (time.perf_counter() - started) * 1000
            # A call that failed after the provider reported usage (a stream that broke
            # mid-answer) was billed for it: count and price it like a response's.
            usage = response.usage if response else _reported_usage(error)
            cost = _ZERO
            pricing = ctx.program.pricing or self.deps.pricing
            if pricing is not None and (response is not None or usage != Usage()):
                cost = pricing(f"{request.provider}:{request.model}", usage)
            blobs, list_node = self._new_blobs(ctx.stream, request, hashed)
            payload = frozen(
                ModelCallRecorded,
                provider=request.provider,
                model=request.model,
                message_list=list_node,
                message_count=len(hashed.messages),
                tools=hashed.tools,
                params=hashed.params,
                response=recorded,
                error=error,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cost_usd=str(cost),
                latency_ms=round(latency, 3),
            )
            nano = to_nano(cost) if cost else 0
            stored = await self._write(
                [self._event(ctx.stream, pos, gen, hashed.digest, payload)],
                blobs=blobs,
                delta=frozen(
                    RunDelta,
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    cost_nanousd=nano,
                    saved_nanousd=0,
                    steps=1,
                    invalidations=0,
                    code_version=self.code_version,
                ),
            )
            self.executed += 1
            if self.deps.telemetry is not None:
                self.deps.telemetry.on_model_call(
                    self.run_id,
                    ctx.stream,
                    pos,
                    request,
                    response,
                    latency / 1000,
                    False,
                    error=None if error is None else error["message"],
                    cost_usd=cost,
                )
            if error is not None:
                raise tagged(recorded_error(ModelCallFailed, error), stored[-1].seq)
            assert response is not None
            return response

    def _new_blobs(
        self, stream: str, request: ModelRequest, hashed: HashedRequest
    ) -> tuple[dict[str, str], str]:
        """The bodies to store for this request and its message list node. When the
        request extends the stream's previous one (a growing conversation), only the new
        messages and one small node are stored: history is stored once."""
        msgs = hashed.messages
        prev_msgs, prev_node = self._lists.get(stream, ([], None))
        start = 0
        if (
            prev_node is not None
            and len(prev_msgs) <= len(msgs)
            and msgs[: len(prev_msgs)] == prev_msgs
        ):
            start = len(prev_msgs)
        else:
            prev_node = None
        blobs: dict[str, str] = {}
        for key, obj in [
            *zip(msgs[start:], request.messages[start:], strict=True),
            *zip(hashed.tools, request.tools, strict=True),
        ]:
            if key not in self._known_blobs:
                body = self.hashes.take_body(key)
                if body is None:
                    body = canonical_json(obj.to_dict() if isinstance(obj, ToolSpec) else obj)
                blobs[key] = body.decode("utf-8")
                self._known_blobs.add(key)
        node, node_body = message_list_node(prev_node, msgs[start:])
        blobs[node] = node_body
        self._lists[stream] = (msgs, node)
        return blobs, node

    async def _timed(self, aw: Awaitable[Any], program: AgentProgram, what: str) -> Any:
        timeout = program.limits.step_timeout
        if timeout is None:
            return await aw
        try:
            return await asyncio.wait_for(aw, timeout)
        except TimeoutError:
            cls = ModelCallFailed if what == "model call" else ToolFailed
            raise cls(
                f"{what} timed out after {timeout}s (limits.step_timeout)", timeout=timeout
            ) from None

    def tool_step(
        self, ctx: Context, pos: int, digest: str, name: str, args: dict[str, Any]
    ) -> Awaitable[Any]:
        decision, gen = self._decide(ctx.stream, pos, "tool", digest)
        if isinstance(decision, Replay):
            return self._replay_tool(decision.step)
        tooldef = ctx.program.tools.get(name)
        reuse = None
        # Reuse guards side effects; a tool declared free of them runs again (fresh data).
        if tooldef is None or (tooldef.side_effects and not tooldef.reexecute):
            reuse = reusable_tool(self.log, ctx.stream, digest)
            if reuse is not None:
                self.log.reused_seqs.add(reuse.first.seq)  # claimed now, in call order
        return self._live_tool(ctx, pos, gen, digest, name, args, tooldef, reuse)

    async def _replay_tool(self, step: Step) -> Any:
        payload = step.first.payload
        assert isinstance(payload, ToolCallRecorded)
        self.replayed += 1
        if payload.error is not None:
            failed = recorded_error(ToolFailed, payload.error, f"tool {payload.name!r} failed: ")
            raise tagged(failed, step.first.seq)
        return payload.result

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
            started = time.perf_counter()
            result: Any = None
            error: dict[str, Any] | None = None
            if reuse is not None:
                reused = reuse.first.payload
                assert isinstance(reused, ToolCallRecorded)
                result = reused.result
            elif tooldef is None:
                error = {
                    "type": "UnknownTool",
                    "code": "unknown_tool",
                    "message": f"agent {ctx.agent!r} has no tool {name!r}; "
                    f"its tools are {sorted(ctx.program.tools)}",
                }
            else:
                try:
                    result = await self._timed(_call_tool(tooldef, args), ctx.program, "tool call")
                    result = json_value(result, f"the result of tool {name!r}")
                except Exception as exc:
                    result = None  # not the raw value json_value refused: it cannot be stored
                    error = failure_dict(exc)
            payload = ToolCallRecorded(
                name=name,
                args=args,
                result=result,
                error=error,
                latency_ms=round((time.perf_counter() - started) * 1000, 3),
                reused_from_seq=reuse.first.seq if reuse is not None else None,
            )
            stored = await self._write(
                [self._event(ctx.stream, pos, gen, digest, payload)],
                delta=RunDelta(steps=1, code_version=self.code_version),
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
                    error=None if error is None else error["message"],
                )
            if error is not None:
                failed = recorded_error(ToolFailed, error, f"tool {name!r} failed: ")
                raise tagged(failed, stored[-1].seq)
            return result

    def value_step(self, ctx: Context, pos: int, digest: str, what: str) -> Awaitable[Any]:
        decision, gen = self._decide(ctx.stream, pos, "value", digest)
        if isinstance(decision, Replay):
            return self._replay_value(decision.step)
        return self._live_value(ctx, pos, gen, digest, what)

    async def _replay_value(self, step: Step) -> Any:
        payload = step.first.payload
        assert isinstance(payload, ValueRecorded)
        self.replayed += 1
        return payload.value

    async def _live_value(self, ctx: Context, pos: int, gen: int, digest: str, what: str) -> Any:
        async with self._busy():
            if what == "now":
                value: Any = self.clock.now()
            elif what == "random":
                value = _random.random()
            else:
                value = str(_uuid.uuid4())
            await self._write(
                [self._event(ctx.stream, pos, gen, digest, ValueRecorded(what=what, value=value))],
                delta=RunDelta(steps=1),
            )
            self.executed += 1
            return value

    def sleep_step(self, ctx: Context, pos: int, digest: str, seconds: float) -> Awaitable[None]:
        decision, gen = self._decide(ctx.stream, pos, "sleep", digest)
        if isinstance(decision, Replay):
            step = decision.step
            if step.complete:
                self.replayed += 1
                return _done(None)
            payload = step.first.payload
            assert isinstance(payload, TimerScheduled)
            return self._await_timer(ctx, pos, step.first.generation, step.digest, payload.fire_at)
        return self._start_timer(ctx, pos, gen, digest, seconds)

    async def _start_timer(
        self, ctx: Context, pos: int, gen: int, digest: str, seconds: float
    ) -> None:
        async with self._busy():
            fire_at = self.clock.now() + seconds
            # requested_seconds: the value the digest covers, as given (1 is not 1.0).
            timer = TimerScheduled(
                fire_at=fire_at, seconds=float(seconds), requested_seconds=seconds
            )
            event = self._event(ctx.stream, pos, gen, digest, timer)
            await self._write([event])
        await self._await_timer(ctx, pos, gen, digest, fire_at)

    async def _await_timer(
        self, ctx: Context, pos: int, gen: int, digest: str, fire_at: float
    ) -> None:
        async with self._busy():
            while (left := fire_at - self.clock.now()) > 0:
                if left <= self.deps.settings.inline_wait:
                    await self.clock.sleep(left)
                else:
                    await self._park(fire_at, ())
            event = self._event(
                ctx.stream, pos, gen, digest, TimerFired(fired_at=self.clock.now()), done=True
            )
            await self._write([event])
            self.executed += 1

    async def _park(self, not_before: float | None, names: tuple[str, ...]) -> None:
        """Wait for the tick to park the run; never returns (the agent task is cancelled)."""
        entry = (not_before, names)
        parked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(entry)
        self._park_futures.add(parked)
        self._inflight -= 1
        if self._inflight == 0:
            self._wake.set()
        try:
            await parked
        finally:
            self._inflight += 1
            self._waiters.remove(entry)
            self._park_futures.discard(parked)

    def message_step(
        self, ctx: Context, pos: int, digest: str, name: str, timeout: float | None
    ) -> Awaitable[Any]:
        decision, gen = self._decide(ctx.stream, pos, "message", digest)
        if isinstance(decision, Replay):
            step = decision.step
            if step.complete:
                self.replayed += 1
                done = step.done or step.first
                payload = done.payload
                return _done(payload.payload if isinstance(payload, MessageReceived) else None)
            first = step.first.payload
            assert isinstance(first, TimerScheduled)
            return self._await_message(
                ctx, pos, step.first.generation, step.digest, name, first.fire_at
            )
        return self._start_message_wait(ctx, pos, gen, digest, name, timeout)

    async def _start_message_wait(
        self, ctx: Context, pos: int, gen: int, digest: str, name: str, timeout: float | None
    ) -> Any:
        deadline = None
        if timeout is not None:
            async with self._busy():
                deadline = self.clock.now() + timeout
                timer = TimerScheduled(
                    fire_at=deadline,
                    seconds=timeout,
                    purpose="message",
                    requested_seconds=timeout,
                    message=name,  # the digest covers it; a timed-out wait records no other
                )
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
                    await self._park(deadline, (name,))

    async def _take_message(
        self, ctx: Context, pos: int, gen: int, digest: str, name: str, deadline: float | None
    ) -> MessageReceived | None:
        """Record the next message named ``name`` as received by this step: first one that
        only superseded steps received (it goes back in line), then the inbox's oldest,
        unless it was sent after the wait's deadline (the timeout came first, even if this
        worker only sees both now; the message stays for a later wait)."""
        received = redeliverable_message(self.log, name)
        consume = None
        if received is None:
            try:
                message = await self.store.next_message(self.run_id, [name])
            except StorageError as exc:  # a corrupt inbox row, say: not the agent's to see
                raise self._halt(exc) from None
            if message is None or (deadline is not None and message.created_at > deadline):
                return None
            received = MessageReceived(name=name, payload=message.payload, inbox_id=message.id)
            consume = message.id
        event = self._event(ctx.stream, pos, gen, digest, received, done=deadline is not None)
        await self._write([event], consume=consume)
        return received

    def child_step(
        self, ctx: Context, pos: int, digest: str, process: str, input: Any
    ) -> Awaitable[Any]:
        decision, gen = self._decide(ctx.stream, pos, "child", digest)
        if isinstance(decision, Replay):
            step = decision.step
            if step.complete:
                self.replayed += 1
                assert step.done is not None
                done = step.done.payload
                assert isinstance(done, ChildCompleted)
                if done.error is not None:
                    return _fail(tagged(recorded_error(StepFailed, done.error), step.done.seq))
                return _done(done.output)
            return self._run_child(
                ctx, pos, step.first.generation, step.digest, process, input, False
            )
        continues = continued_child(self.log, ctx.stream, digest)
        if continues is not None:  # claimed now, in call order
            self.log.continues[f"{ctx.stream}/{pos}"] = continues
        return self._run_child(ctx, pos, gen, digest, process, input, True, continues)

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


def repaired_response(response: ModelResponse) -> tuple[ModelResponse, dict[str, Any]]:
    """The response with strings that are not valid Unicode repaired (core/text.py), so
    that it can be recorded and replays as the agent saw it live; and its recorded form."""
    data = response.to_dict()
    fixed = repair(data)
    return (response, data) if fixed is data else (ModelResponse.from_dict(fixed), fixed)


async def _done(value: Any) -> Any:
    return value


async def _fail(exc: BaseException) -> Any:
    raise exc


async def _call_tool(tooldef: ToolDef, args: Mapping[str, Any]) -> Any:
    if inspect.iscoroutinefunction(tooldef.fn):
        return await tooldef.fn(**args)
    result = await asyncio.to_thread(tooldef.fn, **args)
    if inspect.isawaitable(result):
        return await result
    return result


def _reported_usage(error: Mapping[str, Any] | None) -> Usage:
    """The usage a failed model call had reported before it failed: the provider's
    ``ModelCallFailed`` carries it as ``details["usage"]`` (see toren.providers._retry)."""
    reported = (error or {}).get("usage")
    if not isinstance(reported, Mapping):
        return Usage()
    # A provider of someone else's may put anything here: only token counts count.
    return Usage(_count_of(reported.get("input_tokens")), _count_of(reported.get("output_tokens")))


def _count_of(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0
