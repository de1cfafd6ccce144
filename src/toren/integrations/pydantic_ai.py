"""pydantic-ai agents on Toren: an unmodified ``pydantic_ai.Agent`` as a Toren agent.

``entry: app:agent`` in agent.yaml names an ``Agent`` instance; :func:`adapt` turns it
into an agent function ``async (ctx, input) -> output``. The agent drives its own loop;
Toren owns its calls, through pydantic-ai's public extension points only:

- its model is wrapped in a :class:`~pydantic_ai.models.wrapper.WrapperModel`
  (``agent.override(model=...)``), so each model request is a Toren model step
  (``ctx.model``). The step's digest is computed from Toren's provider-neutral request
  (:func:`neutral_request`: messages, instructions, tool definitions, output schema,
  model, settings), never from pydantic-ai's own serialisation, so a pydantic-ai release
  that sends the same request keeps the same digest. The request is sent by the agent's
  own model class (``OpenAIChatModel``, ``AnthropicModel``, ...) through a provider this
  module hands the engine (``toren_providers``); tokens and cost are recorded as for any
  model step; a replay answers from the log.
- the toolset pydantic-ai assembles for each run (all of the agent's toolsets) is wrapped
  in a :class:`~pydantic_ai.toolsets.WrapperToolset` by a capability given to the run
  (``get_wrapper_toolset``), so each tool call is a Toren tool step (``ctx.tool``) with
  Toren's ``side_effects`` semantics: after an invalidation an identical call of a
  side-effecting tool reuses its result.
- an approval-required or external tool call ends pydantic-ai's run with
  ``DeferredToolRequests``; the adapter then waits durably (``ctx.wait_for_message``,
  the run is ``waiting``) for one message ``approval`` (or ``tool_result``) per call and
  continues the run with the answers.

Live and replayed steps answer pydantic-ai with the same values (the model response is
rebuilt from its neutral record in both cases, a tool's result is its JSON form), so the
requests that follow are the same either way. See docs/pydantic-ai.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter, is_
from typing import TYPE_CHECKING, Any, cast

from toren.agents.entries import EntryRefused
from toren.core.agent_api.program import AgentFn, ToolDef
from toren.core.contract.model_types import (
    TRANSPORT_PARAMS,
    DeltaCallback,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
)
from toren.core.contract.pins import Pinned
from toren.errors import AgentConfigError, ModelCallFailed, ToolFailed
from toren.integrations._steps import StepTools, check_steps, prompt_of

try:
    import pydantic_ai
    from pydantic_ai import messages as pai
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelHTTPError, ModelRetry
    from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse
    from pydantic_ai.models.wrapper import WrapperModel
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolDenied
    from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
    from pydantic_core import to_jsonable_python
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    raise ModuleNotFoundError(
        "toren.integrations.pydantic_ai needs pydantic-ai: pip install 'toren-run[pydantic-ai]'",
        name=exc.name,
    ) from exc

if TYPE_CHECKING:
    from pydantic_ai import RunContext

    from toren.core.agent_api.context import Context

__all__ = [
    "APPROVAL_MESSAGE",
    "TOOL_RESULT_MESSAGE",
    "adapt",
    "from_neutral_response",
    "neutral_request",
]

APPROVAL_MESSAGE = "approval"
TOOL_RESULT_MESSAGE = "tool_result"
# What a tool step records when the tool raised one of pydantic-ai's control-flow
# exceptions (ModelRetry, ApprovalRequired, CallDeferred): an answer, replayed as the same
# exception, never a failure of the tool.
_RAISED = "toren.pydantic_ai.raised"

_ctx: ContextVar[Context | None] = ContextVar("toren_pydantic_ai_ctx", default=None)


@dataclass(frozen=True)
class _ModelCall:
    model: Model
    messages: list[pai.ModelMessage]
    settings: ModelSettings | None
    params: ModelRequestParameters


@dataclass(frozen=True)
class _ToolCall:
    toolset: AbstractToolset[object]
    name: str
    args: dict[str, object]
    run_context: RunContext[object]
    tool: Any


_model_call: ContextVar[_ModelCall | None] = ContextVar("toren_pydantic_ai_model", default=None)
_tool_call: ContextVar[_ToolCall | None] = ContextVar("toren_pydantic_ai_tool", default=None)


# -- the neutral request ------------------------------------------------------------------


def neutral_request(
    messages: Sequence[pai.ModelMessage],
    settings: Mapping[str, object] | None,
    params: ModelRequestParameters,
    *,
    provider: str,
    model: str,
    memo: Conversions | None = None,
) -> ModelRequest:
    """Toren's provider-neutral form of a pydantic-ai model request, the input of its
    digest (canonical form in docs/digest.md, "pydantic-ai requests"). Built from the
    request's meaning only, so timestamps, run ids and pydantic-ai's own field names and
    serialisation never reach the digest:

    - messages: the instructions (of the latest request message that has them, as
      pydantic-ai's models send them) as a leading ``system`` message, then each part in
      order as a Toren message (system prompts, user prompts, assistant text and tool
      calls, tool results, retry prompts). Thinking parts are not sent back by the
      neutral form and are left out.
    - tools: the function tools, then the output tools (name, description, JSON schema).
    - params: the model settings minus transport settings (timeouts, headers), plus
      ``output_mode`` and, for native or prompted output, ``output_schema``.

    With ``memo`` (one per run), a message converted for an earlier request of the run is
    not converted again while it holds what it held (:class:`Conversions`): the request's
    messages are then the very objects of the earlier request, which the digest
    recognises without a look at each one. The result is the same JSON either way.

    Raises :class:`~toren.errors.AgentConfigError` for a part it cannot represent
    (images, files, native tools): the run fails with that message, never silently.
    """
    out: list[Mapping[str, object]] = []
    instructions = _instructions(messages)
    if instructions:
        out.append(
            {"role": "system", "content": instructions}
            if memo is None
            else memo.system(instructions)
        )
    convert = _convert if memo is None else memo.of
    for message in messages:
        out += convert(message)
    native = getattr(params, "native_tools", None) or getattr(params, "builtin_tools", None)
    if native:
        raise _unsupported(
            f"native (provider-side) tools {[type(t).__name__ for t in native]}",
            "function tools (@agent.tool), whose calls Toren records as steps",
        )
    tools = tuple(_tool_spec(t) for t in (*params.function_tools, *params.output_tools))
    return ModelRequest(
        provider=provider,
        model=model,
        messages=tuple(out),
        tools=tools,
        params=_params(settings, params),
    )


def _convert(message: pai.ModelMessage) -> list[dict[str, object]]:
    """The neutral messages of one pydantic-ai message (a request: one per part it sends;
    a response: one assistant message)."""
    if isinstance(message, pai.ModelRequest):
        return [m for p in message.parts if (m := _request_part(p)) is not None]
    return [_assistant(message)]


# Values a part's field may hold and still be checked by identity alone: they never
# change. Containers (dicts, lists, tuples) of JSON values are pinned (checked item by
# item, in C); any other object (a pydantic model a tool returned, say) could change
# unseen, so a message holding one is converted afresh for every request.
_IMMUTABLE = frozenset({str, int, float, bool, type(None), datetime})
_CONTAINERS = frozenset({dict, list, tuple})
_FIELDS: dict[type, Callable[[object], tuple[object, ...]]] = {}


class Conversions:
    """The neutral messages of a run's pydantic-ai messages, converted once each.

    pydantic-ai sends a growing history: every request repeats the earlier requests'
    message objects. Each is converted once and its neutral messages (immutable
    :class:`~toren.core.contract.model_types.Message` objects) are handed out again while
    the message still holds what was converted: the same parts list holding the same
    part objects, each part's fields the same objects (every field, not only those the
    conversion reads, so a release that reads one more is still covered), and the
    dicts and lists among them pinned (:class:`~toren.core.contract.pins.Pinned`). A
    message changed in place, or holding an object that could change unseen, is
    converted afresh. The digest then sees the very objects of the earlier request and
    reuses their hashes (``HashCache.messages``), instead of looking at every message of
    the history at every step.
    """

    __slots__ = ("_kept", "_systems")

    def __init__(self) -> None:
        self._kept: dict[
            int, tuple[object, tuple[object, ...], Pinned | None, tuple[Message, ...]]
        ] = {}
        self._systems: dict[str, Message] = {}

    def system(self, instructions: str) -> Message:
        """The leading system message of these instructions (the same object for the same
        text, so a request's first message is the previous request's)."""
        kept = self._systems.get(instructions)
        if kept is None:
            if len(self._systems) > 16:
                self._systems.clear()
            kept = self._systems[instructions] = Message(role="system", content=instructions)
        return kept

    def of(self, message: pai.ModelMessage) -> Sequence[Mapping[str, object]]:
        source = _source(message)
        kept = self._kept.get(id(message))
        if (
            kept is not None
            and kept[0] is message
            and source is not None
            and len(source) == len(kept[1])
            and all(map(is_, source, kept[1]))
            and (kept[2] is None or kept[2].holds())
        ):
            return kept[3]
        plain = _convert(message)
        if source is not None:
            held = [v for v in source[1:] if type(v) in _CONTAINERS]  # [0]: the parts list
            pin = Pinned() if held else None
            if pin is None or (_small_trees(held) and all(map(pin.add, held))):
                converted = tuple(map(Message, plain))
                # Kept with the message itself, so its id stays its own.
                self._kept[id(message)] = (message, source, pin, converted)
                return converted
        # Not kept: plain dicts, which the digest recognises by their content (a fresh
        # Message would be hashed in full every time, and remembered for the tick).
        return plain


_TREE_NODES = 1_000  # containers and values a kept message's fields may hold at most


def _small_trees(values: list[object]) -> bool:
    """Whether ``values`` (a part's dicts, lists and tuples) are trees of at most
    ``_TREE_NODES`` nodes: no container reached twice (a dict holding itself would walk
    forever; one shared by many paths, many times). Fields the conversion never reads
    (``metadata``, ``provider_details``) may hold anything; such a message is not kept."""
    seen: set[int] = set()
    stack = list(values)
    nodes = 0
    while stack:
        v = stack.pop()
        nodes += 1
        if nodes > _TREE_NODES:
            return False
        if type(v) in _CONTAINERS:
            if id(v) in seen:
                return False
            seen.add(id(v))
            stack.extend(
                cast(dict[object, object], v).values() if type(v) is dict else cast(Any, v)
            )
    return True


def _source(message: pai.ModelMessage) -> tuple[object, ...] | None:
    """What ``message``'s conversion rests on, as objects to compare by identity: its
    parts list, each part and every field of each part; None when a field holds an
    object that could change unseen."""
    parts = message.parts
    out: list[object] = [parts]
    for part in parts:
        fields = _FIELDS.get(type(part))
        if fields is None:
            fields = _FIELDS[type(part)] = _fields_of(type(part))
        values = fields(part)
        for v in values:
            if type(v) not in _IMMUTABLE and type(v) not in _CONTAINERS:
                return None
        out.append(part)
        out += values
    return tuple(out)


def _fields_of(cls: type) -> Callable[[object], tuple[object, ...]]:
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
    if not names:
        return lambda part: (object(),)  # never the same: not kept
    if len(names) == 1:
        get = attrgetter(names[0])
        return lambda part: (get(part),)
    return cast(Callable[[object], tuple[object, ...]], attrgetter(*names))


def _instructions(messages: Sequence[pai.ModelMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, pai.ModelRequest) and message.instructions:
            return str(message.instructions)
    return ""


def _request_part(part: Any) -> dict[str, Any] | None:
    if isinstance(part, pai.SystemPromptPart):
        return {"role": "system", "content": part.content}
    if isinstance(part, pai.UserPromptPart):
        return {"role": "user", "content": _user_content(part.content)}
    if isinstance(part, pai.ToolReturnPart):
        return {
            "role": "tool",
            "tool_call_id": part.tool_call_id,
            "name": part.tool_name,
            "content": part.model_response_str(),
        }
    if hasattr(part, "model_response") and hasattr(part, "tool_call_id"):
        # A retry prompt (RetryPromptPart, or RetryFeedbackPart in later releases): the
        # answer to a tool call when it names one, else a user message.
        text = part.model_response()
        if getattr(part, "tool_name", None):
            return {
                "role": "tool",
                "tool_call_id": part.tool_call_id,
                "name": part.tool_name,
                "content": text,
            }
        return {"role": "user", "content": text}
    kind = type(part).__name__
    if kind.endswith(("DeltaPart", "BaselinePart")):
        return None  # pydantic-ai's bookkeeping of what changed, not content it sends
    raise _unsupported(f"a message part {kind}", "text prompts, tool calls and results")


def _user_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if all(isinstance(item, str) for item in content):
        return "\n".join(content)
    kinds = sorted({type(item).__name__ for item in content if not isinstance(item, str)})
    raise _unsupported(f"a user prompt with {', '.join(kinds)}", "a text prompt")


def _assistant(message: pai.ModelResponse) -> dict[str, object]:
    text = "".join(p.content for p in message.parts if isinstance(p, pai.TextPart))
    calls = [
        {"id": p.tool_call_id, "name": p.tool_name, "arguments": p.args_as_dict()}
        for p in message.parts
        if isinstance(p, pai.ToolCallPart)
    ]
    out: dict[str, object] = {"role": "assistant", "content": text}
    if calls:
        out["tool_calls"] = calls
    return out


def _tool_spec(tool: Any) -> ToolSpec:
    return ToolSpec(
        name=tool.name,
        description=tool.description or "",
        parameters=dict(tool.parameters_json_schema),
    )


def _params(
    settings: Mapping[str, object] | None, params: ModelRequestParameters
) -> dict[str, object]:
    out = {
        k: to_jsonable_python(v)
        for k, v in (settings or {}).items()
        if k not in TRANSPORT_PARAMS and k != "extra_body"
    }
    extra = (settings or {}).get("extra_body")
    if extra:
        out["extra_body"] = to_jsonable_python(extra)
    mode = params.output_mode
    out["output_mode"] = mode
    if mode in ("native", "prompted") and params.output_object is not None:
        out["output_schema"] = to_jsonable_python(params.output_object.json_schema)
    if not params.allow_text_output:
        out["allow_text_output"] = False
    return out


def _unsupported(found: str, expected: str) -> AgentConfigError:
    return AgentConfigError(
        f"the pydantic-ai agent sent {found}, which Toren's pydantic-ai integration does "
        f"not support; expected {expected} (see docs/pydantic-ai.md, 'What is supported')"
    )


# -- responses --------------------------------------------------------------------------

_FINISH_TO_NEUTRAL = {"tool_call": "tool_calls", "stop": "stop", "length": "length"}
_FINISH_FROM_NEUTRAL = {"tool_calls": "tool_call", "stop": "stop", "length": "length"}


def _to_neutral_response(response: pai.ModelResponse) -> ModelResponse:
    text = "".join(p.content for p in response.parts if isinstance(p, pai.TextPart))
    calls = tuple(
        ToolCall(id=p.tool_call_id, name=p.tool_name, arguments=p.args_as_dict())
        for p in response.parts
        if isinstance(p, pai.ToolCallPart)
    )
    usage = response.usage
    finish = getattr(response, "finish_reason", None)
    return ModelResponse(
        text=text,
        tool_calls=calls,
        usage=Usage(usage.input_tokens or 0, usage.output_tokens or 0),
        finish_reason=_FINISH_TO_NEUTRAL.get(str(finish), "tool_calls" if calls else "stop"),
        model=response.model_name or "",
    )


def from_neutral_response(response: ModelResponse, *, provider: str) -> pai.ModelResponse:
    """The pydantic-ai response a recorded (or just recorded) neutral response stands
    for: text, then tool calls, with the usage and model name the provider reported."""
    parts: list[Any] = []
    if response.text:
        parts.append(pai.TextPart(content=response.text))
    parts += [
        pai.ToolCallPart(tool_name=c.name, args=dict(c.arguments), tool_call_id=c.id)
        for c in response.tool_calls
    ]
    from pydantic_ai.usage import RequestUsage

    return pai.ModelResponse(
        parts=parts,
        usage=RequestUsage(
            input_tokens=response.usage.input_tokens, output_tokens=response.usage.output_tokens
        ),
        model_name=response.model or None,
        provider_name=provider,
        finish_reason=cast(Any, _FINISH_FROM_NEUTRAL.get(response.finish_reason)),
    )


# -- the model: each request a model step -------------------------------------------------


class _TorenModel(WrapperModel):
    """The agent's model, its requests made model steps of the current Toren run."""

    def __init__(self, wrapped: Model, provider: str) -> None:
        super().__init__(wrapped)
        # Not ``_provider``: newer pydantic-ai models keep their Provider object there.
        self._toren_provider = provider
        self._conversions = Conversions()  # this run's: the model is made per run

    async def request(
        self,
        messages: list[pai.ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> pai.ModelResponse:
        ctx = _current()
        _check_steps(ctx, "model request")
        # The request as the wrapped model will send it: its settings merged and its
        # parameters resolved (output mode, tool schemas customised for the provider).
        settings, params = self.wrapped.prepare_request(model_settings, model_request_parameters)
        request = neutral_request(
            messages,
            settings,
            params,
            provider=self._toren_provider,
            model=self.wrapped.model_name,
            memo=self._conversions,
        )
        token = _model_call.set(_ModelCall(self.wrapped, messages, settings, params))
        try:
            response = await ctx.model(
                f"{request.provider}:{request.model}",
                request.messages,
                tools=request.tools,
                **request.params,
            )
        except ModelCallFailed as exc:
            raise _http_error(exc, self.wrapped.model_name) from exc
        finally:
            _model_call.reset(token)
        return from_neutral_response(response, provider=self._toren_provider)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[pai.ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[object] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        # ``run_stream`` and event handlers: the step is one whole request (its text
        # deltas reach the run's SSE stream from the provider below), given to
        # pydantic-ai as a completed stream.
        from pydantic_ai.models import CompletedStreamedResponse

        response = await self.request(messages, model_settings, model_request_parameters)
        yield CompletedStreamedResponse(response, model_request_parameters=model_request_parameters)


def _http_error(exc: ModelCallFailed, model: str) -> Exception:
    status = exc.details.get("status")
    if isinstance(status, int) and status >= 400:
        error: Exception = ModelHTTPError(status_code=status, model_name=model, body=str(exc))
        return error
    return exc


class _Provider:
    """What the engine calls for a live model step of a pydantic-ai agent: the request
    pydantic-ai is making right now (this task's ``_model_call``), sent by the agent's own
    model, streamed so text deltas reach the run's SSE stream."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        call = _model_call.get()
        if call is None:
            raise AgentConfigError(
                f"the model provider {self.name!r} of a pydantic-ai agent serves only the "
                "agent's own requests; expected ctx.model calls to name another provider"
            )
        try:
            if _streams(call.model):
                response = await _streamed(call, on_delta)
            else:
                response = await call.model.request(call.messages, call.settings, call.params)
        except ModelHTTPError as exc:
            raise ModelCallFailed(
                f"{self.name} answered HTTP {exc.status_code}: {exc.body}",
                status=exc.status_code,
            ) from None
        return _to_neutral_response(response)


def _streams(model: Model) -> bool:
    """Whether the model streams: a ``FunctionModel`` without a ``stream_function`` (the
    offline scaffold's) does not, and is asked for the whole response."""
    return getattr(model, "stream_function", True) is not None


async def _streamed(call: _ModelCall, on_delta: DeltaCallback | None) -> pai.ModelResponse:
    async with call.model.request_stream(call.messages, call.settings, call.params) as streamed:
        async for event in streamed:
            text = _delta_text(event)
            if text and on_delta is not None:
                on_delta(text)
        return streamed.get()


def _delta_text(event: object) -> str:
    if isinstance(event, pai.PartStartEvent) and isinstance(event.part, pai.TextPart):
        return str(event.part.content)
    if isinstance(event, pai.PartDeltaEvent) and isinstance(event.delta, pai.TextPartDelta):
        return str(event.delta.content_delta)
    return ""


class _Providers(Mapping[str, Any]):
    """The providers a pydantic-ai agent brings: every provider name its requests carry
    (its model's ``system``) is served by :class:`_Provider`."""

    def __init__(self) -> None:
        self._made: dict[str, _Provider] = {}

    def __getitem__(self, name: str) -> _Provider:
        if name not in self._made:
            self._made[name] = _Provider(name)
        return self._made[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)

    def __iter__(self) -> Iterator[str]:
        return iter(self._made)

    def __len__(self) -> int:
        return len(self._made)


# -- tools: each call a tool step ---------------------------------------------------------


class _TorenToolset(WrapperToolset[Any]):
    """The agent's toolset (all of its function, MCP and other toolsets, combined by
    pydantic-ai), its calls made tool steps of the current Toren run."""

    async def call_tool(
        self, name: str, tool_args: dict[str, object], ctx: RunContext[object], tool: object
    ) -> object:
        toren_ctx = _current()
        _check_steps(toren_ctx, f"call of the tool {name!r}")
        token = _tool_call.set(_ToolCall(self.wrapped, name, tool_args, ctx, tool))
        try:
            result = await toren_ctx.tool(name, to_jsonable_python(tool_args))
        finally:
            _tool_call.reset(token)
        if isinstance(result, dict) and _RAISED in result:
            raise _control(result[_RAISED], result.get("args") or {})
        return result

    def visit_and_replace(self, visitor: object) -> AbstractToolset[object]:
        return self  # already wrapped: pydantic-ai's own wrappers must not unwrap it


@dataclass
class _ToolSteps(AbstractCapability[Any]):
    """The capability a Toren run gives each ``agent.run``: it wraps the toolset
    pydantic-ai assembles for the run (every toolset of the agent, output tools aside) in
    one :class:`_TorenToolset`. One wrapper around the whole, rather than one per toolset
    through ``agent.override(toolsets=...)``: an override keeps an empty function toolset
    beside the wrapped ones, and pydantic-ai runs every call on a combined toolset of
    several members in a task group (bench/RESULTS.md, issue 35)."""

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any]:
        return _TorenToolset(toolset)


def _control(kind: str, args: Mapping[str, Any]) -> Exception:
    error: Exception
    if kind == "ModelRetry":
        error = ModelRetry(str(args.get("message", "")))
    elif kind == "ApprovalRequired":
        error = ApprovalRequired(metadata=args.get("metadata"))
    else:
        error = CallDeferred(metadata=args.get("metadata"))
    return error


async def _run_tool(**_: object) -> object:
    """The function of every pydantic-ai tool step: the call pydantic-ai is making now
    (this task's ``_tool_call``), run by the toolset that owns it."""
    call = _tool_call.get()
    if call is None:
        raise ToolFailed("a pydantic-ai tool can only be called by its agent")
    try:
        result = await call.toolset.call_tool(call.name, call.args, call.run_context, call.tool)
    except ModelRetry as exc:
        return {_RAISED: "ModelRetry", "args": {"message": exc.message}}
    except ApprovalRequired as exc:
        return {_RAISED: "ApprovalRequired", "args": {"metadata": _jsonable(exc.metadata)}}
    except CallDeferred as exc:
        return {_RAISED: "CallDeferred", "args": {"metadata": _jsonable(exc.metadata)}}
    return to_jsonable_python(result)


def _jsonable(value: object) -> object:
    return None if value is None else to_jsonable_python(value)


def _declared_tools(agent: pydantic_ai.Agent[object, object]) -> dict[str, ToolDef]:
    out: dict[str, ToolDef] = {}
    for toolset in agent.toolsets:
        for name, tool in (getattr(toolset, "tools", None) or {}).items():
            options = dict(getattr(tool.function, "__toren_tool__", None) or {})
            options.update((getattr(tool, "metadata", None) or {}).get("toren") or {})
            out[name] = ToolDef(
                name=name,
                fn=_run_tool,
                spec=ToolSpec(name, tool.description or ""),
                reexecute=bool(options.get("reexecute", False)),
                side_effects=bool(options.get("side_effects", True)),
            )
    return out


# -- the agent function -------------------------------------------------------------------


def _current() -> Context:
    ctx = _ctx.get()
    if ctx is None:
        raise AgentConfigError(
            "a pydantic-ai agent adapted by Toren was run outside a Toren run; expected "
            "it to run through its agent.yaml entry (toren run, toren worker, the API)"
        )
    return ctx


def _check_steps(ctx: Context, what: str) -> None:
    check_steps(ctx, "pydantic-ai agent", what)


async def _answers(ctx: Context, requests: DeferredToolRequests) -> DeferredToolResults:
    """Wait durably for one answer per deferred call, in the order pydantic-ai listed
    them: a message ``approval`` per approval-required call (``true``, ``false`` or
    ``{"approved": false, "message": "why"}``), a message ``tool_result`` per external
    call (the tool's result)."""
    results = DeferredToolResults()
    for call in requests.approvals:
        answer = await ctx.wait_for_message(APPROVAL_MESSAGE)
        results.approvals[call.tool_call_id] = _approval(answer)
    for call in requests.calls:
        results.calls[call.tool_call_id] = await ctx.wait_for_message(TOOL_RESULT_MESSAGE)
    return results


def _approval(answer: object) -> bool | ToolDenied:
    if isinstance(answer, Mapping):
        if answer.get("approved", False):
            return True
        message = answer.get("message")
        return ToolDenied(str(message)) if message else False
    return bool(answer)


def adapt(obj: object, *, where: str) -> AgentFn | None:
    """The agent function for a ``pydantic_ai.Agent`` (``None`` for any other object of
    pydantic-ai). Raises :class:`~toren.agents.entries.EntryRefused` for an agent Toren
    cannot run: one without a model, or one already wrapped for another durable engine."""
    if not isinstance(obj, pydantic_ai.Agent):
        if isinstance(obj, pydantic_ai.agent.AbstractAgent):
            raise EntryRefused(
                f"a {type(obj).__name__}, a pydantic-ai agent wrapped for another durable "
                "engine (Temporal, DBOS, Prefect) or by another wrapper",
                "the plain pydantic_ai.Agent it wraps: Toren makes its steps durable itself",
            )
        return None
    if obj.model is None:
        raise EntryRefused(
            "a pydantic_ai.Agent without a model (it would need one passed to each run)",
            "Agent(model=...) with its model set, e.g. Agent(OpenAIChatModel(...)) or "
            "Agent('openai:gpt-4o-mini')",
        )
    agent: pydantic_ai.Agent[object, object] = obj
    tools = StepTools(_declared_tools(agent), _run_tool)

    async def run(ctx: Context, input: object) -> object:
        prompt = prompt_of(input, "pydantic-ai agent")
        from pydantic_ai.models import infer_model

        model = infer_model(cast(Any, agent.model))
        toren_model = _TorenModel(model, model.system)
        steps = [_ToolSteps()]
        token = _ctx.set(ctx)
        try:
            with agent.override(model=toren_model):
                result = await agent.run(prompt, capabilities=steps)
                while isinstance(result.output, DeferredToolRequests):
                    answers = await _answers(ctx, result.output)
                    result = await agent.run(
                        message_history=result.all_messages(),
                        deferred_tool_results=answers,
                        capabilities=steps,
                    )
        finally:
            _ctx.reset(token)
        return to_jsonable_python(result.output)

    async def aclose() -> None:
        """Close the HTTP client of the agent's model (the resolver's ``aclose``)."""
        model = agent.model
        client = getattr(model, "client", None) if isinstance(model, Model) else None
        closer = getattr(client, "close", None)
        if closer is not None:
            await closer()

    run.aclose = aclose  # type: ignore[attr-defined]
    run.toren_providers = _Providers()  # type: ignore[attr-defined]
    run.toren_tools = tools  # type: ignore[attr-defined]
    run.__qualname__ = run.__name__ = f"pydantic_ai:{agent.name or where}"
    return run
