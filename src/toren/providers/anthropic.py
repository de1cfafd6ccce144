"""The Anthropic provider: the messages API through the official ``anthropic`` SDK.

Quirks of this API that the conversion absorbs:

- system messages become the top-level ``system`` parameter;
- turns must alternate, so consecutive messages of one role merge into one turn (tool
  results of one assistant turn all travel in the next user turn, as ``tool_result``
  blocks);
- ``max_tokens`` is required: 4096 unless ``request.params`` says otherwise;
- OpenAI's ``stop`` is spelt ``stop_sequences`` here; ``temperature``, ``top_k`` and
  ``top_p`` are refused before sending when the client sends API version 2026-10-21 or
  later (the SDK's default), which refuses them; other params pass through verbatim;
- ``usage.input_tokens`` leaves out the prompt-cache reads and writes, which Toren adds in.

Finish reasons are normalised to Toren's vocabulary (``stop``, ``tool_calls``,
``length``) so agent code need not know which vendor answered; others pass through.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import anthropic
from anthropic.types import Message as WireMessage
from anthropic.types import (
    RawContentBlockStartEvent,
    RawMessageDeltaEvent,
    RawMessageStreamEvent,
)
from anthropic.types import Usage as WireUsage

from toren.errors import InvalidInput, ProviderUnavailable
from toren.providers._retry import (
    Attempt,
    MalformedResponse,
    SdkErrors,
    decoded,
    parsed,
)
from toren.providers._sdk import SdkProvider
from toren.providers._wire import (
    ANTHROPIC_REFUSAL,
    ANTHROPIC_REFUSING_VERSION,
    anthropic_refused,
    content_text,
    require,
    sampling_params,
    tool_call,
    tool_call_from_value,
)
from toren.providers.base import (
    DeltaCallback,
    MessageLike,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
)

_ERRORS = SdkErrors(status=anthropic.APIStatusError, connection=anthropic.APIConnectionError)

DEFAULT_MAX_TOKENS = 4096

_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
}

Block = dict[str, object]


# --- wire format: Toren -> Anthropic -------------------------------------------------


def _text_blocks(content: object) -> list[Block]:
    if isinstance(content, list):
        return list(content)  # already Anthropic content blocks (images, documents, ...)
    text = content_text(content)
    # The API rejects empty text blocks.
    return [{"type": "text", "text": text}] if text else []


def _assistant_blocks(message: MessageLike) -> list[Block]:
    blocks = _text_blocks(message.get("content"))
    for call in (ToolCall.from_dict(c) for c in message.get("tool_calls") or ()):
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)}
        )
    return blocks


def _tool_result_block(message: MessageLike) -> Block:
    block: Block = {
        "type": "tool_result",
        "tool_use_id": str(require(message, "tool_call_id")),
        "content": content_text(message.get("content")),
    }
    if message.get("is_error"):
        block["is_error"] = True
    return block


def _turn(message: MessageLike) -> tuple[str, list[Block]]:
    role = require(message, "role")
    if role == "assistant":
        return "assistant", _assistant_blocks(message)
    if role == "tool":
        return "user", [_tool_result_block(message)]
    return str(role), _text_blocks(message.get("content"))


def wire_messages(messages: tuple[MessageLike, ...]) -> tuple[str | None, list[dict[str, object]]]:
    """Split out the system prompt and merge same-role neighbours into alternating turns."""
    system = [content_text(m.get("content")) for m in messages if m.get("role") == "system"]
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "system":
            continue
        role, blocks = _turn(message)
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return ("\n\n".join(system) if system else None), turns


def wire_tool(tool: ToolSpec) -> dict[str, object]:
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": dict(tool.parameters),
    }


def _params(request: ModelRequest) -> dict[str, object]:
    params = sampling_params(request)
    if "stop" in params:
        stop = params.pop("stop")
        params["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    return params


def _check_sampling(model: str, params: Mapping[str, object]) -> None:
    """Refuse the sampling settings the API refuses, before anything is sent: the call
    would fail with a 400 anyway, after the run had started; this says what to change."""
    refused = anthropic_refused(params)
    if refused:
        raise InvalidInput(
            f"the anthropic call to model {model!r} sets {', '.join(refused)}; "
            f"{ANTHROPIC_REFUSAL}. Leave them out (model_params in agent.yaml, or the "
            "params of ctx.model); max_tokens, stop and the other settings pass through."
        )


def wire_request(request: ModelRequest, *, api_version: str = "") -> dict[str, object]:
    """The SDK's keyword arguments for ``request``. ``api_version``: the
    ``anthropic-version`` the client sends (the SDK's default when empty)."""
    system, turns = wire_messages(request.messages)
    params = _params(request)
    if (api_version or ANTHROPIC_REFUSING_VERSION) >= ANTHROPIC_REFUSING_VERSION:
        _check_sampling(request.model, params)
    kwargs: dict[str, object] = {
        "model": request.model,
        "messages": turns,
        "max_tokens": params.pop("max_tokens", DEFAULT_MAX_TOKENS),
    }
    if system is not None:
        kwargs["system"] = system
    if request.tools:
        kwargs["tools"] = [wire_tool(t) for t in request.tools]
    if params:
        kwargs["extra_body"] = params
    return kwargs


# --- wire format: Anthropic -> Toren -------------------------------------------------


def parse_message(message: WireMessage) -> ModelResponse:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            calls.append(tool_call_from_value(block.id, block.name, block.input))
    reason = message.stop_reason or "end_turn"
    return ModelResponse(
        text="".join(texts),
        tool_calls=tuple(calls),
        usage=_usage(message.usage),
        finish_reason=_FINISH_REASONS.get(reason, reason),
        model=message.model,
    )


# The stream events that report usage: message_start the input (and the first output)
# tokens, each message_delta the running totals.
_USAGE_EVENTS = frozenset({"message_start", "message_delta"})


def _usage(usage: WireUsage) -> Usage:
    return Usage(_input_tokens(usage), usage.output_tokens)


def _input_tokens(usage: WireUsage) -> int:
    """The whole prompt, as OpenAI's ``prompt_tokens`` counts it: Anthropic reports the
    tokens read from and written to the prompt cache apart from ``input_tokens``. The
    price table then prices them all as input (an estimate: reads cost less, writes more)."""
    cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    return usage.input_tokens + cached


@dataclass
class _PartialBlock:
    type: str
    id: str = ""
    name: str = ""
    start_input: object = None
    parts: list[str] = field(default_factory=list)


@dataclass
class StreamAssembler:
    """Folds the raw events of a streamed message into the response a non-streaming call
    would have given.

    Tool inputs are decoded here, from the JSON text the model streamed, as OpenAI's
    are. The SDK's ``messages.stream()`` helper decodes them itself while streaming: it
    raises on input the model garbled (failing a call that was served and billed) or,
    parsing leniently, takes a valid prefix of it for the whole input.
    """

    blocks: dict[int, _PartialBlock] = field(default_factory=dict)
    usage: WireUsage | None = None
    stop_reason: str | None = None
    model: str = ""

    def add(self, event: RawMessageStreamEvent) -> str:
        """Take one event; return its text delta ("" if none)."""
        if event.type == "message_start":
            self.model = event.message.model
            self.usage = event.message.usage.model_copy()
        elif event.type == "content_block_start":
            return self._start(event)
        elif event.type == "content_block_delta":
            block = self.blocks.get(event.index)
            delta = event.delta
            if block is not None and block.type == "text" and delta.type == "text_delta":
                block.parts.append(delta.text)
                return delta.text
            if block is not None and block.type == "tool_use" and delta.type == "input_json_delta":
                block.parts.append(delta.partial_json)
        elif event.type == "message_delta":
            self.stop_reason = event.delta.stop_reason
            self._update_usage(event)
        return ""

    def _start(self, event: RawContentBlockStartEvent) -> str:
        content = event.content_block
        block = self.blocks[event.index] = _PartialBlock(content.type)
        if content.type == "tool_use":
            block.id, block.name, block.start_input = content.id, content.name, content.input
        elif content.type == "text" and content.text:
            block.parts.append(content.text)
            return content.text
        return ""

    def _update_usage(self, event: RawMessageDeltaEvent) -> None:
        # A message_delta's counts are running totals; the optional ones are left out
        # when message_start's still hold.
        usage, delta = self.usage, event.usage
        if usage is None:
            return
        usage.output_tokens = delta.output_tokens
        if delta.input_tokens is not None:
            usage.input_tokens = delta.input_tokens
        if delta.cache_read_input_tokens is not None:
            usage.cache_read_input_tokens = delta.cache_read_input_tokens
        if delta.cache_creation_input_tokens is not None:
            usage.cache_creation_input_tokens = delta.cache_creation_input_tokens

    def response(self) -> ModelResponse:
        """Raises ``ValueError`` for a stream that ended before ``message_delta`` gave the
        stop reason (a proxy that cut it short): a truncated answer must not pass for a
        whole one."""
        if self.stop_reason is None or self.usage is None:
            raise ValueError("the stream ended before the model finished (no stop_reason)")
        blocks = [b for _, b in sorted(self.blocks.items())]
        return ModelResponse(
            text="".join("".join(b.parts) for b in blocks if b.type == "text"),
            tool_calls=tuple(_streamed_call(b) for b in blocks if b.type == "tool_use"),
            usage=_usage(self.usage),
            finish_reason=_FINISH_REASONS.get(self.stop_reason, self.stop_reason),
            model=self.model,
        )


def _streamed_call(block: _PartialBlock) -> ToolCall:
    if block.parts:
        return tool_call(block.id, block.name, "".join(block.parts))
    return tool_call_from_value(block.id, block.name, block.start_input or {})


def _as_message(value: object) -> WireMessage:
    # A server that answers 200 with a non-JSON content type makes the SDK return a str.
    if not isinstance(value, WireMessage):
        raise ValueError(f"expected a message, got {type(value).__name__}")
    return value


# --- client and credentials ----------------------------------------------------------


def _client(api_key: str | None, base_url: str | None, timeout: float) -> anthropic.AsyncAnthropic:
    key = api_key or os.environ.get("ANTHROPIC_API_KEY")
    if not key:
        raise ProviderUnavailable(
            "no Anthropic API key — set ANTHROPIC_API_KEY or `api_key_env` "
            "(providers.anthropic.api_key_env) in agent.yaml",
            provider="anthropic",
        )
    url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
    # max_retries=0: Toren's retry loop is the only one, so the policy means what it says.
    return anthropic.AsyncAnthropic(api_key=key, base_url=url, timeout=timeout, max_retries=0)


class AnthropicProvider(SdkProvider[anthropic.AsyncAnthropic]):
    """:class:`~toren.providers.base.ModelProvider` over the Anthropic messages API; the
    constructor (``client``, ``sleep``, ``rand``) is
    :class:`~toren.providers._sdk.SdkProvider`'s."""

    name = "anthropic"
    errors = _ERRORS

    def _connect(
        self, api_key: str | None, base_url: str | None, timeout: float
    ) -> anthropic.AsyncAnthropic:
        return _client(api_key, base_url, timeout)

    @functools.cached_property
    def _api_version(self) -> str:
        """The ``anthropic-version`` the client sends (its headers folded case-insensitively,
        the last one winning, as the SDK does): a client given with an older one
        (``client=``) still takes the sampling settings the newer versions refuse."""
        headers = {k.lower(): v for k, v in self._client.default_headers.items()}
        version = headers.get("anthropic-version")
        return version if isinstance(version, str) else ""

    def _wire(self, request: ModelRequest) -> dict[str, object]:
        return wire_request(request, api_version=self._api_version)

    async def _create(self, kwargs: Mapping[str, Any], attempt: Attempt) -> ModelResponse:
        raw = await self._client.messages.with_raw_response.create(**kwargs)
        try:
            message = _as_message(await raw.parse())
        except ValueError as exc:
            raise MalformedResponse(str(exc), status=raw.status_code) from exc
        attempt.used(_usage(message.usage))
        return parsed(lambda: parse_message(message), status=raw.status_code)

    async def _stream(
        self, kwargs: Mapping[str, Any], on_delta: DeltaCallback, attempt: Attempt
    ) -> ModelResponse:
        stream = await self._client.messages.create(**kwargs, stream=True)
        attempt.began()
        status = stream.response.status_code
        assembler = StreamAssembler()
        async with stream, aclosing(decoded(stream.__aiter__(), status=status)) as events:
            async for event in events:
                if delta := assembler.add(event):
                    on_delta(delta)
                if event.type in _USAGE_EVENTS and assembler.usage is not None:
                    attempt.used(_usage(assembler.usage))
        return parsed(assembler.response, status=status)
