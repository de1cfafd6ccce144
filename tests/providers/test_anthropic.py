"""AnthropicProvider: Toren's message format on the messages-API wire, both ways."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anthropic
import pytest

from toren.errors import InvalidInput, ModelCallFailed, ProviderUnavailable
from toren.providers.anthropic import DEFAULT_MAX_TOKENS, AnthropicProvider
from toren.providers.base import ModelProvider, ModelRequest, ModelResponse, ToolCall, ToolSpec

from .conftest import SleepRecorder, no_jitter
from .fakes import FAKE_KEY, Break, Completion, Failure, FakeModelServer, FakeToolCall

LOOKUP = ToolSpec(
    name="lookup_order",
    description="Find an order.",
    parameters={"type": "object", "properties": {"order_id": {"type": "string"}}},
)

CONVERSATION = (
    {"role": "system", "content": "You are terse."},
    {"role": "system", "content": "Answer in English."},
    {"role": "user", "content": "Where are A-17 and B-2?"},
    {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {"id": "t1", "name": "lookup_order", "arguments": {"order_id": "A-17"}},
            {"id": "t2", "name": "lookup_order", "arguments": {"order_id": "B-2"}},
        ],
    },
    {"role": "tool", "tool_call_id": "t1", "name": "lookup_order", "content": "sent"},
    {"role": "tool", "tool_call_id": "t2", "content": {"error": "no such order"}, "is_error": True},
    {"role": "user", "content": "And?"},
)


@pytest.fixture
async def provider(
    fake_models: FakeModelServer, sleeps: SleepRecorder
) -> AsyncIterator[AnthropicProvider]:
    provider = AnthropicProvider(
        api_key=FAKE_KEY, base_url=fake_models.anthropic_url, sleep=sleeps, rand=no_jitter
    )
    yield provider
    await provider.aclose()


def request(**params: object) -> ModelRequest:
    return ModelRequest("anthropic", "claude-x", CONVERSATION, (LOOKUP,), params)


async def test_request_is_sent_in_the_messages_wire_format(
    provider: AnthropicProvider, fake_models: FakeModelServer
) -> None:
    fake_models.anthropic.script(Completion(text="A-17 shipped."))

    await provider.complete(request())

    sent = fake_models.anthropic.requests[0]
    # Older SDKs send x-api-key, newer ones a bearer token.
    bearer = sent.headers.get("authorization", "").removeprefix("Bearer ")
    assert FAKE_KEY in (sent.headers.get("x-api-key"), bearer)
    assert sent.body["system"] == "You are terse.\n\nAnswer in English."
    assert sent.body["max_tokens"] == DEFAULT_MAX_TOKENS
    assert sent.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Where are A-17 and B-2?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {
                    "type": "tool_use",
                    "id": "t1",
                    "name": "lookup_order",
                    "input": {"order_id": "A-17"},
                },
                {
                    "type": "tool_use",
                    "id": "t2",
                    "name": "lookup_order",
                    "input": {"order_id": "B-2"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "sent"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": '{"error": "no such order"}',
                    "is_error": True,
                },
                {"type": "text", "text": "And?"},
            ],
        },
    ]
    assert sent.body["tools"] == [
        {
            "name": "lookup_order",
            "description": "Find an order.",
            "input_schema": dict(LOOKUP.parameters),
        }
    ]


async def test_params_pass_through_with_anthropic_spelling(
    provider: AnthropicProvider, fake_models: FakeModelServer
) -> None:
    fake_models.anthropic.script(Completion(text="ok"))

    await provider.complete(request(max_tokens=99, metadata={"user_id": "u1"}, stop="END"))

    body = fake_models.anthropic.last_body
    assert body["max_tokens"] == 99
    assert body["metadata"] == {"user_id": "u1"}
    assert body["stop_sequences"] == ["END"]
    assert "stop" not in body


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize(
    "params", [{"temperature": 0.1}, {"top_k": 5}, {"top_p": 0.9, "temperature": 0}]
)
async def test_sampling_settings_the_api_refuses_are_refused_before_anything_is_sent(
    provider: AnthropicProvider,
    fake_models: FakeModelServer,
    streamed: bool,
    params: dict[str, object],
) -> None:
    # The API (version 2026-10-21, what the SDK sends) answers them with a 400 on every
    # model; the loopback server does too (tests/providers/fakes.py). Refused here first,
    # with what to change, rather than sent.
    fake_models.anthropic.script(Completion(text="never"))

    with pytest.raises(InvalidInput) as caught:
        await provider.complete(request(**params), on_delta=(lambda _: None) if streamed else None)

    message = str(caught.value)
    assert all(key in message for key in params)
    assert "2026-10-21" in message and "Leave them out" in message
    assert fake_models.anthropic.served == 0


async def test_a_client_pinned_to_an_older_api_version_still_sends_temperature(
    fake_models: FakeModelServer,
) -> None:
    # The refusal follows the version the client sends: a client given with an older
    # ``anthropic-version`` (``client=``) keeps the settings that version takes.
    client = anthropic.AsyncAnthropic(
        api_key=FAKE_KEY,
        base_url=fake_models.anthropic_url,
        default_headers={"anthropic-version": "2023-06-01"},
    )
    provider = AnthropicProvider(client=client)
    fake_models.anthropic.script(Completion(text="ok"))
    try:
        response = await provider.complete(request(temperature=0.1, top_k=5))
    finally:
        await provider.aclose()
        await client.close()
    assert response.text == "ok"
    assert fake_models.anthropic.last_body["temperature"] == 0.1
    assert fake_models.anthropic.last_body["top_k"] == 5


@pytest.mark.parametrize("version", [None, "2023-06-01"])
async def test_the_loopback_server_refuses_temperature_as_the_api_does(
    fake_models: FakeModelServer, version: str | None
) -> None:
    # The fake keeps the API's rule (the tests above rely on it): a 400 under the version
    # the SDK sends, accepted under an older one a client asks for.
    headers = {"anthropic-version": version} if version else None
    client = anthropic.AsyncAnthropic(
        api_key=FAKE_KEY, base_url=fake_models.anthropic_url, default_headers=headers
    )
    fake_models.anthropic.script(Completion(text="ok"))
    call = client.messages.create(
        model="claude-x",
        max_tokens=10,
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"temperature": 0.1},
    )
    try:
        if version is None:
            with pytest.raises(anthropic.BadRequestError, match="temperature"):
                await call
        else:
            assert (await call).content[0].text == "ok"  # type: ignore[union-attr]
    finally:
        await client.close()


async def test_response_is_parsed(
    provider: AnthropicProvider, fake_models: FakeModelServer
) -> None:
    call = FakeToolCall("toolu_1", "lookup_order", {"order_id": "A-17"})
    fake_models.anthropic.script(Completion(text="Checking.", tool_calls=(call,)))

    response = await provider.complete(request())

    assert response.text == "Checking."
    assert response.tool_calls == (ToolCall("toolu_1", "lookup_order", {"order_id": "A-17"}),)
    assert (response.usage.input_tokens, response.usage.output_tokens) == (11, 7)
    assert response.finish_reason == "tool_calls"
    assert response.model == "claude-x"


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [("end_turn", "stop"), ("max_tokens", "length"), ("refusal", "refusal")],
)
async def test_stop_reasons_are_normalised(
    provider: AnthropicProvider,
    fake_models: FakeModelServer,
    stop_reason: str,
    finish_reason: str,
) -> None:
    fake_models.anthropic.script(Completion(text="x", stop_reason=stop_reason))

    assert (await provider.complete(request())).finish_reason == finish_reason


async def test_overloaded_529_is_retried(
    provider: AnthropicProvider, fake_models: FakeModelServer, sleeps: SleepRecorder
) -> None:
    fake_models.anthropic.script(Failure(529, "Overloaded"), Completion(text="ok"))

    assert (await provider.complete(request())).text == "ok"
    assert sleeps.delays == [0.5]
    assert fake_models.anthropic.served == 2


async def test_key_and_base_url_fall_back_to_the_environment(
    fake_models: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_models.anthropic_url)
    provider = AnthropicProvider()
    fake_models.anthropic.script(Completion(text="from env"))
    try:
        assert (await provider.complete(request())).text == "from env"
    finally:
        await provider.aclose()
    assert isinstance(provider, ModelProvider)


def test_missing_key_is_provider_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)

    with pytest.raises(ProviderUnavailable, match="ANTHROPIC_API_KEY"):
        AnthropicProvider()


async def test_injected_client_has_its_retries_switched_off(
    fake_models: FakeModelServer, sleeps: SleepRecorder
) -> None:
    client = anthropic.AsyncAnthropic(
        api_key=FAKE_KEY, base_url=fake_models.anthropic_url, max_retries=5
    )
    provider = AnthropicProvider(client=client, sleep=sleeps)
    fake_models.anthropic.script(*[Failure(503)] * 4)
    try:
        with pytest.raises(ModelCallFailed, match="HTTP 503"):
            await provider.complete(request())
    finally:
        await client.close()

    assert fake_models.anthropic.served == 4


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
async def test_cached_prompt_tokens_count_as_input_tokens(
    provider: AnthropicProvider, fake_models: FakeModelServer, streamed: bool
) -> None:
    # Anthropic reports cache reads and writes apart from input_tokens; left out, a
    # cached 50,000-token prompt would be recorded (and budgeted) as 100 tokens.
    fake_models.anthropic.script(
        Completion(
            text="ok", input_tokens=50_100, cache_read_tokens=40_000, cache_write_tokens=10_000
        )
    )
    on_delta = (lambda _: None) if streamed else None

    response = await provider.complete(request(), on_delta=on_delta)

    assert response.usage.input_tokens == 50_100


async def test_a_garbled_tool_call_goes_back_with_empty_input(
    provider: AnthropicProvider, fake_models: FakeModelServer
) -> None:
    # The messages API takes only an object as a tool_use input.
    garbled = ToolCall(
        "t9", "lookup_order", {}, arguments_error="not valid JSON", raw_arguments="{"
    )
    history = (
        {"role": "user", "content": "Where is A-17?"},
        ModelResponse("", (garbled,), finish_reason="tool_calls").message(),
        {
            "role": "tool",
            "tool_call_id": "t9",
            "content": "error: not valid JSON",
            "is_error": True,
        },
    )
    fake_models.anthropic.script(Completion(text="ok"))

    await provider.complete(ModelRequest("anthropic", "claude-x", history, (LOOKUP,)))

    sent = fake_models.anthropic.last_body["messages"][1]
    assert sent["content"] == [
        {"type": "tool_use", "id": "t9", "name": "lookup_order", "input": {}}
    ]


@pytest.mark.parametrize(
    ("broken", "usage"),
    [
        (Break(after=3, how="reset"), {"input_tokens": 50_100, "output_tokens": 1}),
        (Break(after=4, how="error"), {"input_tokens": 50_100, "output_tokens": 1}),
        (Break(after=5, how="eof"), {"input_tokens": 50_100, "output_tokens": 1}),
        (Break(after=7, how="reset"), {"input_tokens": 50_100, "output_tokens": 9}),
    ],
    ids=["reset-mid-text", "error-event", "cut-short", "reset-after-message-delta"],
)
async def test_a_stream_that_fails_keeps_the_usage_it_had_reported(
    provider: AnthropicProvider,
    fake_models: FakeModelServer,
    broken: Break,
    usage: dict[str, int],
) -> None:
    # message_start reports the input tokens (the whole prompt, cache included), and
    # message_delta the output so far: billed, so the failure must carry them for cost
    # accounting and max_cost_usd budgets.
    fake_models.anthropic.script(
        Completion(
            text="abcdefgh",
            input_tokens=50_100,
            cache_read_tokens=50_000,
            output_tokens=9,
            broken=broken,
        )
    )

    with pytest.raises(ModelCallFailed) as caught:
        await provider.complete(request(), on_delta=lambda _: None)

    assert caught.value.details["usage"] == usage
    reported = f"{usage['input_tokens']} input and {usage['output_tokens']} output tokens"
    assert reported in str(caught.value)
