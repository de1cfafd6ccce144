"""The OpenAI provider: chat completions through the official ``openai`` SDK.

Works with every OpenAI-compatible server (vLLM, Ollama, LiteLLM, Azure-style gateways):
the base URL and key are configurable, read from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``
when the provider is built (never at import, so two runtimes in one process can differ).

``request.params`` go into the request body verbatim (``extra_body``), so a parameter the
installed SDK does not know yet still reaches the server.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion_usage import CompletionUsage

from toren.errors import InvalidInput, ProviderUnavailable
from toren.providers._retry import Attempt, SdkErrors, decoded, parsed
from toren.providers._sdk import SdkProvider
from toren.providers._wire import content_text, require, sampling_params, tool_call
from toren.providers.base import (
    DeltaCallback,
    MessageLike,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
)

_ERRORS = SdkErrors(status=openai.APIStatusError, connection=openai.APIConnectionError)

# OpenAI-compatible local servers need no key, but the SDK refuses to start without one.
_PLACEHOLDER_KEY = "no-key"


# --- wire format: Toren -> OpenAI ----------------------------------------------------


def wire_message(message: MessageLike) -> dict[str, object]:
    role = require(message, "role")
    if role == "assistant":
        return _wire_assistant(message)
    if role == "tool":
        return {
            "role": "tool",
            "tool_call_id": str(require(message, "tool_call_id")),
            "content": content_text(message.get("content")),
        }
    return {k: v for k, v in message.items() if k in ("role", "content", "name")}


def _wire_assistant(message: MessageLike) -> dict[str, object]:
    calls = [ToolCall.from_dict(c) for c in message.get("tool_calls") or ()]
    wire: dict[str, object] = {"role": "assistant", "content": message.get("content") or None}
    if calls:
        wire["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))},
            }
            for c in calls
        ]
    return wire


def wire_tool(tool: ToolSpec) -> dict[str, object]:
    return {"type": "function", "function": tool.to_dict()}


def wire_request(request: ModelRequest) -> dict[str, object]:
    kwargs: dict[str, object] = {
        "model": request.model,
        "messages": [wire_message(m) for m in request.messages],
    }
    if request.tools:
        kwargs["tools"] = [wire_tool(t) for t in request.tools]
    params = sampling_params(request)
    _check_n(request.model, params)
    if params:
        kwargs["extra_body"] = params
    return kwargs


def _check_n(model: str, params: Mapping[str, object]) -> None:
    """Refuse ``n`` other than 1 before anything is sent. The server would generate (and
    bill) ``n`` answers, and a model call records one: keeping the first would silently
    pay for the rest."""
    n = params.get("n")
    if n is None or (n == 1 and not isinstance(n, bool)):
        return
    raise InvalidInput(
        f"the openai call to model {model!r} asks for n={n!r} alternative answers; a "
        "Toren model call records one answer, so n must be 1 or left out (model_params "
        "in agent.yaml, or the params of ctx.model). For several answers, make several "
        "model calls: each is its own step, recorded and replayed on its own."
    )


# --- wire format: OpenAI -> Toren ----------------------------------------------------


def _usage(usage: CompletionUsage | None) -> Usage:
    if usage is None:
        return Usage()
    return Usage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens)


def parse_completion(completion: ChatCompletion) -> ModelResponse:
    """Raises ``ValueError`` when the completion lacks what every answer must have."""
    if not completion.choices:
        raise ValueError("the completion has no choices")
    choice = completion.choices[0]
    calls = tuple(
        tool_call(c.id, c.function.name, c.function.arguments)
        for c in choice.message.tool_calls or ()
        if c.type == "function"
    )
    return ModelResponse(
        text=choice.message.content or "",
        tool_calls=calls,
        usage=_usage(completion.usage),
        finish_reason=choice.finish_reason or "stop",
        model=completion.model,
    )


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamAssembler:
    """Folds streamed chunks into the response a non-streaming call would have given."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: CompletionUsage | None = None
    model: str = ""

    def add(self, chunk: ChatCompletionChunk) -> str:
        """Take one chunk; return its text delta ("" if none)."""
        self.model = chunk.model or self.model
        self.usage = chunk.usage or self.usage
        # Only the first choice: n is refused above 1, but a server may stream more
        # anyway, and their chunks interleave (each choice names its index).
        choice = next((c for c in chunk.choices if c.index == 0), None)
        if choice is None:
            return ""
        self.finish_reason = choice.finish_reason or self.finish_reason
        for delta in choice.delta.tool_calls or ():
            partial = self.calls.setdefault(delta.index, _PartialCall())
            partial.id = delta.id or partial.id
            if delta.function is not None:
                partial.name = delta.function.name or partial.name
                partial.arguments.append(delta.function.arguments or "")
        text = choice.delta.content or ""
        self.text.append(text)
        return text

    def response(self) -> ModelResponse:
        """Raises ``ValueError`` for a stream that ended before the model finished (a
        proxy that cut it short): a truncated answer must not pass for a whole one."""
        if self.finish_reason is None:
            raise ValueError("the stream ended before the model finished (no finish_reason)")
        calls = tuple(
            tool_call(p.id, p.name, "".join(p.arguments)) for _, p in sorted(self.calls.items())
        )
        return ModelResponse(
            text="".join(self.text),
            tool_calls=calls,
            usage=_usage(self.usage),
            finish_reason=self.finish_reason,
            model=self.model,
        )


# --- client and credentials ----------------------------------------------------------


def _client(api_key: str | None, base_url: str | None, timeout: float) -> openai.AsyncOpenAI:
    key = api_key or os.environ.get("OPENAI_API_KEY")
    url = base_url or os.environ.get("OPENAI_BASE_URL") or None
    if not key and not url:
        raise ProviderUnavailable(
            "no OpenAI API key — set OPENAI_API_KEY or `api_key_env` "
            "(providers.openai.api_key_env) in agent.yaml (a local OpenAI-compatible "
            "server needs providers.openai.base_url or OPENAI_BASE_URL instead)",
            provider="openai",
        )
    # max_retries=0: Toren's retry loop is the only one, so the policy means what it says.
    return openai.AsyncOpenAI(
        api_key=key or _PLACEHOLDER_KEY, base_url=url, timeout=timeout, max_retries=0
    )


class OpenAIProvider(SdkProvider[openai.AsyncOpenAI]):
    """:class:`~toren.providers.base.ModelProvider` over OpenAI chat completions; the
    constructor (``client``, ``sleep``, ``rand``) is
    :class:`~toren.providers._sdk.SdkProvider`'s."""

    name = "openai"
    errors = _ERRORS

    def _connect(
        self, api_key: str | None, base_url: str | None, timeout: float
    ) -> openai.AsyncOpenAI:
        return _client(api_key, base_url, timeout)

    def _wire(self, request: ModelRequest) -> dict[str, object]:
        return wire_request(request)

    async def _create(self, kwargs: Mapping[str, Any], attempt: Attempt) -> ModelResponse:
        raw = await self._client.chat.completions.with_raw_response.create(**kwargs)
        completion = parsed(lambda: _as_completion(raw.parse()), status=raw.status_code)
        if completion.usage is not None:
            attempt.used(_usage(completion.usage))
        return parsed(lambda: parse_completion(completion), status=raw.status_code)

    async def _stream(
        self, kwargs: Mapping[str, Any], on_delta: DeltaCallback, attempt: Attempt
    ) -> ModelResponse:
        stream = await self._client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
        attempt.began()
        status = stream.response.status_code
        assembler = StreamAssembler()
        async with stream, aclosing(decoded(stream.__aiter__(), status=status)) as chunks:
            async for chunk in chunks:
                if delta := assembler.add(chunk):
                    on_delta(delta)
                if chunk.usage is not None:
                    attempt.used(_usage(chunk.usage))
        return parsed(assembler.response, status=status)


def _as_completion(value: object) -> ChatCompletion:
    # A server that answers 200 with a non-JSON content type makes the SDK return a str.
    if not isinstance(value, ChatCompletion):
        raise ValueError(f"expected a chat completion, got {type(value).__name__}")
    return value
