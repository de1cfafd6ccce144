"""OpenAIProvider: Toren's message format on the chat-completions wire, both ways."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import openai
import pytest

from toren.errors import InvalidInput, ModelCallFailed, ProviderUnavailable
from toren.providers.base import ModelProvider, ModelRequest, ModelResponse, ToolCall
from toren.providers.openai import OpenAIProvider, wire_message

from .conftest import LOOKUP, SleepRecorder, conversation, on_openai_wire
from .fakes import (
    FAKE_KEY,
    Break,
    Completion,
    Failure,
    FakeModelServer,
    FakeToolCall,
    RawBody,
)

CONVERSATION = conversation("")


@pytest.fixture
async def provider(
    fake_models: FakeModelServer, sleeps: SleepRecorder
) -> AsyncIterator[OpenAIProvider]:
    async for provider in on_openai_wire(OpenAIProvider, fake_models, sleeps):
        yield provider


def request(**params: object) -> ModelRequest:
    return ModelRequest("openai", "gpt-4o-mini", CONVERSATION, (LOOKUP,), params)


async def test_request_is_sent_in_the_chat_completions_wire_format(
    provider: OpenAIProvider, fake_models: FakeModelServer
) -> None:
    fake_models.openai.script(Completion(text="It shipped."))

    await provider.complete(request())

    sent = fake_models.openai.requests[0]
    assert sent.headers["authorization"] == f"Bearer {FAKE_KEY}"
    assert sent.body["model"] == "gpt-4o-mini"
    assert sent.body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Where is A-17?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "lookup_order", "arguments": '{"order_id": "A-17"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "sent"}'},
    ]
    assert sent.body["tools"] == [{"type": "function", "function": LOOKUP.to_dict()}]


async def test_params_pass_through_but_transport_settings_do_not(
    provider: OpenAIProvider, fake_models: FakeModelServer
) -> None:
    fake_models.openai.script(Completion(text="ok"))
    params = {"temperature": 0.2, "max_tokens": 50, "top_p": 0.9, "stop": ["\n\n"], "seed": 7}

    await provider.complete(request(**params, reasoning_effort="low", timeout=1, stream=True))

    body = fake_models.openai.last_body
    assert {k: body[k] for k in params} == params
    assert body["reasoning_effort"] == "low"
    assert "timeout" not in body
    assert "stream" not in body


async def test_response_is_parsed(provider: OpenAIProvider, fake_models: FakeModelServer) -> None:
    call = FakeToolCall("call_9", "lookup_order", {"order_id": "B-2"})
    fake_models.openai.script(Completion(text="Checking.", tool_calls=(call,), input_tokens=30))

    response = await provider.complete(request())

    assert response.text == "Checking."
    assert response.tool_calls == (ToolCall("call_9", "lookup_order", {"order_id": "B-2"}),)
    assert response.usage.input_tokens == 30
    assert response.usage.output_tokens == 7
    assert response.finish_reason == "tool_calls"
    assert response.model == "gpt-4o-mini"
    assert response.message() == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [{"id": "call_9", "name": "lookup_order", "arguments": {"order_id": "B-2"}}],
    }


async def test_streaming_asks_for_usage(
    provider: OpenAIProvider, fake_models: FakeModelServer
) -> None:
    fake_models.openai.script(Completion(text="hi", input_tokens=3, output_tokens=1))

    response = await provider.complete(request(), on_delta=lambda _: None)

    assert fake_models.openai.last_body["stream_options"] == {"include_usage": True}
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 1)


async def test_length_finish_reason_passes_through(
    provider: OpenAIProvider, fake_models: FakeModelServer
) -> None:
    fake_models.openai.script(Completion(text="trunc", stop_reason="length"))

    assert (await provider.complete(request())).finish_reason == "length"


async def test_key_and_base_url_fall_back_to_the_environment_at_construction(
    fake_models: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", fake_models.openai_url)
    provider = OpenAIProvider()
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # too late to matter
    fake_models.openai.script(Completion(text="from env"))
    try:
        response = await provider.complete(request())
    finally:
        await provider.aclose()

    assert response.text == "from env"
    assert isinstance(provider, ModelProvider)


def test_missing_key_is_provider_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)

    with pytest.raises(ProviderUnavailable, match="OPENAI_API_KEY"):
        OpenAIProvider()


async def test_local_server_needs_no_key(
    fake_models: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    provider = OpenAIProvider(base_url=fake_models.openai_url)
    fake_models.openai.script(Completion(text="local"))
    try:
        assert (await provider.complete(request())).text == "local"
    finally:
        await provider.aclose()


async def test_injected_client_has_its_retries_switched_off(
    fake_models: FakeModelServer, sleeps: SleepRecorder
) -> None:
    client = openai.AsyncOpenAI(api_key=FAKE_KEY, base_url=fake_models.openai_url, max_retries=5)
    provider = OpenAIProvider(client=client, sleep=sleeps)
    fake_models.openai.script(*[Failure(500)] * 4)
    try:
        with pytest.raises(ModelCallFailed, match="HTTP 500"):
            await provider.complete(request())
        await provider.aclose()
        assert not client.is_closed()  # not ours to close
    finally:
        await client.close()

    # Toren's 4 attempts, not 4 x (1 + 5) SDK retries.
    assert fake_models.openai.served == 4


def test_tool_arguments_survive_a_json_round_trip() -> None:
    message = {
        "role": "assistant",
        "content": "x",
        "tool_calls": [{"id": "c", "name": "f", "arguments": {"q": "ü", "n": [1, 2]}}],
    }
    wire = wire_message(message)
    assert json.loads(wire["tool_calls"][0]["function"]["arguments"]) == {"q": "ü", "n": [1, 2]}
    assert wire["content"] == "x"


async def test_a_garbled_tool_call_goes_back_with_empty_arguments(
    provider: OpenAIProvider, fake_models: FakeModelServer
) -> None:
    # OpenAI itself takes invalid JSON back, but vLLM and some gateways answer 400 to a
    # history that holds it, which would fail every later turn of the run. The tool
    # message tells the model what it wrote.
    garbled = ToolCall(
        "c9", "lookup_order", {}, arguments_error="not valid JSON", raw_arguments="{"
    )
    history = (
        {"role": "user", "content": "Where is A-17?"},
        ModelResponse("", (garbled,), finish_reason="tool_calls").message(),
        {"role": "tool", "tool_call_id": "c9", "content": "error: not valid JSON"},
    )
    fake_models.openai.script(Completion(text="ok"))

    await provider.complete(ModelRequest("openai", "gpt-4o-mini", history, (LOOKUP,)))

    sent = fake_models.openai.last_body["messages"][1]
    assert sent["tool_calls"][0]["function"] == {"name": "lookup_order", "arguments": "{}"}


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("n", [3, 0, True, "2"])
async def test_n_other_than_1_is_refused_before_anything_is_sent(
    provider: OpenAIProvider, fake_models: FakeModelServer, streamed: bool, n: object
) -> None:
    # n=3 is billed as three answers; a model call records one (a stream would even mix
    # the three into one text). Refused, not silently cut down to the first choice.
    fake_models.openai.script(Completion(text="never"))

    with pytest.raises(InvalidInput) as caught:
        await provider.complete(request(n=n), on_delta=(lambda _: None) if streamed else None)

    message = str(caught.value)
    assert f"n={n!r}" in message
    assert "n must be 1" in message
    assert "'gpt-4o-mini'" in message
    assert fake_models.openai.served == 0


@pytest.mark.parametrize("n", [1, None])
async def test_n_of_1_passes_through(
    provider: OpenAIProvider, fake_models: FakeModelServer, n: int | None
) -> None:
    fake_models.openai.script(Completion(text="one"))

    assert (await provider.complete(request(n=n), on_delta=lambda _: None)).text == "one"
    assert fake_models.openai.last_body["n"] == n


async def test_a_stream_reads_only_the_first_choice(
    provider: OpenAIProvider, fake_models: FakeModelServer
) -> None:
    # A server that streams several choices anyway (a gateway's own default n, say):
    # their chunks interleave, each choice with its index.
    def chunk(index: int, delta: dict[str, object], finish: str | None = None) -> str:
        choice = {"index": index, "delta": delta, "finish_reason": finish}
        body = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        return f"data: {json.dumps({**body, 'choices': [choice]})}\n\n"

    events = [
        chunk(0, {"role": "assistant", "content": "Hel"}),
        chunk(1, {"role": "assistant", "content": "Bon"}),
        chunk(1, {"content": "jour"}),
        chunk(0, {"content": "lo"}),
        chunk(1, {}, "length"),
        chunk(0, {}, "stop"),
        "data: [DONE]\n\n",
    ]
    fake_models.openai.script(RawBody("".join(events), content_type="text/event-stream"))
    deltas: list[str] = []

    response = await provider.complete(request(), on_delta=deltas.append)

    assert (response.text, response.finish_reason) == ("Hello", "stop")
    assert deltas == ["Hel", "lo"]


@pytest.mark.parametrize("how", ["reset", "error"])
async def test_a_stream_that_fails_after_its_usage_chunk_keeps_that_usage(
    provider: OpenAIProvider, fake_models: FakeModelServer, how: str
) -> None:
    # The usage chunk came (so the answer is billed), then the stream failed before its
    # [DONE]: the failure must carry the usage for cost accounting and budgets.
    broken = Break(after=5, how=how)
    fake_models.openai.script(
        Completion(text="abcdefgh", input_tokens=30, output_tokens=2, broken=broken)
    )

    with pytest.raises(ModelCallFailed) as caught:
        await provider.complete(request(), on_delta=lambda _: None)

    assert caught.value.details["usage"] == {"input_tokens": 30, "output_tokens": 2}
    assert "30 input and 2 output tokens" in str(caught.value)


async def test_a_stream_that_fails_before_any_usage_reports_none(
    provider: OpenAIProvider, fake_models: FakeModelServer
) -> None:
    fake_models.openai.script(Completion(text="abcdefgh", broken=Break(after=2, how="reset")))

    with pytest.raises(ModelCallFailed) as caught:
        await provider.complete(request(), on_delta=lambda _: None)

    assert "usage" not in caught.value.details
