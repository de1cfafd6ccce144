"""OpenAIResponsesProvider: Toren's message format on the Responses wire, both ways,
through the official ``openai`` SDK against the loopback server (``fakes.py``).

Retries, broken streams and tool-argument mistakes are covered for this provider by the
``vendor`` fixture of ``test_retries.py`` (it runs every vendor test on it too)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from toren.agents.pricing import cost
from toren.errors import ModelCallFailed
from toren.providers.base import ModelRequest, ModelResponse, ToolCall, Usage
from toren.providers.openai_responses import OpenAIResponsesProvider, wire_input
from toren.providers.registry import build_provider, parse_model_ref

from .conftest import LOOKUP, SleepRecorder, conversation, on_openai_wire
from .fakes import FAKE_KEY, Break, Completion, FakeModelServer, FakeToolCall, RawBody

CONVERSATION = conversation("Let me look.")


@pytest.fixture
async def provider(
    fake_models: FakeModelServer, sleeps: SleepRecorder
) -> AsyncIterator[OpenAIResponsesProvider]:
    async for provider in on_openai_wire(OpenAIResponsesProvider, fake_models, sleeps):
        yield provider


def request(**params: object) -> ModelRequest:
    return ModelRequest("openai-responses", "gpt-4.1", CONVERSATION, (LOOKUP,), params)


async def test_request_is_sent_in_the_responses_wire_format(
    provider: OpenAIResponsesProvider, fake_models: FakeModelServer
) -> None:
    fake_models.responses.script(Completion(text="It shipped."))

    await provider.complete(request())

    assert fake_models.openai.served == 0  # not Chat Completions
    sent = fake_models.responses.requests[0]
    assert sent.headers["authorization"] == f"Bearer {FAKE_KEY}"
    assert sent.body["model"] == "gpt-4.1"
    assert sent.body["input"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Where is A-17?"},
        {"role": "assistant", "content": "Let me look."},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "lookup_order",
            "arguments": '{"order_id": "A-17"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": '{"status": "sent"}'},
    ]
    assert sent.body["tools"] == [
        {
            "type": "function",
            "name": "lookup_order",
            "description": "Find an order.",
            "parameters": LOOKUP.parameters,
            "strict": False,
        }
    ]
    # Stateless: Toren's log holds the conversation, never OpenAI's stored response.
    assert "previous_response_id" not in sent.body


async def test_params_pass_through_verbatim_but_transport_settings_do_not(
    provider: OpenAIResponsesProvider, fake_models: FakeModelServer
) -> None:
    fake_models.responses.script(Completion(text="ok"))
    params = {"max_output_tokens": 50, "reasoning": {"effort": "low"}, "store": False}

    await provider.complete(request(**params, timeout=1, stream=True))

    body = fake_models.responses.last_body
    assert {k: body[k] for k in params} == params
    assert "timeout" not in body
    assert "stream" not in body


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
async def test_response_is_parsed(
    provider: OpenAIResponsesProvider, fake_models: FakeModelServer, streamed: bool
) -> None:
    calls = (
        FakeToolCall("call_9", "lookup_order", {"order_id": "B-2"}),
        FakeToolCall("call_10", "lookup_order", {"order_id": "B-3"}),
    )
    fake_models.responses.script(
        Completion(text="Checking both.", tool_calls=calls, input_tokens=30, chunk_size=3)
    )
    deltas: list[str] = []

    response = await provider.complete(request(), on_delta=deltas.append if streamed else None)

    assert response == ModelResponse(
        text="Checking both.",
        tool_calls=(
            ToolCall("call_9", "lookup_order", {"order_id": "B-2"}),
            ToolCall("call_10", "lookup_order", {"order_id": "B-3"}),
        ),
        usage=Usage(30, 7),
        finish_reason="tool_calls",
        model="gpt-4.1",
    )
    if streamed:
        assert fake_models.responses.last_body["stream"] is True
        assert deltas == ["Che", "cki", "ng ", "bot", "h."]


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
async def test_an_incomplete_response_finishes_with_length(
    provider: OpenAIResponsesProvider, fake_models: FakeModelServer, streamed: bool
) -> None:
    fake_models.responses.script(Completion(text="trunc", stop_reason="length"))

    response = await provider.complete(request(), on_delta=(lambda _: None) if streamed else None)

    assert (response.finish_reason, response.usage) == ("length", Usage(11, 7))


async def test_a_failed_response_event_is_a_broken_stream_with_its_usage(
    provider: OpenAIResponsesProvider, fake_models: FakeModelServer
) -> None:
    failed = {
        "id": "resp_x",
        "object": "response",
        "created_at": 1,
        "model": "gpt-4.1",
        "status": "failed",
        "error": {"code": "server_error", "message": "the model crashed"},
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 40,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 3,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 43,
        },
    }
    event = {"type": "response.failed", "sequence_number": 0, "response": failed}
    body = f"event: response.failed\ndata: {json.dumps(event)}\n\n"
    fake_models.responses.script(RawBody(body, content_type="text/event-stream"))

    with pytest.raises(ModelCallFailed) as caught:
        await provider.complete(request(), on_delta=lambda _: None)

    assert "server_error: the model crashed" in str(caught.value)
    assert caught.value.details["usage"] == {"input_tokens": 40, "output_tokens": 3}
    assert fake_models.responses.served == 1  # begun, so never retried


async def test_a_stream_cut_after_its_text_is_not_a_whole_answer(
    provider: OpenAIResponsesProvider, fake_models: FakeModelServer
) -> None:
    # Every text delta arrived, then a proxy ended the body before response.completed.
    fake_models.responses.script(Completion(text="abcdefgh", broken=Break(after=8, how="eof")))

    with pytest.raises(ModelCallFailed, match="no response.completed"):
        await provider.complete(request(), on_delta=lambda _: None)
    assert fake_models.responses.served == 1


def test_the_model_reference_selects_the_api() -> None:
    assert parse_model_ref("openai-responses:gpt-4.1") == ("openai-responses", "gpt-4.1")
    provider = build_provider("openai-responses", api_key=FAKE_KEY)
    assert isinstance(provider, OpenAIResponsesProvider)


def test_costs_are_priced_as_the_same_openai_model() -> None:
    usage = Usage(1_000_000, 1_000_000)
    assert cost("openai-responses:gpt-4.1", usage) == cost("openai:gpt-4.1", usage)
    assert cost("openai-responses:gpt-4.1", usage) == Decimal("10.00")


def test_an_assistant_message_without_text_sends_only_its_calls() -> None:
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c", "name": "f", "arguments": {"q": "ü"}}],
    }
    (item,) = wire_input([message])
    assert item["type"] == "function_call"
    assert json.loads(item["arguments"]) == {"q": "ü"}
