from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import pytest

from toren.providers.anthropic import AnthropicProvider
from toren.providers.base import RetryPolicy, ToolSpec
from toren.providers.openai import OpenAIProvider
from toren.providers.openai_responses import OpenAIResponsesProvider

from .fakes import FAKE_KEY, FakeEndpoint, FakeModelServer, serve_fake_models


class SleepRecorder:
    """Stands in for ``asyncio.sleep`` between retries: records, never waits."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def no_jitter() -> float:
    """Stands in for ``random.random`` as the retry jitter's draw: every wait is the
    policy's full backoff, so tests can assert exact delays."""
    return 0.0


class Draws:
    """Stands in for ``random.random``: returns the given draws in order."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def __call__(self) -> float:
        return self.values.pop(0)


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeModelServer]:
    with serve_fake_models() as fake:
        yield fake


@pytest.fixture
def fake_models(fake_server: FakeModelServer) -> Iterator[FakeModelServer]:
    fake_server.reset()
    yield fake_server
    fake_server.reset()


@pytest.fixture
def sleeps() -> SleepRecorder:
    return SleepRecorder()


Provider: TypeAlias = OpenAIProvider | OpenAIResponsesProvider | AnthropicProvider


def make_provider(
    name: str, fake: FakeModelServer, sleeps: SleepRecorder, **config: Any
) -> Provider:
    config.setdefault("api_key", FAKE_KEY)
    config.setdefault("timeout", 5.0)
    config.setdefault("retry", RetryPolicy())
    config.setdefault("rand", no_jitter)
    if name == "openai":
        return OpenAIProvider(base_url=fake.openai_url, sleep=sleeps, **config)
    if name == "openai-responses":
        return OpenAIResponsesProvider(base_url=fake.openai_url, sleep=sleeps, **config)
    return AnthropicProvider(base_url=fake.anthropic_url, sleep=sleeps, **config)


@dataclass
class Vendor:
    """A provider wired to its fake endpoint, for tests that hold for every vendor."""

    name: str
    provider: Provider
    endpoint: FakeEndpoint
    sleeps: SleepRecorder


ENDPOINTS = {"openai": "openai", "openai-responses": "responses", "anthropic": "anthropic"}


@pytest.fixture(params=["openai", "openai-responses", "anthropic"])
async def vendor(
    request: pytest.FixtureRequest, fake_models: FakeModelServer, sleeps: SleepRecorder
) -> AsyncIterator[Vendor]:
    name: str = request.param
    provider = make_provider(name, fake_models, sleeps)
    endpoint: FakeEndpoint = getattr(fake_models, ENDPOINTS[name])
    yield Vendor(name, provider, endpoint, sleeps)
    await provider.aclose()


# -- the OpenAI-wire providers' tests (test_openai.py, test_openai_responses.py) ---------

LOOKUP = ToolSpec(
    name="lookup_order",
    description="Find an order.",
    parameters={"type": "object", "properties": {"order_id": {"type": "string"}}},
)


def conversation(assistant_text: str) -> tuple[dict[str, Any], ...]:
    """A conversation through one tool call: system, user, the assistant's call (with
    ``assistant_text``), the tool's result."""
    return (
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Where is A-17?"},
        {
            "role": "assistant",
            "content": assistant_text,
            "tool_calls": [{"id": "c1", "name": "lookup_order", "arguments": {"order_id": "A-17"}}],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "name": "lookup_order",
            "content": {"status": "sent"},
        },
    )


P = TypeVar("P", OpenAIProvider, OpenAIResponsesProvider)


async def on_openai_wire(
    cls: type[P], fake: FakeModelServer, sleeps: SleepRecorder
) -> AsyncIterator[P]:
    """The body of each file's ``provider`` fixture: ``cls`` on the fake's OpenAI URL,
    its retries' sleeps recorded, no jitter; closed after the test."""
    provider = cls(api_key=FAKE_KEY, base_url=fake.openai_url, sleep=sleeps, rand=no_jitter)
    yield provider
    await provider.aclose()
