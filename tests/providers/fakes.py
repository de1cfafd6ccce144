"""Loopback fakes of the OpenAI (Chat Completions and Responses) and Anthropic HTTP APIs,
for driving the real SDKs.

The fakes speak the real wire formats (JSON bodies, SSE streams, error envelopes and
``Retry-After``), so a test exercises the official SDK end to end with nothing patched.
Each endpoint plays a script of replies in order and records every request it served::

    with serve_fake_models() as fake:
        fake.openai.script(Failure(429, retry_after="2"), Completion(text="hi"))
        provider = OpenAIProvider(api_key=FAKE_KEY, base_url=fake.openai_url)
        ...
        assert fake.openai.served == 2

A :class:`Completion` is one logical model reply; the endpoint renders it as a plain JSON
body or as an SSE stream, whichever the request asked for. Reusable outside this package
(e.g. an example agent pointed at ``openai:`` with ``OPENAI_BASE_URL=fake.openai_url``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

FAKE_KEY = "sk-test-SECRET-0123456789abcdef"


@dataclass(frozen=True)
class FakeToolCall:
    """A tool call of a reply. ``raw`` is arguments text as a model might write it (e.g.
    invalid JSON), sent verbatim instead of ``arguments``: as the OpenAI ``arguments``
    string and the Anthropic streamed ``partial_json``; a non-streamed Anthropic
    ``input`` is a JSON value, so it gets ``raw`` parsed, or as a string if it does not
    parse."""

    id: str
    name: str
    arguments: Mapping[str, Any]
    raw: str | None = None

    def text(self) -> str:
        return self.raw if self.raw is not None else json.dumps(self.arguments)

    def value(self) -> Any:
        if self.raw is None:
            return dict(self.arguments)
        try:
            return json.loads(self.raw)
        except ValueError:
            return self.raw


@dataclass(frozen=True)
class Break:
    """How a streamed reply goes wrong after ``after`` SSE events were sent (status 200
    and the headers are already out): ``"eof"`` ends the body cleanly, as a proxy that
    cuts a stream short does; ``"reset"`` drops the connection mid-body; ``"error"``
    sends the vendor's in-stream error event (``error_type`` as its type)."""

    after: int
    how: str = "eof"
    message: str = "the stream broke"
    error_type: str = "overloaded_error"


@dataclass(frozen=True, eq=False)
class Hold:
    """Stops a reply where a test wants it stopped, until :meth:`release`: before any byte
    of the answer (``after=None``: the request is on the wire, nothing answered yet), or
    after ``after`` SSE events of a streamed answer (the answer is half sent). ``reached``
    is set when the reply stops there, so a test acts at that moment and at no other (a
    worker killed while its call is held), never after a guessed delay. A client that
    goes away ends a held stream; a hold before the answer waits for :meth:`release`."""

    after: int | None = None
    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()

    async def wait(self) -> None:
        self.reached.set()
        while not self.released.is_set():
            await asyncio.sleep(0.01)


@dataclass(frozen=True)
class Completion:
    """A successful reply. ``chunk_size`` is how many characters of text (and of tool
    arguments JSON) go into each streamed delta; ``delay`` stalls before answering;
    ``pace`` stalls before each streamed event; ``broken`` spoils the stream; ``hold``
    stops it until the test releases it (see :class:`Hold`)."""

    text: str = ""
    tool_calls: tuple[FakeToolCall, ...] = ()
    input_tokens: int = 11
    output_tokens: int = 7
    chunk_size: int = 4
    delay: float = 0.0
    stop_reason: str | None = None
    pace: float = 0.0
    broken: Break | None = None
    # Parts of the prompt's input_tokens read from and written to the prompt cache.
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    hold: Hold | None = None


@dataclass(frozen=True)
class Failure:
    """An HTTP error in the vendor's error envelope."""

    status: int
    message: str = "fake failure"
    retry_after: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # e.g. x-should-retry


@dataclass(frozen=True)
class RawBody:
    """A verbatim body, e.g. malformed JSON with status 200."""

    body: str
    status: int = 200
    content_type: str = "application/json"


Reply = Completion | Failure | RawBody


@dataclass(frozen=True)
class RecordedRequest:
    body: dict[str, Any]
    headers: dict[str, str]


Renderer = Callable[[Completion, dict[str, Any]], Response]
ErrorEvent = Callable[[Break], str]


@dataclass
class FakeEndpoint:
    """One vendor endpoint: a script of replies, and a record of what it served."""

    name: str
    render: Renderer
    render_error: Callable[[Failure], dict[str, Any]]
    error_event: ErrorEvent
    requests: list[RecordedRequest] = field(default_factory=list)
    # Answers any request once the script is empty (many runs, many workers): called on
    # the server's thread with the request body as it arrives.
    responder: Callable[[dict[str, Any]], Reply] | None = None
    # What the vendor's API refuses whatever the script says (a 400, say): called with the
    # body and the headers; a Failure to answer with, or None.
    refuse: Callable[[dict[str, Any], Mapping[str, str]], Failure | None] | None = None
    _script: deque[Reply] = field(default_factory=deque)

    def script(self, *replies: Reply) -> None:
        self._script.extend(replies)

    @property
    def served(self) -> int:
        return len(self.requests)

    @property
    def last_body(self) -> dict[str, Any]:
        return self.requests[-1].body

    def reset(self) -> None:
        self._script.clear()
        self.requests.clear()

    async def handle(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(RecordedRequest(body=body, headers=dict(request.headers)))
        if self.refuse is not None and (refused := self.refuse(body, request.headers)):
            return self._error(refused)
        if not self._script and self.responder is not None:
            self._script.append(self.responder(body))
        if not self._script:
            # 418 is never retried, so an under-scripted test fails loudly, not slowly.
            return self._error(Failure(418, f"fake {self.name}: no scripted reply left"))
        reply = self._script.popleft()
        if isinstance(reply, Failure):
            return self._error(reply)
        if isinstance(reply, RawBody):
            return Response(reply.body, reply.status, media_type=reply.content_type)
        await asyncio.sleep(reply.delay)
        if reply.hold is not None and reply.hold.after is None:
            await reply.hold.wait()
        response = self.render(reply, body)
        if isinstance(response, _SseResponse):
            response.spoil(reply, self.error_event)
        return response

    def _error(self, failure: Failure) -> Response:
        headers = {"retry-after": failure.retry_after} if failure.retry_after else {}
        headers.update(failure.headers)
        return JSONResponse(self.render_error(failure), failure.status, headers=headers)


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


class _ConnectionDropped(Exception):
    """Ends a fake stream without finishing the HTTP response (see ``_SseResponse``)."""


class _SseResponse(StreamingResponse):
    """An SSE stream that can be paced and spoilt (see :class:`Break`)."""

    def __init__(self, events: Iterator[str]) -> None:
        self._events = events
        self._pace = 0.0
        self._hold: Hold | None = None
        self._break: Break | None = None
        self._error_event: ErrorEvent | None = None
        super().__init__(self._body(), media_type="text/event-stream")

    def spoil(self, reply: Completion, error_event: ErrorEvent) -> None:
        self._pace, self._break, self._error_event = reply.pace, reply.broken, error_event
        self._hold = reply.hold

    async def _body(self) -> AsyncIterator[bytes]:
        for sent, event in enumerate(self._events):
            if self._break is not None and sent == self._break.after:
                if self._break.how == "error":
                    assert self._error_event is not None
                    yield self._error_event(self._break).encode()
                elif self._break.how == "reset":
                    raise _ConnectionDropped
                return
            if self._hold is not None and sent == self._hold.after:
                await self._hold.wait()
            await asyncio.sleep(self._pace)
            yield event.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except _ConnectionDropped:
            # Returning without the final body message makes uvicorn close the
            # connection mid-body: the client sees an incomplete chunked response.
            return


def _sse(events: Iterator[str]) -> _SseResponse:
    return _SseResponse(events)


# --- OpenAI chat completions ---------------------------------------------------------


def _openai_finish(reply: Completion) -> str:
    return reply.stop_reason or ("tool_calls" if reply.tool_calls else "stop")


def _openai_usage(reply: Completion) -> dict[str, int]:
    total = reply.input_tokens + reply.output_tokens
    return {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": total,
    }


def _openai_json(reply: Completion, request: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.text()},
            }
            for c in reply.tool_calls
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": request["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": _openai_finish(reply),
                "logprobs": None,
            }
        ],
        "usage": _openai_usage(reply),
    }


def _openai_chunk(request: dict[str, Any], delta: dict[str, Any], finish: str | None) -> str:
    chunk = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": request["model"],
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(chunk)}\n\n"


def _openai_tool_deltas(reply: Completion) -> Iterator[dict[str, Any]]:
    for index, call in enumerate(reply.tool_calls):
        head = {"index": index, "id": call.id, "type": "function"}
        yield {"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]}
        for piece in _pieces(call.text(), reply.chunk_size):
            yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}


def _openai_events(reply: Completion, request: dict[str, Any]) -> Iterator[str]:
    yield _openai_chunk(request, {"role": "assistant", "content": ""}, None)
    for piece in _pieces(reply.text, reply.chunk_size):
        yield _openai_chunk(request, {"content": piece}, None)
    for delta in _openai_tool_deltas(reply):
        yield _openai_chunk(request, delta, None)
    yield _openai_chunk(request, {}, _openai_finish(reply))
    if (request.get("stream_options") or {}).get("include_usage"):
        usage = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": request["model"],
            "choices": [],
            "usage": _openai_usage(reply),
        }
        yield f"data: {json.dumps(usage)}\n\n"
    yield "data: [DONE]\n\n"


def render_openai(reply: Completion, request: dict[str, Any]) -> Response:
    if request.get("stream"):
        return _sse(_openai_events(reply, request))
    return JSONResponse(_openai_json(reply, request))


def openai_error(failure: Failure) -> dict[str, Any]:
    return {"error": {"message": failure.message, "type": "fake_error", "code": None}}


def openai_error_event(broken: Break) -> str:
    """What OpenAI sends when a stream fails after it began: an ``error`` object as data."""
    error = {"message": broken.message, "type": broken.error_type, "code": None}
    return f"data: {json.dumps({'error': error})}\n\n"


# --- OpenAI Responses ----------------------------------------------------------------


def _responses_usage(reply: Completion) -> dict[str, Any]:
    return {
        "input_tokens": reply.input_tokens,
        "input_tokens_details": {"cached_tokens": reply.cache_read_tokens},
        "output_tokens": reply.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }


def _responses_message(reply: Completion, status: str = "completed") -> dict[str, Any]:
    text = reply.text if status == "completed" else ""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [part] if status == "completed" else [],
    }


def _responses_call(index: int, call: FakeToolCall, status: str = "completed") -> dict[str, Any]:
    return {
        "id": f"fc_fake_{index}",
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.text() if status == "completed" else "",
        "status": status,
    }


def _responses_output(reply: Completion) -> list[dict[str, Any]]:
    output = [_responses_message(reply)] if reply.text or not reply.tool_calls else []
    return output + [_responses_call(i, c) for i, c in enumerate(reply.tool_calls)]


def _responses_json(
    reply: Completion, request: dict[str, Any], *, final: bool = True
) -> dict[str, Any]:
    """A Responses ``response`` object; ``stop_reason="length"`` makes it incomplete."""
    incomplete = reply.stop_reason == "length"
    status = ("incomplete" if incomplete else "completed") if final else "in_progress"
    return {
        "id": "resp_fake",
        "object": "response",
        "created_at": 1700000000,
        "model": request["model"],
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete and final else None,
        "instructions": request.get("instructions"),
        "metadata": {},
        "output": _responses_output(reply) if final else [],
        "parallel_tool_calls": True,
        "temperature": request.get("temperature"),
        "tool_choice": "auto",
        "tools": request.get("tools") or [],
        "top_p": None,
        "usage": _responses_usage(reply) if final else None,
    }


class _Sequenced:
    """Numbers the events of one Responses stream (``sequence_number``)."""

    def __init__(self) -> None:
        self.number = 0

    def __call__(self, kind: str, data: dict[str, Any]) -> str:
        event = {"type": kind, "sequence_number": self.number, **data}
        self.number += 1
        return f"event: {kind}\ndata: {json.dumps(event)}\n\n"


def _responses_events(reply: Completion, request: dict[str, Any]) -> Iterator[str]:
    event = _Sequenced()
    opening = _responses_json(reply, request, final=False)
    yield event("response.created", {"response": opening})
    yield event("response.in_progress", {"response": opening})
    index = 0
    if reply.text or not reply.tool_calls:
        yield from _responses_text_events(event, index, reply)
        index += 1
    for number, call in enumerate(reply.tool_calls):
        yield from _responses_call_events(event, index, number, call, reply.chunk_size)
        index += 1
    final = _responses_json(reply, request)
    kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield event(kind, {"response": final})


def _responses_text_events(event: _Sequenced, index: int, reply: Completion) -> Iterator[str]:
    where = {"item_id": "msg_fake", "output_index": index, "content_index": 0}
    yield event(
        "response.output_item.added",
        {"output_index": index, "item": _responses_message(reply, "in_progress")},
    )
    empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    yield event("response.content_part.added", {**where, "part": empty})
    for piece in _pieces(reply.text, reply.chunk_size):
        yield event("response.output_text.delta", {**where, "delta": piece, "logprobs": []})
    yield event("response.output_text.done", {**where, "text": reply.text, "logprobs": []})
    done = {**empty, "text": reply.text}
    yield event("response.content_part.done", {**where, "part": done})
    yield event(
        "response.output_item.done", {"output_index": index, "item": _responses_message(reply)}
    )


def _responses_call_events(
    event: _Sequenced, index: int, number: int, call: FakeToolCall, size: int
) -> Iterator[str]:
    item_id = f"fc_fake_{number}"
    yield event(
        "response.output_item.added",
        {"output_index": index, "item": _responses_call(number, call, "in_progress")},
    )
    where = {"item_id": item_id, "output_index": index}
    for piece in _pieces(call.text(), size):
        yield event("response.function_call_arguments.delta", {**where, "delta": piece})
    yield event("response.function_call_arguments.done", {**where, "arguments": call.text()})
    yield event(
        "response.output_item.done", {"output_index": index, "item": _responses_call(number, call)}
    )


def render_responses(reply: Completion, request: dict[str, Any]) -> Response:
    if request.get("stream"):
        return _sse(_responses_events(reply, request))
    return JSONResponse(_responses_json(reply, request))


def responses_error_event(broken: Break) -> str:
    """The Responses API's in-stream ``error`` event."""
    error = {"type": "error", "code": broken.error_type, "message": broken.message}
    return f"event: error\ndata: {json.dumps({**error, 'param': None, 'sequence_number': 0})}\n\n"


# --- Anthropic messages --------------------------------------------------------------


def _anthropic_stop(reply: Completion) -> str:
    return reply.stop_reason or ("tool_use" if reply.tool_calls else "end_turn")


def _anthropic_blocks(reply: Completion) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    for call in reply.tool_calls:
        tool_use = {"type": "tool_use", "id": call.id, "name": call.name}
        blocks.append({**tool_use, "input": call.value()})
    return blocks


def _anthropic_message(reply: Completion, request: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": request["model"],
        "content": _anthropic_blocks(reply),
        "stop_reason": _anthropic_stop(reply),
        "stop_sequence": None,
        "usage": {**_anthropic_input_usage(reply), "output_tokens": reply.output_tokens},
    }


def _anthropic_input_usage(reply: Completion) -> dict[str, int]:
    # The messages API counts cached prompt tokens apart from input_tokens.
    return {
        "input_tokens": reply.input_tokens - reply.cache_read_tokens - reply.cache_write_tokens,
        "cache_read_input_tokens": reply.cache_read_tokens,
        "cache_creation_input_tokens": reply.cache_write_tokens,
    }


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


def _anthropic_block_events(
    index: int, block: dict[str, Any], payload: str, size: int
) -> Iterator[str]:
    if block["type"] == "text":
        start, key, delta_type = {**block, "text": ""}, "text", "text_delta"
    else:
        start, key, delta_type = {**block, "input": {}}, "partial_json", "input_json_delta"
    yield _event("content_block_start", {"index": index, "content_block": start})
    for piece in _pieces(payload, size):
        delta = {"type": delta_type, key: piece}
        yield _event("content_block_delta", {"index": index, "delta": delta})
    yield _event("content_block_stop", {"index": index})


def _anthropic_events(reply: Completion, request: dict[str, Any]) -> Iterator[str]:
    message = _anthropic_message(reply, request)
    opening = {**message, "content": [], "stop_reason": None}
    opening["usage"] = {**_anthropic_input_usage(reply), "output_tokens": 1}
    yield _event("message_start", {"message": opening})
    yield _event("ping", {})
    payloads = ([reply.text] if reply.text else []) + [c.text() for c in reply.tool_calls]
    for index, (block, payload) in enumerate(zip(message["content"], payloads, strict=True)):
        yield from _anthropic_block_events(index, block, payload, reply.chunk_size)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": reply.output_tokens}
    yield _event("message_delta", {"delta": delta, "usage": usage})
    yield _event("message_stop", {})


def render_anthropic(reply: Completion, request: dict[str, Any]) -> Response:
    if request.get("stream"):
        return _sse(_anthropic_events(reply, request))
    return JSONResponse(_anthropic_message(reply, request))


def anthropic_refuses(body: dict[str, Any], headers: Mapping[str, str]) -> Failure | None:
    """The API since version 2026-10-21 (what the anthropic SDK 2.x sends) answers 400 to
    ``temperature``, ``top_k`` and ``top_p`` on every model; an older version in the
    request's ``anthropic-version`` header still takes them."""
    refused = [key for key in ("temperature", "top_k", "top_p") if key in body]
    if refused and headers.get("anthropic-version", "") >= "2026-10-21":
        return Failure(400, f"{', '.join(refused)}: not supported in this API version")
    return None


def anthropic_error(failure: Failure) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "fake_error", "message": failure.message}}


def anthropic_error_event(broken: Break) -> str:
    """Anthropic's in-stream ``error`` event (e.g. ``overloaded_error`` mid-answer)."""
    return _event("error", {"error": {"type": broken.error_type, "message": broken.message}})


# --- a provider's own rate limits -----------------------------------------------------


class ProviderLimit:
    """A responder (:attr:`FakeEndpoint.responder`) that enforces a provider's own limits,
    as a real one does: at most ``rpm`` requests and ``tpm`` tokens (the prompt's JSON
    characters / 4, plus ``output_tokens``) served in any sliding window of ``period``
    seconds, by arrival on the server's clock. A request over either is answered 429 with
    ``retry-after`` and counted in :attr:`over`; while a storm lasts (:meth:`storm`) every
    request is answered 429 and counted in :attr:`during_storm`. Runs on the server's
    thread."""

    def __init__(
        self,
        rpm: int | None = None,
        tpm: int | None = None,
        *,
        period: float = 60.0,
        retry_after: str = "1",
        output_tokens: int = 5,
    ) -> None:
        self.rpm, self.tpm, self.period = rpm, tpm, period
        self.retry_after = retry_after
        self.output_tokens = output_tokens
        self.window: deque[tuple[float, int]] = deque()
        self.served = 0  # answered 200
        self.over = 0  # answered 429 for being over the limit
        self.peak = 0  # the most requests served in one window
        self.peak_tokens = 0
        self.storm_until = 0.0
        self._storm = 0.0
        self.during_storm = 0  # requests that arrived during a storm
        self.arrivals: list[float] = []
        self._lock = threading.Lock()

    def storm(self, seconds: float) -> None:
        """Answer 429 to everything for ``seconds`` from the next request on."""
        with self._lock:
            self._storm = seconds

    def storming(self) -> bool:
        return time.monotonic() < self.storm_until

    def tokens_of(self, body: dict[str, Any]) -> int:
        """A prompt's tokens: its messages' JSON characters / 4, rounded up."""
        return -(-sum(len(json.dumps(m)) for m in body.get("messages", [])) // 4)

    def __call__(self, body: dict[str, Any]) -> Reply:
        now = time.monotonic()
        with self._lock:
            self.arrivals.append(now)
            if self._storm:
                self.storm_until, self._storm = now + self._storm, 0.0
            if now < self.storm_until:
                self.during_storm += 1
                return Failure(429, "storm: rate limited", retry_after=self.retry_after)
            while self.window and self.window[0][0] <= now - self.period:
                self.window.popleft()
            prompt = self.tokens_of(body)
            tokens = prompt + self.output_tokens
            used = sum(t for _, t in self.window)
            if (self.rpm is not None and len(self.window) >= self.rpm) or (
                self.tpm is not None and used + tokens > self.tpm
            ):
                self.over += 1
                return Failure(429, "rate limit reached", retry_after=self.retry_after)
            self.window.append((now, tokens))
            self.served += 1
            self.peak = max(self.peak, len(self.window))
            self.peak_tokens = max(self.peak_tokens, used + tokens)
            return Completion(text="ok", input_tokens=prompt, output_tokens=self.output_tokens)


# --- the server ----------------------------------------------------------------------


class FakeModelServer:
    """Both vendor APIs on one loopback port."""

    def __init__(self) -> None:
        self.openai = FakeEndpoint("openai", render_openai, openai_error, openai_error_event)
        self.responses = FakeEndpoint(
            "openai-responses", render_responses, openai_error, responses_error_event
        )
        self.anthropic = FakeEndpoint(
            "anthropic",
            render_anthropic,
            anthropic_error,
            anthropic_error_event,
            refuse=anthropic_refuses,
        )
        self.port = 0
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.openai.handle, methods=["POST"]),
                Route("/v1/responses", self.responses.handle, methods=["POST"]),
                Route("/v1/messages", self.anthropic.handle, methods=["POST"]),
            ]
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        """What OpenAI SDKs take as ``base_url`` (they append ``/chat/completions``, or
        ``/responses`` for the Responses API, served by :attr:`responses`)."""
        return f"{self.base_url}/v1"

    @property
    def anthropic_url(self) -> str:
        """What Anthropic SDKs take as ``base_url`` (they append ``/v1/messages``)."""
        return self.base_url

    def reset(self) -> None:
        self.openai.reset()
        self.responses.reset()
        self.anthropic.reset()


@contextmanager
def serve_fake_models() -> Iterator[FakeModelServer]:
    """Run a :class:`FakeModelServer` under uvicorn in a thread on 127.0.0.1, any port."""
    fake = FakeModelServer()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    fake.port = sock.getsockname()[1]
    # log_config=None: uvicorn must not reconfigure the test process's logging.
    config = uvicorn.Config(fake.app, lifespan="off", log_config=None, access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        _wait_started(server, thread)
        yield fake
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _wait_started(server: uvicorn.Server, thread: threading.Thread) -> None:
    for _ in range(500):
        if server.started:
            return
        if not thread.is_alive():
            break
        threading.Event().wait(0.01)
    raise RuntimeError("fake model server did not start")
