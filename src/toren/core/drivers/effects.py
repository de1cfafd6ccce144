"""The effects of a step: what a step does once the journal has answered, as functions with
no tick state. A replayed step answers from its recorded event (``replay_*``); a live one
executes (a model call, a tool, a value, the clock) and returns what to write: the
payload, the blobs, the totals it adds. The driver (:mod:`toren.core.drivers.steps`) decides which
to call, stamps the event and writes it under its lease before the agent code continues.

Nothing here reads the wall clock, randomness or a store: the time, the random source
and the uuid factory come in as arguments (``TickDeps.clock``, ``.random``, ``.uuid``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal
from typing import Any, NamedTuple

from toren.core.agent_api.program import AgentProgram, Pricing, ToolDef
from toren.core.contract.audit import with_response_digest
from toren.core.contract.digest import HashCache, HashedRequest, canonical_json, message_list_node
from toren.core.contract.events import (
    ChildCompleted,
    MessageReceived,
    ModelCallRecorded,
    TimerScheduled,
    ToolCallRecorded,
    ValueRecorded,
)
from toren.core.contract.failures import failure_dict, tagged
from toren.core.contract.model_types import (
    ModelRequest,
    ModelResponse,
    ToolSpec,
    Usage,
    usage_cut_off,
)
from toren.core.contract.ports import ModelProvider
from toren.core.contract.replay import Step
from toren.core.contract.text import repair, repair_text
from toren.core.contract.values import StepKind, to_nano
from toren.errors import ModelCallFailed, StepFailed, ToolFailed, TorenError

_ZERO = Decimal(0)


def error_dict(exc: BaseException) -> dict[str, object]:
    code = exc.code if isinstance(exc, TorenError) else "agent_error"
    message = exc.message if isinstance(exc, TorenError) else str(exc)
    return {"type": type(exc).__name__, "code": code, "message": repair_text(message)}


def recorded_error(
    cls: type[StepFailed], error: Mapping[str, object], prefix: str = ""
) -> StepFailed:
    """Rebuild the exception of a recorded failed step (live or replayed alike)."""
    details = {k: v for k, v in error.items() if k != "message"}
    return cls(prefix + str(error.get("message", "step failed")), **details)


# -- replayed steps ----------------------------------------------------------------------


def replay_model(step: Step) -> ModelResponse:
    """The recorded answer of a model call, or its recorded failure raised again."""
    payload = step.first.payload
    assert isinstance(payload, ModelCallRecorded)
    if payload.error is not None:
        raise tagged(recorded_error(ModelCallFailed, payload.error), step.first.seq)
    return ModelResponse.from_dict(payload.response or {})


def replay_tool(step: Step) -> object:
    payload = step.first.payload
    assert isinstance(payload, ToolCallRecorded)
    if payload.error is not None:
        failed = recorded_error(ToolFailed, payload.error, f"tool {payload.name!r} failed: ")
        raise tagged(failed, step.first.seq)
    return payload.result


def replay_value(step: Step) -> object:
    payload = step.first.payload
    assert isinstance(payload, ValueRecorded)
    return payload.value


def replay_message(step: Step) -> object:
    """What a completed message wait received (None: it timed out)."""
    payload = (step.done or step.first).payload
    return payload.payload if isinstance(payload, MessageReceived) else None


def replay_child(step: Step) -> object:
    """A completed child's output, or its recorded failure raised again."""
    assert step.done is not None
    done = step.done.payload
    assert isinstance(done, ChildCompleted)
    if done.error is not None:
        raise tagged(recorded_error(StepFailed, done.error), step.done.seq)
    return done.output


# -- live steps ----------------------------------------------------------------------------


class RequestBodies:
    """The request bodies a tick has stored (content addresses), and per stream the
    message hashes of its last model request with their list node: a request that
    extends the previous one (a growing conversation) stores only its new messages."""

    __slots__ = ("hashes", "known", "lists")

    def __init__(self, hashes: HashCache, known: set[str] | None = None) -> None:
        self.hashes = hashes
        self.known: set[str] = known or set()
        self.lists: dict[str, tuple[list[str], str]] = {}

    def replayed(self, stream: str, step: Step, hashed: HashedRequest) -> None:
        """A model call of ``stream`` replayed: the next live one may extend its list."""
        payload = step.first.payload
        assert isinstance(payload, ModelCallRecorded)
        if step.digest != hashed.digest:  # a fork's pinned step, recorded for other messages
            self.lists.pop(stream, None)
        elif payload.message_list is not None:
            self.lists[stream] = (hashed.messages, payload.message_list)

    def new(
        self, stream: str, request: ModelRequest, hashed: HashedRequest
    ) -> tuple[dict[str, str], str]:
        """The bodies to store for this request and its message list node."""
        msgs = hashed.messages
        prev_msgs, prev_node = self.lists.get(stream, ([], None))
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
            if key not in self.known:
                body = self.hashes.take_body(key)
                if body is None:
                    body = canonical_json(obj.to_dict() if isinstance(obj, ToolSpec) else obj)
                blobs[key] = body.decode("utf-8")
                self.known.add(key)
        node, node_body = message_list_node(prev_node, msgs[start:])
        blobs[node] = node_body
        self.lists[stream] = (msgs, node)
        return blobs, node


class ModelCall(NamedTuple):
    """What a live model call returns to its driver: the response (None: it failed), the
    payload and blobs to write, what it used (input tokens, output tokens, nano-USD: the
    run's totals grow by it), and its latency for telemetry. Its price is money at an
    edge: a ``Decimal`` from the pricing function, recorded as its string
    (``payload.cost_usd``, part of the log), counted in nano-USD (``used``)."""

    response: ModelResponse | None
    payload: ModelCallRecorded
    blobs: dict[str, str]
    used: tuple[int, int, int]
    latency_s: float


async def call_model(
    provider: ModelProvider,
    request: ModelRequest,
    hashed: HashedRequest,
    program: AgentProgram,
    *,
    bodies: RequestBodies,
    stream: str,
    pricing: Pricing | None,
    monotonic: Callable[[], float],
    on_delta: Callable[[str], None],
) -> ModelCall:
    """Call the model once (the provider retries what it may) and build its record."""
    started = monotonic()
    response: ModelResponse | None = None
    error: dict[str, object] | None = None
    try:
        call = provider.complete(request, on_delta=on_delta)
        if program.limits.step_timeout is None:
            response = await call
        else:
            response = await timed(call, program, "model call")
    except StepFailed as exc:
        error = repair({**exc.details, **error_dict(exc)})
    recorded = None
    if response is not None:  # paid for: recorded whatever its strings hold
        response, recorded = repaired_response(response)
    latency = (monotonic() - started) * 1000
    # A call that failed after the provider reported usage (a stream that broke
    # mid-answer) was billed for it: count and price it like a response's.
    usage = response.usage if response else reported_usage(error)
    cost = _ZERO
    if pricing is not None and (response is not None or usage != Usage()):
        cost = pricing(f"{request.provider}:{request.model}", usage)
    blobs, list_node = bodies.new(stream, request, hashed)
    payload = ModelCallRecorded(
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
    with_response_digest(payload)  # what verify checks the answer and its usage by
    used = (usage.input_tokens, usage.output_tokens, to_nano(cost) if cost else 0)
    return ModelCall(response, payload, blobs, used, latency / 1000)


async def call_tool(
    name: str,
    args: dict[str, object],
    tooldef: ToolDef | None,
    reuse: Step | None,
    program: AgentProgram,
    *,
    monotonic: Callable[[], float],
) -> ToolCallRecorded:
    """Run a tool (or take the superseded identical call's result the journal claimed for
    it) and build its record; a tool's failure is recorded, not raised."""
    started = monotonic()
    result: object = None
    error: dict[str, object] | None = None
    if reuse is not None:
        reused = reuse.first.payload
        assert isinstance(reused, ToolCallRecorded)
        result = reused.result
    elif tooldef is None:
        error = {
            "type": "UnknownTool",
            "code": "unknown_tool",
            "message": f"agent {program.agent!r} has no tool {name!r}; "
            f"its tools are {sorted(program.tools)}",
        }
    else:
        try:
            result = await timed(_call_tool(tooldef, args), program, "tool call")
            result = json_value(result, f"the result of tool {name!r}")
        except Exception as exc:
            result = None  # not the raw value json_value refused: it cannot be stored
            error = failure_dict(exc)
    payload = ToolCallRecorded(
        name=name,
        args=args,
        result=result,
        error=error,
        latency_ms=round((monotonic() - started) * 1000, 3),
        reused_from_seq=reuse.first.seq if reuse is not None else None,
    )
    return with_response_digest(payload)


def tool_result(payload: ToolCallRecorded, seq: int) -> object:
    """A live tool call's answer to the code: its result, or its failure raised."""
    if payload.error is not None:
        failed = recorded_error(ToolFailed, payload.error, f"tool {payload.name!r} failed: ")
        raise tagged(failed, seq)
    return payload.result


def make_value(
    what: str, now: Callable[[], float], random: Callable[[], float], uuid: Callable[[], str]
) -> ValueRecorded:
    """``ctx.now()`` / ``ctx.random()`` / ``ctx.uuid()``, live, from injected sources."""
    if what == "now":
        value: object = now()
    elif what == "random":
        value = random()
    else:
        value = uuid()
    return ValueRecorded(what=what, value=value)


def sleep_timer(seconds: float, now: float) -> TimerScheduled:
    # requested_seconds: the value the digest covers, as given (1 is not 1.0).
    return TimerScheduled(fire_at=now + seconds, seconds=float(seconds), requested_seconds=seconds)


def message_timer(name: str, timeout: float, now: float) -> TimerScheduled:
    return TimerScheduled(
        fire_at=now + timeout,
        seconds=timeout,
        purpose=StepKind.MESSAGE.value,  # the log's plain string
        requested_seconds=timeout,
        message=name,  # the digest covers it; a timed-out wait records no other
    )


async def timed(aw: Awaitable[Any], program: AgentProgram, what: str) -> Any:
    timeout = program.limits.step_timeout
    if timeout is None:
        return await aw
    try:
        return await asyncio.wait_for(aw, timeout)
    except TimeoutError as exc:
        cls = ModelCallFailed if what == "model call" else ToolFailed
        details: dict[str, object] = {"timeout": timeout}
        usage = usage_cut_off(exc)  # billed before the timeout cut the call off
        if usage is not None:
            details["usage"] = usage.to_dict()
        raise cls(f"{what} timed out after {timeout}s (limits.step_timeout)", **details) from None


def repaired_response(response: ModelResponse) -> tuple[ModelResponse, dict[str, object]]:
    """The response with strings that are not valid Unicode repaired (core/contract/text.py), so
    that it can be recorded and replays as the agent saw it live; and its recorded form."""
    data = response.to_dict()
    fixed = repair(data)
    return (response, data) if fixed is data else (ModelResponse.from_dict(fixed), fixed)


def json_value(value: object, what: str) -> object:
    """A plain JSON copy of a value produced by agent code or a tool, as it is recorded:
    strings that are not valid Unicode repaired (see toren.core.contract.text)."""
    try:
        return repair(json.loads(json.dumps(value)))
    except RecursionError:
        raise TypeError(
            f"{what} is nested too deeply to record (objects and arrays inside each other "
            "about a thousand levels deep); return a flatter value"
        ) from None
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what} is not JSON-serialisable ({exc}); return dicts, lists, strings, "
            "numbers, booleans or None"
        ) from None


async def _call_tool(tooldef: ToolDef, args: Mapping[str, object]) -> object:
    if inspect.iscoroutinefunction(tooldef.fn):
        return await tooldef.fn(**args)
    result = await asyncio.to_thread(tooldef.fn, **args)
    if inspect.isawaitable(result):
        return await result
    return result


def reported_usage(error: Mapping[str, object] | None) -> Usage:
    """The usage a failed model call had reported before it failed: the provider's
    ``ModelCallFailed`` carries it as ``details["usage"]`` (see toren.providers._retry)."""
    reported = (error or {}).get("usage")
    if not isinstance(reported, Mapping):
        return Usage()
    # A provider of someone else's may put anything here: only token counts count.
    return Usage(_count_of(reported.get("input_tokens")), _count_of(reported.get("output_tokens")))


def _count_of(value: object) -> int:
    return value if type(value) is int and value > 0 else 0
