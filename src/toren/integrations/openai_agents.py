"""OpenAI Agents SDK agents on Toren: an unmodified ``agents.Agent`` run by the SDK's own
``Runner`` inside a Toren run.

``entry: app:agent`` in agent.yaml names an ``Agent`` instance; :func:`adapt` turns it
into an agent function ``async (ctx, input) -> output``. The SDK drives its loop; Toren
owns its calls, through the SDK's public extension points only (a ``Model`` per agent,
set with ``Agent.clone``; ``FunctionTool``, ``Handoff`` and guardrail objects rebuilt
with ``dataclasses.replace``; ``RunConfig``):

- **Model calls are model steps** (``ctx.model``). The digest is computed from Toren's
  provider-neutral form of the request (:func:`neutral_request`; documented in
  docs/openai-agents.md, "The neutral request"), never from the SDK's serialisation, so an
  SDK release that sends the same request keeps the same digest. The request is sent by
  the agent's own SDK model (``OpenAIResponsesModel``, ``OpenAIChatCompletionsModel``, or
  the SDK's default for a model name), through a provider this module hands the engine
  (``toren_providers``), streamed so text deltas reach the run's SSE stream. Tokens and
  cost are recorded; a replay answers from the log and the SDK sees the same response.
- **Function tools are tool steps** (``ctx.tool``) with Toren's ``side_effects``
  semantics: after an invalidation an identical call of a side-effecting tool reuses
  its result. :func:`tool_options` marks a read (``side_effects=False``).
- **Handoffs are tool steps** named after the handoff tool (``transfer_to_billing``) that
  record the agent handed to, so a replay takes the same handoff and a handoff's
  ``on_handoff`` callback runs once.
- **Guardrails are tool steps** (``guardrail:NAME``) that record their verdict: a
  guardrail that calls a model is not called again on replay. Input guardrails run before
  the agent's first model call (``run_in_parallel=False``), so their step comes first
  and a tripped guardrail never pays for the agent's answer.
- **Approvals** (``needs_approval`` tools) park the run durably: one message
  ``approval`` (``true``, ``false`` or ``{"approved": false, "message": "why"}``) per
  interrupted call, then the SDK run resumes from its ``RunState``.

Not supported (refused with a clear error, never silently): hosted tools (web search,
file search, computer use, code interpreter...), server-side conversation state
(``previous_response_id``, ``conversation_id``), prompt templates (``prompt=``), and
non-text input (images, files).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toren.agents.entries import EntryRefused
from toren.core.agent_api.program import AgentFn, ToolDef
from toren.core.contract.model_types import (
    TRANSPORT_PARAMS,
    DeltaCallback,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
)
from toren.errors import AgentConfigError, InvalidInput, ModelCallFailed, ToolFailed
from toren.integrations._steps import StepTools, check_steps, prompt_of

try:
    import openai
    from agents.models.interface import Model
    from agents.models.multi_provider import MultiProvider
    from openai.types.responses import (
        Response,
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )
    from pydantic import BaseModel

    import agents
    from agents import (
        Agent,
        FunctionTool,
        GuardrailFunctionOutput,
        InputGuardrail,
        OutputGuardrail,
        RunConfig,
        Runner,
    )
    from agents import ModelResponse as SdkResponse
    from agents import Usage as SdkUsage
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    raise ModuleNotFoundError(
        "toren.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'toren-run[openai-agents]'",
        name=exc.name,
    ) from exc

if TYPE_CHECKING:
    from toren.core.agent_api.context import Context

__all__ = ["APPROVAL_MESSAGE", "TorenModel", "adapt", "neutral_request", "tool_options"]

APPROVAL_MESSAGE = "approval"
DOCS = "docs/openai-agents.md"

_ctx: ContextVar[Context | None] = ContextVar("toren_openai_agents_ctx", default=None)


# -- the neutral request ------------------------------------------------------------------


def neutral_request(
    system_instructions: str | None,
    input: str | Sequence[object],
    model_settings: object,
    tools: Sequence[object],
    output_schema: object,
    handoffs: Sequence[Any],
    *,
    provider: str,
    model: str,
) -> ModelRequest:
    """Toren's provider-neutral form of an SDK model request, the input of its digest
    (docs/openai-agents.md, "The neutral request"):

    - messages: the instructions as a leading ``system`` message, then the input items as
      Toren messages: a user/system/developer message as ``{role, content}``, an
      assistant message and the function calls after it as one ``assistant`` message with
      ``tool_calls`` (arguments decoded), a function call output as a ``tool`` message.
      Reasoning items are left out; item ids and statuses never enter.
    - tools: the function tools, then the handoffs (as the SDK presents them to the
      model: ``transfer_to_<agent>``), each as name, description, JSON schema.
    - params: the model settings that are set, minus transport settings (headers,
      timeouts, retries), plus ``output_schema`` ``{name, schema, strict}`` for a
      structured output type.
    """
    messages: list[dict[str, Any]] = []
    if system_instructions:
        messages.append({"role": "system", "content": system_instructions})
    items = [{"role": "user", "content": input}] if isinstance(input, str) else input
    for raw in items:
        _add_item(messages, _as_dict(raw))
    specs = [_tool_spec(t) for t in tools]
    specs += [
        ToolSpec(h.tool_name, h.tool_description or "", h.input_json_schema) for h in handoffs
    ]
    return ModelRequest(
        provider=provider,
        model=model,
        messages=tuple(messages),
        tools=tuple(specs),
        params=_params(model_settings, output_schema),
    )


def _as_dict(item: object) -> dict[str, object]:
    if isinstance(item, Mapping):
        return dict(item)
    if isinstance(item, BaseModel):
        return item.model_dump(exclude_unset=True, mode="json")
    raise _unsupported(f"an input item of type {type(item).__name__}", "Responses input items")


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any]) -> None:
    kind = item.get("type", "message")
    if kind == "message" and item.get("role") == "assistant":
        messages.append({"role": "assistant", "content": _text(item.get("content"))})
    elif kind == "message" and item.get("role") in ("user", "system", "developer"):
        messages.append({"role": item["role"], "content": _text(item.get("content"))})
    elif kind == "function_call":
        last = messages[-1] if messages else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant", "content": ""}
            messages.append(last)
        last.setdefault("tool_calls", []).append(
            {"id": item["call_id"], "name": item["name"], "arguments": _arguments(item)}
        )
    elif kind == "function_call_output":
        output = item.get("output")
        messages.append(
            {
                "role": "tool",
                "tool_call_id": item["call_id"],
                "content": output if isinstance(output, str) else _text(output),
            }
        )
    elif kind != "reasoning":
        raise _unsupported(f"an input item of type {kind!r}", "messages and function calls")


def _arguments(item: Mapping[str, Any]) -> Any:
    text = item.get("arguments") or ""
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:
        return {"__raw_arguments__": text}  # the model's mistake, kept as it wrote it


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[str] = []
    for part in content:
        part = _as_dict(part)
        if part.get("type") in ("input_text", "output_text", "text"):
            parts.append(str(part.get("text", "")))
        elif part.get("type") == "refusal":
            parts.append(str(part.get("refusal", "")))
        else:
            raise _unsupported(f"content of type {part.get('type')!r}", "text content")
    return "".join(parts)


def _tool_spec(tool: object) -> ToolSpec:
    if not isinstance(tool, FunctionTool):
        raise _unsupported(f"a {type(tool).__name__} (a hosted tool)", "function tools")
    return ToolSpec(tool.name, tool.description or "", dict(tool.params_json_schema))


# ModelSettings keys that configure the connection, not the request.
_TRANSPORT_SETTINGS = frozenset(
    {"extra_headers", "extra_query", "retry", "timeout", "preserve_raw_usage", "include_usage"}
)


def _params(settings: Any, output_schema: Any) -> dict[str, Any]:
    data = settings.to_json_dict() if settings is not None else {}
    out = {
        k: _set(v)
        for k, v in sorted(data.items())
        if v is not None and k not in TRANSPORT_PARAMS and k not in _TRANSPORT_SETTINGS
    }
    if output_schema is not None and not output_schema.is_plain_text():
        out["output_schema"] = {
            "name": output_schema.name(),
            "schema": output_schema.json_schema(),
            "strict": output_schema.is_strict_json_schema(),
        }
    return out


def _set(value: object) -> object:
    """``value`` without its unset (``None``) members, at every depth: an SDK release that
    adds an optional field (``Reasoning.mode``) sends the same request, so it must keep
    the same digest."""
    if isinstance(value, Mapping):
        return {k: _set(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_set(v) for v in value]
    return value


def _unsupported(found: str, expected: str) -> AgentConfigError:
    return AgentConfigError(
        f"the OpenAI Agents SDK agent sent {found}, which Toren's openai-agents integration "
        f"does not support; expected {expected} (see {DOCS}, 'What is supported')"
    )


# -- responses both ways ------------------------------------------------------------------


def _from_output(output: Sequence[object], usage: Usage, model: str) -> ModelResponse:
    text: list[str] = []
    calls: list[ToolCall] = []
    for item in output:
        if isinstance(item, ResponseOutputMessage):
            text += [
                str(getattr(p, "text", None) or getattr(p, "refusal", "")) for p in item.content
            ]
        elif isinstance(item, ResponseFunctionToolCall):
            args = _arguments({"arguments": item.arguments})
            calls.append(ToolCall(item.call_id, item.name, args))
    return ModelResponse(
        text="".join(text),
        tool_calls=tuple(calls),
        usage=usage,
        finish_reason="tool_calls" if calls else "stop",
        model=model,
    )


def _to_sdk(response: ModelResponse) -> SdkResponse:
    """The SDK response a recorded neutral response stands for, the same live and on
    replay (so the requests that follow are the same either way)."""
    output: list[Any] = []
    if response.text or not response.tool_calls:
        part = ResponseOutputText(type="output_text", text=response.text, annotations=[])
        output.append(
            ResponseOutputMessage(
                id="__fake_id__",
                type="message",
                role="assistant",
                status="completed",
                content=[part],
            )
        )
    for call in response.tool_calls:
        output.append(
            ResponseFunctionToolCall(
                type="function_call",
                call_id=call.id,
                name=call.name,
                arguments=json.dumps(dict(call.arguments)),
            )
        )
    used = response.usage
    usage = SdkUsage(
        requests=1,
        input_tokens=used.input_tokens,
        output_tokens=used.output_tokens,
        total_tokens=used.input_tokens + used.output_tokens,
    )
    return SdkResponse(output=output, usage=usage, response_id=None)


# -- the model: each call a model step -------------------------------------------------------


@dataclass(frozen=True)
class _PendingCall:
    model: Model
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


_pending_call: ContextVar[_PendingCall | None] = ContextVar("toren_oa_model", default=None)


def model_reference(model: Model) -> tuple[str, str]:
    """(provider, model) of an SDK model, as its steps are digested and priced:
    ``OpenAIResponsesModel`` is ``openai-responses``, ``OpenAIChatCompletionsModel`` is
    ``openai``, any other model class ``openai-agents``."""
    name = str(getattr(model, "model", "") or type(model).__name__)
    kind = type(model).__name__
    if kind == "OpenAIResponsesModel":
        return "openai-responses", name
    if kind == "OpenAIChatCompletionsModel":
        return "openai", name
    return "openai-agents", name


# The provider names of steps sent by the SDK's own models (see model_reference).
SDK_PROVIDERS = frozenset({"openai-responses", "openai", "openai-agents"})


class TorenModel(Model):
    """An SDK model that is one of Toren's own providers, by model reference:
    ``Agent(model=TorenModel("scripted:script.yaml"))`` runs offline on the scripted
    model, ``TorenModel("anthropic:claude-haiku-4-5")`` on Toren's Anthropic provider (its
    key, retries and rate limits). Only inside a Toren run; the SDK's OpenAI models
    (``OpenAIResponsesModel``, ``OpenAIChatCompletionsModel``) are used as they are."""

    def __init__(self, reference: str) -> None:
        provider, sep, model = reference.partition(":")
        if not sep or not provider or not model:
            raise InvalidInput(
                f"TorenModel({reference!r}): expected a model reference 'provider:model', "
                "e.g. 'scripted:script.yaml'"
            )
        if provider in SDK_PROVIDERS:
            raise InvalidInput(
                f"TorenModel({reference!r}): {provider!r} steps are sent by the SDK's own "
                "OpenAI models; use OpenAIResponsesModel (digested as 'openai-responses') "
                "or OpenAIChatCompletionsModel ('openai') instead"
            )
        self.provider, self.model = provider, model

    async def get_response(self, *args: object, **kwargs: object) -> SdkResponse:
        raise AgentConfigError(
            f"TorenModel('{self.provider}:{self.model}') answers only inside a Toren run; "
            "expected the agent to run through its agent.yaml entry"
        )

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise AgentConfigError("TorenModel streams only inside a Toren run (Runner.run)")


class _TorenModel(Model):
    """An SDK model whose calls are model steps of the current Toren run."""

    def __init__(self, wrapped: Model) -> None:
        self.wrapped = wrapped
        if isinstance(wrapped, TorenModel):
            self.provider, self.model = wrapped.provider, wrapped.model
        else:
            self.provider, self.model = model_reference(wrapped)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: object = None,
    ) -> SdkResponse:
        if previous_response_id or conversation_id:
            raise _unsupported(
                "server-side conversation state (previous_response_id / conversation_id)",
                "the whole conversation in each request (Toren's log holds it)",
            )
        if prompt is not None:
            raise _unsupported("a prompt template (prompt=)", "instructions")
        ctx = _current()
        _check_steps(ctx, "model call")
        request = neutral_request(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            provider=self.provider,
            model=self.model,
        )
        if model_settings.include_usage is None:
            # Usage on a streamed Chat Completions answer (Toren always streams); a
            # transport setting, outside the digest.
            model_settings = dataclasses.replace(model_settings, include_usage=True)
        args = (system_instructions, input, model_settings, tools, output_schema, handoffs)
        pending = _PendingCall(
            self.wrapped,
            (*args, tracing),
            {"previous_response_id": None, "conversation_id": None, "prompt": None},
        )
        token = _pending_call.set(pending)
        try:
            response = await ctx.model(
                f"{request.provider}:{request.model}",
                request.messages,
                tools=request.tools,
                **request.params,
            )
        finally:
            _pending_call.reset(token)
        if response.finish_reason == "error":  # pragma: no cover - the engine raises
            raise ModelCallFailed("the model call failed")
        return _to_sdk(response)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise _unsupported(
            "a streamed run (Runner.run_streamed)",
            "Runner.run: Toren streams every model call's text to the run's SSE stream",
        )


class _Provider:
    """What the engine calls for a live model step of an SDK agent: the call the SDK is
    making right now (this task's pending call), sent by the agent's own SDK model,
    streamed so text deltas reach the run's SSE stream."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaCallback | None = None
    ) -> ModelResponse:
        call = _pending_call.get()
        if call is None:
            raise AgentConfigError(
                f"the model provider {self.name!r} of an OpenAI Agents SDK agent serves "
                "only the agent's own model calls; expected ctx.model to name another provider"
            )
        try:
            if on_delta is None:
                got = await call.model.get_response(*call.args, **call.kwargs)
                return _from_output(got.output, _usage(got.usage), request.model)
            final: Response | None = None
            async for event in call.model.stream_response(*call.args, **call.kwargs):
                if event.type == "response.output_text.delta" and event.delta:
                    on_delta(event.delta)
                elif event.type in ("response.completed", "response.incomplete"):
                    final = event.response
        except openai.APIStatusError as exc:
            raise ModelCallFailed(
                f"{self.name} answered HTTP {exc.status_code}: {exc.message}",
                provider=self.name,
                status=exc.status_code,
            ) from None
        except openai.APIError as exc:
            cause = exc.__cause__  # what the transport saw: a reset, a cut-off body...
            why = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
            raise ModelCallFailed(
                f"{self.name} failed: {type(exc).__name__}: {exc.message}{why}",
                provider=self.name,
            ) from None
        if final is None:
            raise ModelCallFailed(
                f"{self.name}: the stream ended before the model finished", provider=self.name
            )
        usage = final.usage
        used = Usage(usage.input_tokens, usage.output_tokens) if usage else Usage()
        return _from_output(final.output, used, final.model or request.model)


def _usage(usage: SdkUsage) -> Usage:
    return Usage(usage.input_tokens, usage.output_tokens)


def _providers() -> dict[str, _Provider]:
    """The providers an SDK agent brings: the names of steps its SDK models send. A
    :class:`TorenModel`'s steps go to the agent's and the runtime's providers."""
    return {name: _Provider(name) for name in sorted(SDK_PROVIDERS)}


# -- tools, handoffs and guardrails: each a tool step -----------------------------------------

_pending_tool: ContextVar[Callable[[], Awaitable[object]] | None] = ContextVar(
    "toren_oa_tool", default=None
)


async def _run_pending(**_: Any) -> Any:
    """The function of every SDK tool step: the call the SDK is making now (this task's
    pending tool call)."""
    pending = _pending_tool.get()
    if pending is None:
        raise ToolFailed("an OpenAI Agents SDK tool can only be called by its agent")
    return await pending()


async def _step(name: str, args: Mapping[str, Any], run: Callable[[], Awaitable[Any]]) -> Any:
    ctx = _current()
    _check_steps(ctx, f"step {name!r}")
    token = _pending_tool.set(run)
    try:
        return await ctx.tool(name, args)
    finally:
        _pending_tool.reset(token)


def _jsonable(value: object) -> object:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return str(value)


_TOOL_OPTIONS: dict[int, dict[str, bool]] = {}


def tool_options(tool: FunctionTool, *, side_effects: bool = True, reexecute: bool = False) -> Any:
    """Mark an SDK function tool for Toren: ``side_effects=False`` for a read (it runs
    again after an invalidation), ``reexecute=True`` for a result that must be fresh.
    Returns the tool, so it can wrap ``function_tool(...)``."""
    _TOOL_OPTIONS[id(tool)] = {"side_effects": side_effects, "reexecute": reexecute}
    return tool


def _wrap_tool(tool: object, declared: dict[str, ToolDef]) -> object:
    if not isinstance(tool, FunctionTool):
        raise EntryRefused(
            f"an agent with a {type(tool).__name__} (a hosted tool, run by OpenAI outside "
            "Toren's log)",
            f"function tools (@function_tool); see {DOCS}, 'What is supported'",
        )
    original = tool.on_invoke_tool
    options = _TOOL_OPTIONS.get(id(tool), {})
    declared[tool.name] = ToolDef(
        name=tool.name,
        fn=_run_pending,
        spec=ToolSpec(tool.name, tool.description or ""),
        side_effects=options.get("side_effects", True),
        reexecute=options.get("reexecute", False),
    )

    async def invoke(context: Any, arguments: str) -> Any:
        async def run() -> object:
            return _jsonable(await original(context, arguments))

        return await _step(tool.name, _arguments({"arguments": arguments}), run)

    return dataclasses.replace(tool, on_invoke_tool=invoke)


class _Graph:
    """The agents of one run, each cloned once with Toren's model, tools, handoffs and
    guardrails (handoffs may form cycles: each agent is cloned once, by identity)."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.clones: dict[int, Any] = {}
        self.by_name: dict[str, object] = {}
        self.tools: dict[str, ToolDef] = {}

    def wrap(self, agent: Any) -> Any:
        found = self.clones.get(id(agent))
        if found is not None:
            return found
        model = agent.model if isinstance(agent.model, Model) else None
        if model is None:
            model = self.provider.get_model(agent.model)
        clone = agent.clone(
            model=_TorenModel(model),
            tools=[_wrap_tool(t, self.tools) for t in agent.tools],
            input_guardrails=[_wrap_guardrail(g, "input") for g in agent.input_guardrails],
            output_guardrails=[_wrap_guardrail(g, "output") for g in agent.output_guardrails],
            handoffs=[],
        )
        self.clones[id(agent)] = clone
        self.by_name.setdefault(agent.name, clone)
        clone.handoffs = [self._wrap_handoff(h) for h in agent.handoffs]
        return clone

    def _wrap_handoff(self, target: Any) -> Any:
        if isinstance(target, Agent):
            target = agents.handoff(target)
        original = target.on_invoke_handoff
        name = target.tool_name
        known = _handoff_target(target)

        async def invoke(context: object, arguments: str) -> object:
            live: list[object] = []

            async def run() -> object:
                agent = await original(context, arguments)
                live.append(agent)
                return {"agent": agent.name}

            recorded = await _step(name, _arguments({"arguments": arguments}), run)
            if live:
                return self.wrap(live[0])
            # Replayed: the recorded agent, without calling the handoff again (its
            # ``on_handoff`` callback ran when the step was taken, not on a resume).
            agent_name = str((recorded or {}).get("agent"))
            chosen = self.by_name.get(agent_name)
            if chosen is None and known is not None and known.name == agent_name:
                chosen = self.wrap(known)
            if chosen is None:
                # A hand-built Handoff (not made by agents.handoff): only its own
                # on_invoke_handoff knows its agent, so it runs again, as agent code
                # outside a step does on a replay.
                chosen = self.wrap(await original(context, arguments))
            return chosen

        return dataclasses.replace(target, on_invoke_handoff=invoke)


def _handoff_target(handoff: Any) -> Any:
    """The agent a handoff made by ``agents.handoff()`` (or listed as an ``Agent``) hands
    to, without invoking it: the SDK keeps it on the handoff as a weak reference
    (``_agent_ref``, which its own run state and graph visualisation read; present across
    the pinned SDK range). ``None`` for a hand-built ``Handoff``."""
    ref = getattr(handoff, "_agent_ref", None)
    agent = ref() if callable(ref) else None
    return agent if isinstance(agent, Agent) else None


def _wrap_guardrail(guardrail: Any, kind: str) -> Any:
    function = guardrail.guardrail_function
    name = f"guardrail:{guardrail.get_name()}"

    async def checked(context: object, agent: object, value: object) -> GuardrailFunctionOutput:
        async def run() -> object:
            result = function(context, agent, value)
            if hasattr(result, "__await__"):
                result = await result
            return {
                "tripwire_triggered": bool(result.tripwire_triggered),
                "output_info": _jsonable(result.output_info),
            }

        verdict = await _step(name, {kind: _jsonable(value)}, run)
        return GuardrailFunctionOutput(
            output_info=verdict["output_info"], tripwire_triggered=verdict["tripwire_triggered"]
        )

    if isinstance(guardrail, InputGuardrail):
        return dataclasses.replace(guardrail, guardrail_function=checked, run_in_parallel=False)
    assert isinstance(guardrail, OutputGuardrail)
    return dataclasses.replace(guardrail, guardrail_function=checked)


# -- the agent function ---------------------------------------------------------------------


def _current() -> Context:
    ctx = _ctx.get()
    if ctx is None:
        raise AgentConfigError(
            "an OpenAI Agents SDK agent adapted by Toren was run outside a Toren run; "
            "expected it to run through its agent.yaml entry (toren run, worker, the API)"
        )
    return ctx


def _check_steps(ctx: Context, what: str) -> None:
    check_steps(ctx, "OpenAI Agents SDK agent", what)


def _approved(answer: object) -> tuple[bool, str | None]:
    if isinstance(answer, Mapping):
        message = answer.get("message")
        return bool(answer.get("approved", False)), str(message) if message else None
    return bool(answer), None


def _check(agent: Any, seen: set[int], declared: dict[str, ToolDef]) -> None:
    """Refuse, when the agent loads, what Toren cannot run (hosted tools), anywhere in the
    graph of agents its handoffs reach; declare the function tools found."""
    if id(agent) in seen:
        return
    seen.add(id(agent))
    for tool in agent.tools:
        _wrap_tool(tool, declared)
    for target in agent.handoffs:
        if isinstance(target, Agent):
            _check(target, seen, declared)


def adapt(obj: object, *, where: str) -> AgentFn | None:
    """The agent function for an ``agents.Agent`` (``None`` for any other object of the
    SDK). Raises :class:`~toren.agents.entries.EntryRefused` for an agent Toren cannot run."""
    if not isinstance(obj, Agent):
        return None
    start: Any = obj
    declared: dict[str, ToolDef] = {}
    _check(start, set(), declared)

    async def run(ctx: Context, input: object) -> object:
        prompt = prompt_of(input, "OpenAI Agents SDK agent")
        graph = _Graph(MultiProvider())
        agent = graph.wrap(start)
        declared.update(graph.tools)
        config = RunConfig(tracing_disabled=True, workflow_name=start.name)
        token = _ctx.set(ctx)
        try:
            result = await Runner.run(agent, prompt, run_config=config)
            while result.interruptions:
                state = result.to_state()
                for item in result.interruptions:
                    approved, why = _approved(await ctx.wait_for_message(APPROVAL_MESSAGE))
                    if approved:
                        state.approve(item)
                    else:
                        state.reject(item, rejection_message=why)
                result = await Runner.run(agent, state, run_config=config)
        finally:
            _ctx.reset(token)
        return _jsonable(result.final_output)

    run.toren_providers = _providers()  # type: ignore[attr-defined]
    run.toren_tools = StepTools(declared, _run_pending)  # type: ignore[attr-defined]
    run.__qualname__ = run.__name__ = f"openai_agents:{start.name or where}"
    return run
