"""The OpenAI provider on the Responses API (``/v1/responses``), through the official
``openai`` SDK.

Selected by the provider type ``openai-responses``: the built-in name
(``openai-responses:gpt-4.1``) or a declared provider (``providers: {oai: {type:
openai-responses, base_url: ...}}``). Chat Completions (``openai``) stays the default; the
two are separate provider types because they are separate requests: a model moved from
one API to the other is digested as a different request (``provider`` is part of the
digest, docs/digest.md), since its answers, parameters and billing differ.

Toren keeps no server-side state: every call sends the whole conversation as ``input``
and never ``previous_response_id``, and the answer is in Toren's log, so a replay never
needs a response OpenAI stored. ``request.params`` go into the body verbatim
(``extra_body``) in the Responses API's own names (``max_output_tokens``, ``reasoning``,
``text``, ``store``, ...).

Toren's messages map to Responses input items: ``system``/``developer``/``user``
messages as they are, an ``assistant`` message as its text (if any) followed by one
``function_call`` item per tool call, a ``tool`` message as a ``function_call_output``.
Output items other than messages and function calls (reasoning summaries, built-in tool
calls) are not part of Toren's response and are left out; their tokens are still in the
usage.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import aclosing
from typing import Any

import openai
from openai.types.responses import Response, ResponseUsage

from toren.providers._retry import (
    Attempt,
    StreamBroken,
    decoded,
    parsed,
)
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
from toren.providers.openai import _ERRORS, _client

__all__ = ["OpenAIResponsesProvider", "parse_response", "wire_input", "wire_request"]


# --- wire format: Toren -> Responses -------------------------------------------------


def wire_input(messages: Sequence[MessageLike]) -> list[dict[str, object]]:
    """Toren's messages as Responses ``input`` items (one message may give several)."""
    items: list[dict[str, object]] = []
    for message in messages:
        role = require(message, "role")
        if role == "assistant":
            items += _wire_assistant(message)
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": str(require(message, "tool_call_id")),
                    "output": content_text(message.get("content")),
                }
            )
        else:
            items.append({"role": role, "content": message.get("content") or ""})
    return items


def _wire_assistant(message: MessageLike) -> list[dict[str, object]]:
    items: list[dict[str, object]] = []
    text = message.get("content")
    if text:
        items.append({"role": "assistant", "content": content_text(text)})
    for call in (ToolCall.from_dict(c) for c in message.get("tool_calls") or ()):
        items.append(
            {
                "type": "function_call",
                "call_id": call.id,
                "name": call.name,
                # A garbled call goes back with empty arguments (as on Chat Completions).
                "arguments": json.dumps(dict(call.arguments)),
            }
        )
    return items


def wire_tool(tool: ToolSpec) -> dict[str, object]:
    # strict: false, because a ToolSpec's schema is not necessarily one strict mode
    # accepts (every property required, no additionalProperties).
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": dict(tool.parameters),
        "strict": False,
    }


def wire_request(request: ModelRequest) -> dict[str, object]:
    kwargs: dict[str, object] = {"model": request.model, "input": wire_input(request.messages)}
    if request.tools:
        kwargs["tools"] = [wire_tool(t) for t in request.tools]
    params = sampling_params(request)
    if params:
        kwargs["extra_body"] = params
    return kwargs


# --- wire format: Responses -> Toren -------------------------------------------------

# Why a response stopped early (``incomplete_details.reason``), in Chat Completions'
# words, so a loop reads one vocabulary whichever API answered.
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


def _usage(usage: ResponseUsage | None) -> Usage:
    if usage is None:
        return Usage()
    return Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)


def parse_response(response: Response) -> ModelResponse:
    """Raises ``ValueError`` for a response that failed or is still in progress."""
    if response.status in ("failed", "cancelled", "queued", "in_progress"):
        error = response.error.message if response.error is not None else "no detail"
        raise ValueError(f"the response is {response.status!r}, not completed ({error})")
    text: list[str] = []
    calls: list[ToolCall] = []
    for item in response.output:
        if item.type == "message":
            for part in item.content:
                text.append(part.text if part.type == "output_text" else part.refusal)
        elif item.type == "function_call":
            calls.append(tool_call(item.call_id, item.name, item.arguments))
    if response.status == "incomplete":
        reason = response.incomplete_details.reason if response.incomplete_details else None
        finish = _INCOMPLETE.get(reason or "", reason or "incomplete")
    else:
        finish = "tool_calls" if calls else "stop"
    return ModelResponse(
        text="".join(text),
        tool_calls=tuple(calls),
        usage=_usage(response.usage),
        finish_reason=finish,
        model=response.model,
    )


class _InStreamError(Exception):
    """An ``error`` or ``response.failed`` event: the stream failed after it began."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.body = {"error": {"type": kind, "message": message}}


# --- the provider ----------------------------------------------------------------------


class OpenAIResponsesProvider(SdkProvider[openai.AsyncOpenAI]):
    """:class:`~toren.providers.base.ModelProvider` over the OpenAI Responses API.

    Takes the same settings as :class:`~toren.providers.openai.OpenAIProvider` (key and
    base URL from ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` when not given); the
    constructor (``client``, ``sleep``, ``rand``) is
    :class:`~toren.providers._sdk.SdkProvider`'s.
    """

    name = "openai-responses"
    errors = _ERRORS

    def _connect(
        self, api_key: str | None, base_url: str | None, timeout: float
    ) -> openai.AsyncOpenAI:
        return _client(api_key, base_url, timeout)

    def _wire(self, request: ModelRequest) -> dict[str, object]:
        return wire_request(request)

    async def _create(self, kwargs: Mapping[str, Any], attempt: Attempt) -> ModelResponse:
        raw = await self._client.responses.with_raw_response.create(**kwargs)
        response = parsed(lambda: _as_response(raw.parse()), status=raw.status_code)
        if response.usage is not None:
            attempt.used(_usage(response.usage))
        return parsed(lambda: parse_response(response), status=raw.status_code)

    async def _stream(
        self, kwargs: Mapping[str, Any], on_delta: DeltaCallback, attempt: Attempt
    ) -> ModelResponse:
        stream = await self._client.responses.create(**kwargs, stream=True)
        attempt.began()
        status = stream.response.status_code
        final: Response | None = None
        async with stream, aclosing(decoded(stream.__aiter__(), status=status)) as events:
            async for event in events:
                if event.type == "response.output_text.delta":
                    if event.delta:
                        on_delta(event.delta)
                elif event.type in ("response.completed", "response.incomplete"):
                    final = event.response
                    if final.usage is not None:
                        attempt.used(_usage(final.usage))
                elif event.type == "response.failed":
                    error = event.response.error
                    if event.response.usage is not None:
                        attempt.used(_usage(event.response.usage))
                    kind = error.code if error is not None else "response_failed"
                    detail = error.message if error is not None else "the response failed"
                    raise StreamBroken(_InStreamError(str(kind), detail))
                elif event.type == "error":
                    raise StreamBroken(_InStreamError(event.code or "error", event.message))
        return parsed(lambda: _finished(final), status=status)


def _finished(final: Response | None) -> ModelResponse:
    if final is None:
        # A proxy that cut the stream short: a truncated answer must not pass for one.
        raise ValueError("the stream ended before the model finished (no response.completed)")
    return parse_response(final)


def _as_response(value: object) -> Response:
    # A server that answers 200 with a non-JSON content type makes the SDK return a str.
    if not isinstance(value, Response):
        raise ValueError(f"expected a response object, got {type(value).__name__}")
    return value
